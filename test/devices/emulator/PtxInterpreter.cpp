// The PTX interpreter (PtxInterpreter.h). One switch over the dense opcode
// enum per warp step; inside each case a switch on the instruction's type
// picks a template instance whose loop over the warp's executing lanes does
// the work on flat arrays of 64-bit slots (slot s of lane l is
// regs[s * 32 + l], so a lane loop walks contiguous memory).
//
// This file is compiled with -frounding-math: directed rounding (.rz, .rm,
// .rp) sets the host's rounding mode around an instruction's lane loop.
#include "test/devices/emulator/PtxInterpreter.h"

#include <algorithm>
#include <bit>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>

namespace kiln::emulator {
namespace {

constexpr uint32_t kWarpSize = 32;
constexpr uint32_t kFullMask = 0xffffffffu;
constexpr uint32_t kNoPc = 0xffffffffu;

struct FaultException {
  int code;
  std::string message;
};

constexpr int kIllegalAddress = 700;
constexpr int kMisalignedAddress = 716;
constexpr int kLaunchFailed = 719;

template <class T>
struct Tag {
  using type = T;
};

/// Calls `f(Tag<T>{})` with the C++ type of integer PTX type `t`.
template <class F>
inline void withInt(PtxType t, F&& f) {
  switch (t) {
    case PtxType::S8: return f(Tag<int8_t>{});
    case PtxType::B8:
    case PtxType::U8: return f(Tag<uint8_t>{});
    case PtxType::S16: return f(Tag<int16_t>{});
    case PtxType::B16:
    case PtxType::U16: return f(Tag<uint16_t>{});
    case PtxType::S32: return f(Tag<int32_t>{});
    case PtxType::B32:
    case PtxType::U32: return f(Tag<uint32_t>{});
    case PtxType::S64: return f(Tag<int64_t>{});
    case PtxType::B64:
    case PtxType::U64: return f(Tag<uint64_t>{});
    default: throw FaultException{kLaunchFailed, std::string("internal error: integer type .") + typeName(t)};
  }
}

template <class F>
inline void withFloat(PtxType t, F&& f) {
  if (t == PtxType::F32) return f(Tag<float>{});
  if (t == PtxType::F64) return f(Tag<double>{});
  throw FaultException{kLaunchFailed, std::string("internal error: float type .") + typeName(t)};
}

/// Integers and floats of `t` (f16/bf16 are not computed on).
template <class F>
inline void withNumber(PtxType t, F&& f) {
  if (t == PtxType::F32 || t == PtxType::F64) return withFloat(t, f);
  return withInt(t, f);
}

/// The unsigned integer type of a memory access of `t`'s size, signed for
/// the signed types (loads sign-extend them).
template <class F>
inline void withMemory(PtxType t, F&& f) {
  switch (t) {
    case PtxType::S8: return f(Tag<int8_t>{});
    case PtxType::S16: return f(Tag<int16_t>{});
    case PtxType::S32: return f(Tag<int32_t>{});
    default: break;
  }
  switch (typeBytes(t)) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    default: return f(Tag<uint64_t>{});
  }
}

template <class T>
inline T get(uint64_t v) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(static_cast<uint32_t>(v));
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<double>(v);
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
inline uint64_t put(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<uint32_t>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<uint64_t>(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? 1 : 0;
  } else {
    return static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(v));
  }
}

/// Runs `f(lane)` for each lane set in `mask`.
template <class F>
[[gnu::always_inline]] inline void lanes(uint32_t mask, F&& f) {
  if (mask == kFullMask) {
    for (uint32_t l = 0; l < kWarpSize; ++l) f(l);
  } else {
    for (uint32_t m = mask; m; m &= m - 1) f(static_cast<uint32_t>(std::countr_zero(m)));
  }
}

template <class U>
inline U wrapMul(U a, U b) {
  if constexpr (sizeof(U) < 4) {
    return static_cast<U>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
  } else {
    return static_cast<U>(a * b);
  }
}

template <class T>
struct Wider;
// clang-format off
template <> struct Wider<int8_t> { using type = int16_t; };
template <> struct Wider<uint8_t> { using type = uint16_t; };
template <> struct Wider<int16_t> { using type = int32_t; };
template <> struct Wider<uint16_t> { using type = uint32_t; };
template <> struct Wider<int32_t> { using type = int64_t; };
template <> struct Wider<uint32_t> { using type = uint64_t; };
template <> struct Wider<int64_t> { using type = __int128; };
template <> struct Wider<uint64_t> { using type = unsigned __int128; };
// clang-format on

/// The high half of the full product a * b.
template <class T>
inline T mulHigh(T a, T b) {
  using W = typename Wider<T>::type;
  return static_cast<T>((static_cast<W>(a) * static_cast<W>(b)) >> (8 * sizeof(T)));
}

// ---- floats

inline float flush(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return (b & 0x7f800000u) == 0 ? std::bit_cast<float>(b & 0x80000000u) : x;
}
inline double flush(double x) { return x; }  // .ftz applies to f32 only

template <class T>
inline T saturate(T x) {
  if (std::isnan(x)) return T(0);
  return x < T(0) ? T(0) : (x > T(1) ? T(1) : x);
}

template <class T>
inline T canonicalNan() {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<float>(0x7fffffffu);
  } else {
    return std::bit_cast<double>(0x7fffffffffffffffull);
  }
}

/// Sets the host rounding mode for an instruction's lane loop.
class RoundingScope {
 public:
  explicit RoundingScope(Rounding r) {
    int mode = -1;
    if (r == Rounding::Rz) mode = FE_TOWARDZERO;
    if (r == Rounding::Rm) mode = FE_DOWNWARD;
    if (r == Rounding::Rp) mode = FE_UPWARD;
    if (mode >= 0) {
      saved_ = std::fegetround();
      std::fesetround(mode);
    }
  }
  ~RoundingScope() {
    if (saved_ >= 0) std::fesetround(saved_);
  }
  RoundingScope(const RoundingScope&) = delete;
  RoundingScope& operator=(const RoundingScope&) = delete;

 private:
  int saved_ = -1;
};

/// min/max as PTX defines them: a NaN operand yields the other (both NaN:
/// the canonical NaN), or NaN with .NaN; -0 is less than +0.
template <class T, bool IsMin>
inline T floatMinMax(T a, T b, bool nanMode) {
  const bool an = std::isnan(a), bn = std::isnan(b);
  if (an || bn) {
    if (nanMode || (an && bn)) return canonicalNan<T>();
    return an ? b : a;
  }
  if (a == b) return (std::signbit(a) == IsMin) ? a : b;
  return IsMin ? (a < b ? a : b) : (a > b ? a : b);
}

/// `v` rounded to `bits` significant bits with the exponent of its least
/// significant bit at least `minExponent` (subnormals), by `r`.
double roundSignificand(double v, int bits, int minExponent, Rounding r) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const int lsb = std::max(e - bits, minExponent);
  const double scaled = std::ldexp(v, -lsb);
  double q;
  switch (r) {
    case Rounding::Rz: q = std::trunc(scaled); break;
    case Rounding::Rm: q = std::floor(scaled); break;
    case Rounding::Rp: q = std::ceil(scaled); break;
    default: q = std::nearbyint(scaled); break;
  }
  return std::ldexp(q, lsb);
}

/// f32 or f64 value `v` to f16 bits, rounded by `r`.
uint16_t toHalf(double v, Rounding r) {
  if (std::isnan(v)) return 0x7fff;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(roundSignificand(v, 11, -24, r));
  if (std::isinf(v) || a > 65504.0) {
    const bool toInfinity = r == Rounding::Rn || r == Rounding::Default || std::isinf(v) ||
                            (r == Rounding::Rm && sign) || (r == Rounding::Rp && !sign);
    return static_cast<uint16_t>(sign | (toInfinity ? 0x7c00 : 0x7bff));
  }
  if (a == 0) return sign;
  if (a < 0x1p-14) return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(a, 24)));
  int e;
  std::frexp(a, &e);
  const int exponent = e - 1;
  const uint32_t mantissa = static_cast<uint32_t>(std::ldexp(a, -exponent) * 1024.0) - 1024u;
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | mantissa);
}

double fromHalf(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    v = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  }
  return (h & 0x8000) ? -v : v;
}

uint16_t toBfloat(double v, Rounding r) {
  if (std::isnan(v)) return 0x7fff;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(roundSignificand(v, 8, -133, r));
  const double maxFinite = std::ldexp(255.0, 127 - 7);
  if (std::isinf(v) || a > maxFinite) {
    const bool toInfinity = r == Rounding::Rn || r == Rounding::Default || std::isinf(v) ||
                            (r == Rounding::Rm && sign) || (r == Rounding::Rp && !sign);
    return static_cast<uint16_t>(sign | (toInfinity ? 0x7f80 : 0x7f7f));
  }
  const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(a));  // exact: a has 8 significant bits
  return static_cast<uint16_t>(sign | (bits >> 16));
}

double fromBfloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

template <class D>
D clampToInt(double v) {
  if (std::isnan(v)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<D>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<D>::max());
  if (v <= lo) return std::numeric_limits<D>::min();
  if (v >= hi) return std::numeric_limits<D>::max();
  return static_cast<D>(v);
}

template <class D>
D saturateInt(__int128 v) {
  if (v < static_cast<__int128>(std::numeric_limits<D>::min())) return std::numeric_limits<D>::min();
  if (v > static_cast<__int128>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(v);
}

/// The float value of `bits` as type `t` (f16/bf16/f32/f64), in double.
double readFloat(PtxType t, uint64_t bits, bool ftz) {
  switch (t) {
    case PtxType::F16: return fromHalf(static_cast<uint16_t>(bits));
    case PtxType::BF16: return fromBfloat(static_cast<uint16_t>(bits));
    case PtxType::F32: {
      const float f = get<float>(bits);
      return ftz ? flush(f) : f;
    }
    default: return get<double>(bits);
  }
}

double roundToIntegral(double v, Rounding r) {
  switch (r) {
    case Rounding::Rzi: return std::trunc(v);
    case Rounding::Rmi: return std::floor(v);
    case Rounding::Rpi: return std::ceil(v);
    default: return std::nearbyint(v);
  }
}

/// cvt of one value, for everything but integer-to-integer without .sat
/// (which has its own fast path). The caller has set the host rounding
/// mode for f32 and f64 destinations.
uint64_t convert(const Instruction& in, uint64_t bits) {
  const PtxType dst = in.type, src = in.srcType;
  const Rounding r = static_cast<Rounding>(in.mode);
  const bool ftz = in.flags & kFtz, sat = in.flags & kSat;
  if (!isFloat(src)) {
    __int128 value = 0;
    withInt(src, [&](auto tag) { value = static_cast<__int128>(get<typename decltype(tag)::type>(bits)); });
    if (!isFloat(dst)) {
      uint64_t out = 0;
      withInt(dst, [&](auto tag) {
        using D = typename decltype(tag)::type;
        out = put<D>(sat ? saturateInt<D>(value) : static_cast<D>(value));
      });
      return out;
    }
    const bool isSigned = isSignedInt(src);
    const int64_t s = static_cast<int64_t>(value);
    const uint64_t u = static_cast<uint64_t>(value);
    switch (dst) {
      case PtxType::F32: {
        float f = isSigned ? static_cast<float>(s) : static_cast<float>(u);
        if (sat) f = saturate(f);
        return put(f);
      }
      case PtxType::F64: {
        double d = isSigned ? static_cast<double>(s) : static_cast<double>(u);
        if (sat) d = saturate(d);
        return put(d);
      }
      default: {
        double d = isSigned ? static_cast<double>(s) : static_cast<double>(u);
        if (sat) d = saturate(d);
        return dst == PtxType::F16 ? toHalf(d, r) : toBfloat(d, r);
      }
    }
  }
  double v = readFloat(src, bits, ftz);
  if (!isFloat(dst)) {
    v = roundToIntegral(v, r);
    uint64_t out = 0;
    withInt(dst, [&](auto tag) {
      using D = typename decltype(tag)::type;
      out = put<D>(clampToInt<D>(v));
    });
    return out;
  }
  if (r >= Rounding::Rni) v = roundToIntegral(v, r);
  switch (dst) {
    case PtxType::F32: {
      float f = static_cast<float>(v);
      if (ftz) f = flush(f);
      if (sat) f = saturate(f);
      return put(f);
    }
    case PtxType::F64: return put(sat ? saturate(v) : v);
    case PtxType::F16: return toHalf(sat ? saturate(v) : v, r);
    default: return toBfloat(sat ? saturate(v) : v, r);
  }
}

// ---- the launch

struct Warp {
  uint64_t* regs = nullptr;
  uint8_t* local = nullptr;
  uint32_t* returnStack = nullptr;
  uint32_t pcs[kWarpSize] = {};
  uint8_t depth[kWarpSize] = {};
  uint32_t live = 0;  // lanes that are threads of the block
  uint32_t exited = 0;
  uint32_t waiting = 0;  // at a barrier
  uint32_t pc = 0;
  uint32_t active = 0;      // lanes at `pc`
  uint32_t nextPc = kNoPc;  // the smallest pc of the other runnable lanes
  uint32_t index = 0;       // within the block
};

/// Storage reused from launch to launch on a thread.
struct Scratch {
  std::vector<uint64_t> regs;
  std::vector<uint8_t> local;
  std::vector<uint32_t> returnStack;
  std::vector<uint8_t> shared;
};

class Launch {
 public:
  Launch(const LoadedKernel& loaded, const LaunchShape& shape, const uint8_t* params, DeviceMemory& memory)
      : k_(*loaded.kernel), loaded_(loaded), shape_(shape), params_(params), memory_(memory) {}

  void run(InterpreterStats& stats);

 private:
  void runBlock(uint32_t bx, uint32_t by, uint32_t bz);
  void startWarp(Warp& w, uint32_t index);
  void runWarp(Warp& w);
  bool reschedule(Warp& w);

  uint64_t* slot(Warp& w, uint32_t s) { return w.regs + static_cast<size_t>(s) * kWarpSize; }

  // Memory.
  [[gnu::always_inline]] uint8_t* global(uint64_t address, uint32_t size, const Warp& w, uint32_t lane,
                                         const Instruction& in) {
    const uint64_t offset = address - cacheBase_;
    if (offset < cacheBytes_ && size <= cacheBytes_ - offset) return cacheHost_ + offset;
    return globalSlow(address, size, w, lane, in);
  }
  uint8_t* globalSlow(uint64_t address, uint32_t size, const Warp& w, uint32_t lane, const Instruction& in);
  uint8_t* resolve(Space space, uint64_t address, uint32_t size, const Warp& w, uint32_t lane, const Instruction& in,
                   bool write);
  [[noreturn]] void fault(int code, const std::string& what, const Warp& w, uint32_t lane, const Instruction& in);

  template <class T>
  void load(Warp& w, const Instruction& in, uint32_t mask);
  template <class T>
  void store(Warp& w, const Instruction& in, uint32_t mask);
  template <class T>
  void loadParam(Warp& w, const Instruction& in, uint32_t mask);
  template <class T>
  void atomic(Warp& w, const Instruction& in, uint32_t mask);

  void executeSetp(Warp& w, const Instruction& in, uint32_t mask);
  void executeCvt(Warp& w, const Instruction& in, uint32_t mask);
  void executeFloat(Warp& w, const Instruction& in, uint32_t mask);
  void executeCollective(Warp& w, const Instruction& in, uint32_t mask);
  void executeBits(Warp& w, const Instruction& in, uint32_t mask);
  void executeMadCarry(Warp& w, const Instruction& in, uint32_t mask);

  const Kernel& k_;
  const LoadedKernel& loaded_;
  const LaunchShape& shape_;
  const uint8_t* params_;
  DeviceMemory& memory_;

  uint32_t blockThreads_ = 0;
  uint32_t warpsPerBlock_ = 0;
  uint32_t block_[3] = {0, 0, 0};
  uint8_t* shared_ = nullptr;
  uint32_t sharedBytes_ = 0;
  uint32_t localBytes_ = 0;
  std::vector<Warp> warps_;
  std::vector<uint32_t> warpOrder_;
  std::mt19937_64 rng_;  // adversarial block and warp order

  uint64_t cacheBase_ = 0, cacheBytes_ = 0;
  uint8_t* cacheHost_ = nullptr;

  uint64_t warpSteps_ = 0, laneSteps_ = 0;
};

thread_local Scratch scratch;

void Launch::fault(int code, const std::string& what, const Warp& w, uint32_t lane, const Instruction& in) {
  const size_t index = static_cast<size_t>(&in - k_.code.data());
  const uint32_t t = w.index * kWarpSize + lane;
  const uint32_t bx = shape_.block[0], by = shape_.block[1];
  std::string message = "kernel '" + k_.name + "': " + (index < k_.text.size() ? k_.text[index] : "?") + " (PTX line " +
                        std::to_string(in.line) + "), thread (" + std::to_string(t % bx) + "," +
                        std::to_string(t / bx % by) + "," + std::to_string(t / (bx * by)) + ") of block (" +
                        std::to_string(block_[0]) + "," + std::to_string(block_[1]) + "," + std::to_string(block_[2]) +
                        "): " + what;
  throw FaultException{code, message};
}

uint8_t* Launch::globalSlow(uint64_t address, uint32_t size, const Warp& w, uint32_t lane, const Instruction& in) {
  const Allocation* a = memory_.find(address, size);
  if (!a) {
    fault(kIllegalAddress,
          "address " + hexAddress(address) + " (" + std::to_string(size) + " bytes) is outside every allocation; " +
              memory_.nearest(address),
          w, lane, in);
  }
  cacheBase_ = a->base;
  cacheBytes_ = a->bytes;
  cacheHost_ = a->host;
  return a->host + (address - a->base);
}

uint8_t* Launch::resolve(Space space, uint64_t address, uint32_t size, const Warp& w, uint32_t lane,
                         const Instruction& in, bool write) {
  if (address & (size - 1)) {
    fault(kMisalignedAddress,
          "address " + hexAddress(address) + " is not aligned to " + std::to_string(size) + " bytes", w, lane, in);
  }
  switch (space) {
    case Space::Global:
    case Space::Const: return global(address, size, w, lane, in);
    case Space::Shared:
      if (address < sharedBytes_ && size <= sharedBytes_ - address) return shared_ + address;
      fault(kIllegalAddress,
            "shared address " + hexAddress(address) + " (" + std::to_string(size) + " bytes) is outside the block's " +
                std::to_string(sharedBytes_) + " bytes of shared memory",
            w, lane, in);
    case Space::Local:
      if (address < localBytes_ && size <= localBytes_ - address)
        return w.local + static_cast<size_t>(lane) * localBytes_ + address;
      fault(kIllegalAddress,
            "local address " + hexAddress(address) + " (" + std::to_string(size) + " bytes) is outside the thread's " +
                std::to_string(localBytes_) + " bytes of local memory",
            w, lane, in);
    case Space::Param:
      if (!write && address < k_.paramBytes && size <= k_.paramBytes - address)
        return const_cast<uint8_t*>(params_) + address;
      fault(kIllegalAddress,
            std::string(write ? "a store to" : "") + "parameter address " + hexAddress(address) + " (" +
                std::to_string(size) + " bytes) is outside the kernel's " + std::to_string(k_.paramBytes) +
                " bytes of parameters",
            w, lane, in);
    case Space::Generic:
      if (address - kSharedWindow < kWindowSize)
        return resolve(Space::Shared, address - kSharedWindow, size, w, lane, in, write);
      if (address - kLocalWindow < kWindowSize)
        return resolve(Space::Local, address - kLocalWindow, size, w, lane, in, write);
      if (address - kParamWindow < kWindowSize)
        return resolve(Space::Param, address - kParamWindow, size, w, lane, in, write);
      return global(address, size, w, lane, in);
  }
  return nullptr;
}

template <class T>
void Launch::load(Warp& w, const Instruction& in, uint32_t mask) {
  const uint64_t* a = slot(w, in.addr);
  const uint32_t n = in.vector;
  const uint32_t size = static_cast<uint32_t>(sizeof(T)) * n;
  uint64_t* d[4] = {};
  for (uint32_t i = 0; i < n; ++i) d[i] = slot(w, in.dst[i]);
  const Space space = in.space;
  const int64_t displacement = in.offset;
  auto extend = [](T v) -> uint64_t {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<uint64_t>(static_cast<int64_t>(v));
    } else {
      return static_cast<uint64_t>(v);
    }
  };
  if (space == Space::Global && n == 1) {
    lanes(mask, [&](uint32_t l) {
      const uint64_t address = a[l] + static_cast<uint64_t>(displacement);
      if (address & (sizeof(T) - 1)) resolve(space, address, size, w, l, in, false);
      T v;
      std::memcpy(&v, global(address, size, w, l, in), sizeof(T));
      d[0][l] = extend(v);
    });
    return;
  }
  lanes(mask, [&](uint32_t l) {
    const uint8_t* p = resolve(space, a[l] + static_cast<uint64_t>(displacement), size, w, l, in, false);
    for (uint32_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      d[i][l] = extend(v);
    }
  });
}

template <class T>
void Launch::store(Warp& w, const Instruction& in, uint32_t mask) {
  const uint64_t* a = slot(w, in.addr);
  const uint32_t n = in.vector;
  const uint32_t size = static_cast<uint32_t>(sizeof(T)) * n;
  const uint64_t* s[4] = {};
  for (uint32_t i = 0; i < n; ++i) s[i] = slot(w, in.src[i]);
  const Space space = in.space;
  const int64_t displacement = in.offset;
  if (space == Space::Global && n == 1) {
    lanes(mask, [&](uint32_t l) {
      const uint64_t address = a[l] + static_cast<uint64_t>(displacement);
      if (address & (sizeof(T) - 1)) resolve(space, address, size, w, l, in, true);
      const T v = static_cast<T>(s[0][l]);
      std::memcpy(global(address, size, w, l, in), &v, sizeof(T));
    });
    return;
  }
  lanes(mask, [&](uint32_t l) {
    uint8_t* p = resolve(space, a[l] + static_cast<uint64_t>(displacement), size, w, l, in, true);
    for (uint32_t i = 0; i < n; ++i) {
      const T v = static_cast<T>(s[i][l]);
      std::memcpy(p + i * sizeof(T), &v, sizeof(T));
    }
  });
}

template <class T>
void Launch::loadParam(Warp& w, const Instruction& in, uint32_t mask) {
  const uint32_t n = in.vector;
  const uint64_t offset = static_cast<uint64_t>(in.offset);
  if (offset + sizeof(T) * n > k_.paramBytes)
    fault(kIllegalAddress, "parameter offset " + std::to_string(offset) + " is past the parameters", w, 0, in);
  for (uint32_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, params_ + offset + i * sizeof(T), sizeof(T));
    uint64_t bits;
    if constexpr (std::is_signed_v<T>) {
      bits = static_cast<uint64_t>(static_cast<int64_t>(v));
    } else {
      bits = static_cast<uint64_t>(v);
    }
    uint64_t* d = slot(w, in.dst[i]);
    lanes(mask, [&](uint32_t l) { d[l] = bits; });
  }
}

template <class T>
void Launch::atomic(Warp& w, const Instruction& in, uint32_t mask) {
  const uint64_t* a = slot(w, in.addr);
  const uint64_t* b = slot(w, in.src[0]);
  const uint64_t* c = in.src[1] != kNoSlot ? slot(w, in.src[1]) : nullptr;
  uint64_t* d = in.dst[0] != kNoSlot ? slot(w, in.dst[0]) : nullptr;
  const AtomOp op = static_cast<AtomOp>(in.mode);
  lanes(mask, [&](uint32_t l) {
    uint8_t* p = resolve(in.space, a[l] + static_cast<uint64_t>(in.offset), sizeof(T), w, l, in, true);
    T old;
    std::memcpy(&old, p, sizeof(T));
    const T x = get<T>(b[l]);
    T result = old;
    if constexpr (std::is_floating_point_v<T>) {
      if (op == AtomOp::Add) result = old + x;
      if (op == AtomOp::Exch) result = x;
    } else {
      using U = std::make_unsigned_t<T>;
      switch (op) {
        case AtomOp::Add: result = static_cast<T>(static_cast<U>(old) + static_cast<U>(x)); break;
        case AtomOp::Min: result = std::min(old, x); break;
        case AtomOp::Max: result = std::max(old, x); break;
        case AtomOp::Exch: result = x; break;
        case AtomOp::Cas: result = old == x ? get<T>(c[l]) : old; break;
        case AtomOp::Inc: result = static_cast<U>(old) >= static_cast<U>(x) ? 0 : static_cast<T>(old + 1); break;
        case AtomOp::Dec:
          result = (old == 0 || static_cast<U>(old) > static_cast<U>(x)) ? x : static_cast<T>(old - 1);
          break;
        case AtomOp::And: result = old & x; break;
        case AtomOp::Or: result = old | x; break;
        case AtomOp::Xor: result = old ^ x; break;
      }
    }
    std::memcpy(p, &result, sizeof(T));
    if (d) d[l] = put<T>(old);
  });
}

template <class T>
bool compare(Compare c, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool unordered = std::isnan(a) || std::isnan(b);
    switch (c) {
      case Compare::Eq: return !unordered && a == b;
      case Compare::Ne: return !unordered && a != b;
      case Compare::Lt: return !unordered && a < b;
      case Compare::Le: return !unordered && a <= b;
      case Compare::Gt: return !unordered && a > b;
      case Compare::Ge: return !unordered && a >= b;
      case Compare::Equ: return unordered || a == b;
      case Compare::Neu: return unordered || a != b;
      case Compare::Ltu: return unordered || a < b;
      case Compare::Leu: return unordered || a <= b;
      case Compare::Gtu: return unordered || a > b;
      case Compare::Geu: return unordered || a >= b;
      case Compare::Num: return !unordered;
      case Compare::Nan: return unordered;
      default: return false;
    }
  } else {
    using U = std::make_unsigned_t<T>;
    switch (c) {
      case Compare::Eq: return a == b;
      case Compare::Ne: return a != b;
      case Compare::Lt: return a < b;
      case Compare::Le: return a <= b;
      case Compare::Gt: return a > b;
      case Compare::Ge: return a >= b;
      case Compare::Lo: return static_cast<U>(a) < static_cast<U>(b);
      case Compare::Ls: return static_cast<U>(a) <= static_cast<U>(b);
      case Compare::Hi: return static_cast<U>(a) > static_cast<U>(b);
      case Compare::Hs: return static_cast<U>(a) >= static_cast<U>(b);
      default: return false;
    }
  }
}

void Launch::executeSetp(Warp& w, const Instruction& in, uint32_t mask) {
  uint64_t* d = slot(w, in.dst[0]);
  uint64_t* d2 = (in.flags & kDoubleDst) ? slot(w, in.dst[1]) : nullptr;
  const uint64_t* a = slot(w, in.src[0]);
  const uint64_t* b = slot(w, in.src[1]);
  const uint64_t* c = in.src[2] != kNoSlot ? slot(w, in.src[2]) : nullptr;
  const BoolOp combine = static_cast<BoolOp>(in.mode2);
  const uint64_t negate = (in.flags & kNegSrc) ? 1 : 0;
  const Compare cmp = static_cast<Compare>(in.mode);
  const bool ftz = in.flags & kFtz;
  const bool isSet = in.op == Opcode::Set;
  const PtxType setType = in.type;
  withNumber(in.srcType, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto body = [&](uint32_t l, auto cmpConstant) {
      T x = get<T>(a[l]), y = get<T>(b[l]);
      if constexpr (std::is_same_v<T, float>) {
        if (ftz) {
          x = flush(x);
          y = flush(y);
        }
      }
      bool r = compare<T>(decltype(cmpConstant)::value, x, y);
      if (c) {
        const bool q = ((c[l] & 1) ^ negate) != 0;
        switch (combine) {
          case BoolOp::And: r = r && q; break;
          case BoolOp::Or: r = r || q; break;
          case BoolOp::Xor: r = r != q; break;
          case BoolOp::None: break;
        }
      }
      if (isSet) {
        d[l] = setType == PtxType::F32 ? (r ? 0x3f800000u : 0u) : (r ? 0xffffffffu : 0u);
      } else {
        d[l] = r;
        if (d2) d2[l] = !r;
      }
    };
    // One loop per comparison, so the comparison is not switched per lane.
#define KILN_SETP_CASE(name)                                                                     \
  case Compare::name:                                                                            \
    lanes(mask, [&](uint32_t l) { body(l, std::integral_constant<Compare, Compare::name>{}); }); \
    break;
    switch (cmp) {
      KILN_SETP_CASE(Eq)
      KILN_SETP_CASE(Ne) KILN_SETP_CASE(Lt) KILN_SETP_CASE(Le) KILN_SETP_CASE(Gt) KILN_SETP_CASE(Ge) KILN_SETP_CASE(Lo)
          KILN_SETP_CASE(Ls) KILN_SETP_CASE(Hi) KILN_SETP_CASE(Hs) KILN_SETP_CASE(Equ) KILN_SETP_CASE(Neu)
              KILN_SETP_CASE(Ltu) KILN_SETP_CASE(Leu) KILN_SETP_CASE(Gtu) KILN_SETP_CASE(Geu) KILN_SETP_CASE(Num)
                  KILN_SETP_CASE(Nan)
    }
#undef KILN_SETP_CASE
  });
}

void Launch::executeCvt(Warp& w, const Instruction& in, uint32_t mask) {
  uint64_t* d = slot(w, in.dst[0]);
  const uint64_t* a = slot(w, in.src[0]);
  if (!isFloat(in.type) && !isFloat(in.srcType) && !(in.flags & kSat)) {
    withInt(in.srcType, [&](auto srcTag) {
      using S = typename decltype(srcTag)::type;
      withInt(in.type, [&](auto dstTag) {
        using D = typename decltype(dstTag)::type;
        lanes(mask, [&](uint32_t l) { d[l] = put<D>(static_cast<D>(get<S>(a[l]))); });
      });
    });
    return;
  }
  const bool hostRounding = in.type == PtxType::F32 || in.type == PtxType::F64;
  RoundingScope scope(hostRounding ? static_cast<Rounding>(in.mode) : Rounding::Default);
  lanes(mask, [&](uint32_t l) { d[l] = convert(in, a[l]); });
}

void Launch::executeFloat(Warp& w, const Instruction& in, uint32_t mask) {
  uint64_t* d = slot(w, in.dst[0]);
  const uint64_t* a = slot(w, in.src[0]);
  const uint64_t* b = in.src[1] != kNoSlot ? slot(w, in.src[1]) : nullptr;
  const uint64_t* c = in.src[2] != kNoSlot ? slot(w, in.src[2]) : nullptr;
  const bool ftz = in.flags & kFtz, sat = in.flags & kSat;
  RoundingScope scope(static_cast<Rounding>(in.mode));
  withFloat(in.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto in1 = [&](uint32_t l) { return ftz ? flush(get<T>(a[l])) : get<T>(a[l]); };
    auto in2 = [&](uint32_t l) { return ftz ? flush(get<T>(b[l])) : get<T>(b[l]); };
    auto in3 = [&](uint32_t l) { return ftz ? flush(get<T>(c[l])) : get<T>(c[l]); };
    auto out = [&](uint32_t l, T v) {
      if (ftz) v = flush(v);
      if (sat) v = saturate(v);
      d[l] = put<T>(v);
    };
    switch (in.op) {
      case Opcode::FAdd: lanes(mask, [&](uint32_t l) { out(l, in1(l) + in2(l)); }); break;
      case Opcode::FSub: lanes(mask, [&](uint32_t l) { out(l, in1(l) - in2(l)); }); break;
      case Opcode::FMul: lanes(mask, [&](uint32_t l) { out(l, in1(l) * in2(l)); }); break;
      case Opcode::Fma: lanes(mask, [&](uint32_t l) { out(l, std::fma(in1(l), in2(l), in3(l))); }); break;
      case Opcode::FDiv: lanes(mask, [&](uint32_t l) { out(l, in1(l) / in2(l)); }); break;
      case Opcode::FNeg: lanes(mask, [&](uint32_t l) { d[l] = put<T>(-in1(l)); }); break;
      case Opcode::FAbs: lanes(mask, [&](uint32_t l) { d[l] = put<T>(std::fabs(in1(l))); }); break;
      case Opcode::FMin: {
        const bool nanMode = in.flags & kNanMode;
        lanes(mask, [&](uint32_t l) { out(l, floatMinMax<T, true>(in1(l), in2(l), nanMode)); });
        break;
      }
      case Opcode::FMax: {
        const bool nanMode = in.flags & kNanMode;
        lanes(mask, [&](uint32_t l) { out(l, floatMinMax<T, false>(in1(l), in2(l), nanMode)); });
        break;
      }
      case Opcode::Rcp: lanes(mask, [&](uint32_t l) { out(l, T(1) / in1(l)); }); break;
      case Opcode::Sqrt: lanes(mask, [&](uint32_t l) { out(l, std::sqrt(in1(l))); }); break;
      case Opcode::Rsqrt: lanes(mask, [&](uint32_t l) { out(l, T(1) / std::sqrt(in1(l))); }); break;
      case Opcode::Ex2: lanes(mask, [&](uint32_t l) { out(l, std::exp2(in1(l))); }); break;
      case Opcode::Lg2: lanes(mask, [&](uint32_t l) { out(l, std::log2(in1(l))); }); break;
      case Opcode::Sin: lanes(mask, [&](uint32_t l) { out(l, std::sin(in1(l))); }); break;
      case Opcode::Cos: lanes(mask, [&](uint32_t l) { out(l, std::cos(in1(l))); }); break;
      case Opcode::Tanh: lanes(mask, [&](uint32_t l) { out(l, std::tanh(in1(l))); }); break;
      case Opcode::Copysign:
        // copysign d, a, b: b's magnitude with a's sign.
        lanes(mask, [&](uint32_t l) { d[l] = put<T>(std::copysign(get<T>(b[l]), get<T>(a[l]))); });
        break;
      case Opcode::Testp: {
        const TestpMode mode = static_cast<TestpMode>(in.mode);
        lanes(mask, [&](uint32_t l) {
          const T x = get<T>(a[l]);
          bool r = false;
          switch (mode) {
            case TestpMode::Finite: r = std::isfinite(x); break;
            case TestpMode::Infinite: r = std::isinf(x); break;
            case TestpMode::Number: r = !std::isnan(x); break;
            case TestpMode::NotANumber: r = std::isnan(x); break;
            case TestpMode::Normal: r = std::isnormal(x); break;
            case TestpMode::Subnormal: r = std::fpclassify(x) == FP_SUBNORMAL; break;
          }
          d[l] = r;
        });
        break;
      }
      default: break;
    }
  });
}

void Launch::executeBits(Warp& w, const Instruction& in, uint32_t mask) {
  uint64_t* d = slot(w, in.dst[0]);
  const uint64_t* a = slot(w, in.src[0]);
  const uint64_t* b = in.src[1] != kNoSlot ? slot(w, in.src[1]) : nullptr;
  const uint64_t* c = in.src[2] != kNoSlot ? slot(w, in.src[2]) : nullptr;
  const bool wide = typeBytes(in.type) == 8;
  switch (in.op) {
    case Opcode::Bfe:
      // As the PTX ISA defines it: the len bits from pos, then the field's
      // last bit (bits past the source's top: its sign bit) for a signed
      // type, zeros for an unsigned one.
      withInt(in.type, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using U = std::make_unsigned_t<T>;
        constexpr uint32_t bits = 8 * sizeof(T);
        lanes(mask, [&](uint32_t l) {
          const uint32_t pos = static_cast<uint32_t>(b[l]) & 0xff, len = static_cast<uint32_t>(c[l]) & 0xff;
          const U x = get<U>(a[l]);
          const uint32_t taken = pos < bits ? std::min(len, bits - pos) : 0;
          const U field = taken == 0      ? U(0)
                          : taken >= bits ? static_cast<U>(x >> pos)
                                          : static_cast<U>((x >> pos) & ((U(1) << taken) - 1));
          const bool sign = std::is_signed_v<T> && len != 0 && ((x >> std::min(pos + len - 1, bits - 1)) & 1);
          const U filled = taken >= bits ? U(0) : static_cast<U>(~U(0) << taken);
          d[l] = put<U>(sign ? static_cast<U>(field | filled) : field);
        });
      });
      break;
    case Opcode::Bfi: {
      const uint64_t* e = slot(w, in.src[3]);
      const uint32_t bits = wide ? 64 : 32;
      lanes(mask, [&](uint32_t l) {
        const uint32_t pos = static_cast<uint32_t>(c[l]) & 0xff, len = static_cast<uint32_t>(e[l]) & 0xff;
        uint64_t r = b[l];
        for (uint32_t i = 0; i < len && pos + i < bits; ++i) {
          const uint64_t bit = (a[l] >> i) & 1;
          r = (r & ~(1ull << (pos + i))) | (bit << (pos + i));
        }
        d[l] = wide ? r : static_cast<uint32_t>(r);
      });
      break;
    }
    case Opcode::Prmt: {
      const int mode = in.mode;  // 0: default, 1 f4e, 2 b4e, 3 rc8, 4 ecl, 5 ecr, 6 rc16
      lanes(mask, [&](uint32_t l) {
        const uint64_t bytes = (static_cast<uint64_t>(static_cast<uint32_t>(b[l])) << 32) | static_cast<uint32_t>(a[l]);
        const uint32_t s = static_cast<uint32_t>(c[l]);
        uint32_t selectors[4];
        if (mode == 0) {
          for (int i = 0; i < 4; ++i) selectors[i] = (s >> (4 * i)) & 0xf;
        } else {
          const uint32_t sel = s & 3;
          static const uint32_t kTable[6][4][4] = {
              {{0, 1, 2, 3}, {1, 2, 3, 4}, {2, 3, 4, 5}, {3, 4, 5, 6}},  // f4e
              {{0, 7, 6, 5}, {1, 0, 7, 6}, {2, 1, 0, 7}, {3, 2, 1, 0}},  // b4e
              {{0, 0, 0, 0}, {1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}},  // rc8
              {{0, 1, 2, 3}, {1, 1, 2, 3}, {2, 2, 2, 3}, {3, 3, 3, 3}},  // ecl
              {{0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}, {0, 1, 2, 3}},  // ecr
              {{0, 1, 0, 1}, {2, 3, 2, 3}, {0, 1, 0, 1}, {2, 3, 2, 3}},  // rc16
          };
          for (int i = 0; i < 4; ++i) selectors[i] = kTable[mode - 1][sel][i];
        }
        uint32_t r = 0;
        for (int i = 0; i < 4; ++i) {
          const uint32_t sel = selectors[i];
          uint32_t byte = static_cast<uint32_t>((bytes >> (8 * (sel & 7))) & 0xff);
          if (mode == 0 && (sel & 8)) byte = (byte & 0x80) ? 0xff : 0;  // replicate the sign
          r |= byte << (8 * i);
        }
        d[l] = r;
      });
      break;
    }
    case Opcode::Shf: {
      const bool right = in.mode & 1, clamp = in.mode & 2;
      lanes(mask, [&](uint32_t l) {
        const uint64_t v = (static_cast<uint64_t>(static_cast<uint32_t>(b[l])) << 32) | static_cast<uint32_t>(a[l]);
        const uint32_t amount = static_cast<uint32_t>(c[l]);
        const uint32_t n = clamp ? std::min(amount, 32u) : amount & 31;
        d[l] = right ? static_cast<uint32_t>(v >> n) : static_cast<uint32_t>((v << n) >> 32);
      });
      break;
    }
    case Opcode::Dp4a:
    case Opcode::Dp2a: {
      const bool aSigned = in.mode & 1, bSigned = in.mode & 2, high = in.mode & 4;
      const bool four = in.op == Opcode::Dp4a;
      lanes(mask, [&](uint32_t l) {
        const uint32_t x = static_cast<uint32_t>(a[l]), y = static_cast<uint32_t>(b[l]);
        auto byteOf = [](uint32_t v, int i, bool sign) -> int64_t {
          const uint32_t byte = (v >> (8 * i)) & 0xff;
          return sign ? static_cast<int8_t>(byte) : static_cast<int64_t>(byte);
        };
        auto halfOf = [](uint32_t v, int i, bool sign) -> int64_t {
          const uint32_t h = (v >> (16 * i)) & 0xffff;
          return sign ? static_cast<int16_t>(h) : static_cast<int64_t>(h);
        };
        int64_t sum = static_cast<int64_t>(static_cast<uint32_t>(c[l]));
        if (aSigned || bSigned) sum = static_cast<int32_t>(c[l]);
        if (four) {
          for (int i = 0; i < 4; ++i) sum += byteOf(x, i, aSigned) * byteOf(y, i, bSigned);
        } else {
          for (int i = 0; i < 2; ++i) sum += halfOf(x, i, aSigned) * byteOf(y, (high ? 2 : 0) + i, bSigned);
        }
        d[l] = static_cast<uint32_t>(sum);
      });
      break;
    }
    case Opcode::Popc:
      lanes(mask, [&](uint32_t l) {
        d[l] = static_cast<uint64_t>(wide ? std::popcount(a[l]) : std::popcount(static_cast<uint32_t>(a[l])));
      });
      break;
    case Opcode::Clz:
      lanes(mask, [&](uint32_t l) {
        d[l] = static_cast<uint64_t>(wide ? std::countl_zero(a[l]) : std::countl_zero(static_cast<uint32_t>(a[l])));
      });
      break;
    case Opcode::Brev:
      lanes(mask, [&](uint32_t l) {
        uint64_t x = a[l], r = 0;
        const uint32_t bits = wide ? 64 : 32;
        for (uint32_t i = 0; i < bits; ++i) r |= ((x >> i) & 1) << (bits - 1 - i);
        d[l] = r;
      });
      break;
    case Opcode::Bfind: {
      const bool shiftAmount = in.mode != 0;
      const bool isSigned = isSignedInt(in.type);
      const uint32_t bits = wide ? 64 : 32;
      lanes(mask, [&](uint32_t l) {
        uint64_t x = wide ? a[l] : static_cast<uint32_t>(a[l]);
        if (isSigned && ((x >> (bits - 1)) & 1)) x = wide ? ~x : (~x & 0xffffffffu);
        if (x == 0) {
          d[l] = 0xffffffffu;
          return;
        }
        const uint32_t position = bits - 1 - static_cast<uint32_t>(std::countl_zero(x) - (64 - bits));
        d[l] = shiftAmount ? bits - 1 - position : position;
      });
      break;
    }
    default: break;
  }
}

/// mad{c}.lo/hi{.cc}: the low or high half of a*b, plus c and the carry
/// in, setting the carry out of that addition (extended-precision
/// arithmetic, as in f64 pow and trigonometric argument reduction).
void Launch::executeMadCarry(Warp& w, const Instruction& in, uint32_t mask) {
  const bool high = in.op == Opcode::MadHi;
  const bool carryIn = in.flags & kCarryIn, carryOut = in.flags & kCarryOut;
  withInt(in.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using U = std::make_unsigned_t<T>;
    uint64_t* d = slot(w, in.dst[0]);
    uint64_t* cc = slot(w, in.dst[1]);
    const uint64_t *a = slot(w, in.src[0]), *b = slot(w, in.src[1]), *c = slot(w, in.src[2]);
    lanes(mask, [&](uint32_t l) {
      const U product =
          high ? static_cast<U>(mulHigh<T>(get<T>(a[l]), get<T>(b[l]))) : wrapMul<U>(get<U>(a[l]), get<U>(b[l]));
      const U carry = carryIn ? static_cast<U>(cc[l] & 1) : 0;
      const U r = static_cast<U>(product + get<U>(c[l]) + carry);
      d[l] = put<U>(r);
      if (carryOut) cc[l] = r < product || (carry && r == product);
    });
  });
}

void Launch::executeCollective(Warp& w, const Instruction& in, uint32_t mask) {
  switch (in.op) {
    case Opcode::Shfl: {
      uint64_t* d = slot(w, in.dst[0]);
      uint64_t* p = (in.flags & kDoubleDst) ? slot(w, in.dst[1]) : nullptr;
      const uint64_t* a = slot(w, in.src[0]);
      const uint64_t* b = slot(w, in.src[1]);
      const uint64_t* c = slot(w, in.src[2]);
      uint32_t values[kWarpSize];
      for (uint32_t l = 0; l < kWarpSize; ++l) values[l] = static_cast<uint32_t>(a[l]);
      const ShuffleMode mode = static_cast<ShuffleMode>(in.mode);
      lanes(mask, [&](uint32_t l) {
        const uint32_t bval = static_cast<uint32_t>(b[l]) & 31, cval = static_cast<uint32_t>(c[l]);
        const uint32_t clamp = cval & 31, segmask = (cval >> 8) & 31;
        const int32_t maxLane = static_cast<int32_t>((l & segmask) | (clamp & ~segmask));
        const int32_t minLane = static_cast<int32_t>(l & segmask);
        int32_t j = 0;
        bool valid = false;
        switch (mode) {
          case ShuffleMode::Up:
            j = static_cast<int32_t>(l) - static_cast<int32_t>(bval);
            valid = j >= maxLane;
            break;
          case ShuffleMode::Down:
            j = static_cast<int32_t>(l + bval);
            valid = j <= maxLane;
            break;
          case ShuffleMode::Bfly:
            j = static_cast<int32_t>(l ^ bval);
            valid = j <= maxLane;
            break;
          case ShuffleMode::Idx:
            j = minLane | static_cast<int32_t>(bval & ~segmask);
            valid = j <= maxLane;
            break;
        }
        if (!valid) j = static_cast<int32_t>(l);
        d[l] = values[j];
        if (p) p[l] = valid;
      });
      break;
    }
    case Opcode::Vote: {
      uint64_t* d = slot(w, in.dst[0]);
      const uint64_t* a = slot(w, in.src[0]);
      const uint64_t negate = (in.flags & kNegSrc) ? 1 : 0;
      uint32_t ballot = 0;
      lanes(mask, [&](uint32_t l) { ballot |= static_cast<uint32_t>((a[l] & 1) ^ negate) << l; });
      uint64_t result = 0;
      switch (static_cast<VoteMode>(in.mode)) {
        case VoteMode::All: result = ballot == mask; break;
        case VoteMode::Any: result = ballot != 0; break;
        case VoteMode::Uni: result = ballot == 0 || ballot == mask; break;
        case VoteMode::Ballot: result = ballot; break;
      }
      lanes(mask, [&](uint32_t l) { d[l] = result; });
      break;
    }
    case Opcode::Activemask: {
      uint64_t* d = slot(w, in.dst[0]);
      lanes(mask, [&](uint32_t l) { d[l] = mask; });
      break;
    }
    case Opcode::Redux: {
      uint64_t* d = slot(w, in.dst[0]);
      const uint64_t* a = slot(w, in.src[0]);
      const AtomOp op = static_cast<AtomOp>(in.mode);
      const bool isSigned = in.type == PtxType::S32;
      int64_t acc = 0;
      bool first = true;
      lanes(mask, [&](uint32_t l) {
        const int64_t x = isSigned ? static_cast<int32_t>(a[l]) : static_cast<uint32_t>(a[l]);
        if (first) {
          acc = x;
          first = false;
          return;
        }
        switch (op) {
          case AtomOp::Add: acc += x; break;
          case AtomOp::Min: acc = std::min(acc, x); break;
          case AtomOp::Max: acc = std::max(acc, x); break;
          case AtomOp::And: acc &= x; break;
          case AtomOp::Or: acc |= x; break;
          case AtomOp::Xor: acc ^= x; break;
          default: break;
        }
      });
      const uint64_t result = static_cast<uint32_t>(acc);
      lanes(mask, [&](uint32_t l) { d[l] = result; });
      break;
    }
    default: break;
  }
}

/// Picks the lanes to run next: those at the smallest pc among runnable
/// lanes. False when none is runnable (all exited or at a barrier).
bool Launch::reschedule(Warp& w) {
  lanes(w.active, [&](uint32_t l) { w.pcs[l] = w.pc; });
  const uint32_t runnable = w.live & ~w.exited & ~w.waiting;
  if (!runnable) {
    w.active = 0;
    return false;
  }
  uint32_t best = kNoPc;
  lanes(runnable, [&](uint32_t l) { best = std::min(best, w.pcs[l]); });
  uint32_t active = 0, next = kNoPc;
  lanes(runnable, [&](uint32_t l) {
    if (w.pcs[l] == best) {
      active |= 1u << l;
    } else {
      next = std::min(next, w.pcs[l]);
    }
  });
  w.pc = best;
  w.active = active;
  w.nextPc = next;
  return true;
}

void Launch::startWarp(Warp& w, uint32_t index) {
  w.index = index;
  const uint32_t first = index * kWarpSize;
  const uint32_t count = std::min(kWarpSize, blockThreads_ - first);
  w.live = count == kWarpSize ? kFullMask : (1u << count) - 1;
  w.exited = w.waiting = 0;
  w.pc = 0;
  w.active = w.live;
  w.nextPc = kNoPc;
  std::fill(std::begin(w.depth), std::end(w.depth), 0);
  const uint32_t bx = shape_.block[0], by = shape_.block[1];
  for (const auto& [s, special] : k_.specials) {
    uint64_t* r = slot(w, s);
    for (uint32_t l = 0; l < kWarpSize; ++l) {
      const uint32_t t = first + l;
      uint64_t v = 0;
      switch (special) {
        case Special::TidX: v = t % bx; break;
        case Special::TidY: v = t / bx % by; break;
        case Special::TidZ: v = t / (bx * by); break;
        case Special::NtidX: v = shape_.block[0]; break;
        case Special::NtidY: v = shape_.block[1]; break;
        case Special::NtidZ: v = shape_.block[2]; break;
        case Special::CtaidX: v = block_[0]; break;
        case Special::CtaidY: v = block_[1]; break;
        case Special::CtaidZ: v = block_[2]; break;
        case Special::NctaidX: v = shape_.grid[0]; break;
        case Special::NctaidY: v = shape_.grid[1]; break;
        case Special::NctaidZ: v = shape_.grid[2]; break;
        case Special::LaneId: v = l; break;
        case Special::WarpId: v = index; break;
        case Special::NWarpId: v = 64; break;
        case Special::SmId: v = 0; break;
        case Special::NSmId: v = 2; break;
        case Special::GridIdLow: v = 1; break;
        case Special::LanemaskEq: v = 1u << l; break;
        case Special::LanemaskLt: v = (1u << l) - 1; break;
        case Special::LanemaskLe: v = l == 31 ? kFullMask : (2u << l) - 1; break;
        case Special::LanemaskGt: v = l == 31 ? 0 : ~((2u << l) - 1); break;
        case Special::LanemaskGe: v = ~((1u << l) - 1); break;
        case Special::Clock:
        case Special::Clock64:
        case Special::GlobalTimer:
          v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
          break;
        case Special::DynamicSmemSize: v = shape_.dynamicSharedBytes; break;
        case Special::TotalSmemSize: v = sharedBytes_; break;
      }
      r[l] = v;
    }
  }
}

void Launch::run(InterpreterStats& stats) {
  blockThreads_ = shape_.block[0] * shape_.block[1] * shape_.block[2];
  warpsPerBlock_ = (blockThreads_ + kWarpSize - 1) / kWarpSize;
  localBytes_ = k_.localBytes;
  const uint32_t dynamicStart =
      (k_.staticSharedBytes + k_.dynamicSharedAlign - 1) / k_.dynamicSharedAlign * k_.dynamicSharedAlign;
  sharedBytes_ = shape_.dynamicSharedBytes ? dynamicStart + shape_.dynamicSharedBytes : k_.staticSharedBytes;

  // One register file (and local memory, return stack) per warp that must
  // be resident at once: all of a block's warps when it has barriers.
  const uint32_t resident = k_.usesBarrier ? warpsPerBlock_ : 1;
  const size_t regsPerWarp = static_cast<size_t>(k_.slotCount) * kWarpSize;
  const size_t localPerWarp = static_cast<size_t>(localBytes_) * kWarpSize;
  const size_t stackPerWarp = static_cast<size_t>(k_.callDepth) * kWarpSize;
  if (scratch.regs.size() < regsPerWarp * resident) scratch.regs.resize(regsPerWarp * resident);
  if (scratch.local.size() < localPerWarp * resident) scratch.local.resize(localPerWarp * resident);
  if (scratch.returnStack.size() < stackPerWarp * resident) scratch.returnStack.resize(stackPerWarp * resident);
  if (scratch.shared.size() < sharedBytes_) scratch.shared.resize(sharedBytes_);
  shared_ = scratch.shared.data();
  // An empty vector's data() may be null, which memset must not get even
  // for 0 bytes (UBSan: a kernel with no shared or no local memory).
  if (sharedBytes_ > 0) std::memset(shared_, 0, sharedBytes_);
  if (localPerWarp > 0) std::memset(scratch.local.data(), 0, localPerWarp * resident);
  warps_.assign(resident, Warp{});
  for (uint32_t i = 0; i < resident; ++i) {
    Warp& w = warps_[i];
    w.regs = scratch.regs.data() + regsPerWarp * i;
    w.local = scratch.local.data() + localPerWarp * i;
    w.returnStack = scratch.returnStack.data() + stackPerWarp * i;
    for (size_t c = 0; c < k_.constants.size(); ++c) {
      uint64_t* r = slot(w, k_.constants[c].slot);
      std::fill(r, r + kWarpSize, loaded_.constantValues[c]);
    }
  }

  const uint64_t blocks = static_cast<uint64_t>(shape_.grid[0]) * shape_.grid[1] * shape_.grid[2];
  if (shape_.orderSeed == 0) {
    for (uint32_t z = 0; z < shape_.grid[2]; ++z)
      for (uint32_t y = 0; y < shape_.grid[1]; ++y)
        for (uint32_t x = 0; x < shape_.grid[0]; ++x) runBlock(x, y, z);
  } else {
    rng_.seed(shape_.orderSeed);
    std::vector<uint64_t> order(blocks);
    for (uint64_t i = 0; i < blocks; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    for (uint64_t i : order) {
      const uint32_t x = static_cast<uint32_t>(i % shape_.grid[0]);
      const uint32_t y = static_cast<uint32_t>(i / shape_.grid[0] % shape_.grid[1]);
      const uint32_t z = static_cast<uint32_t>(i / (static_cast<uint64_t>(shape_.grid[0]) * shape_.grid[1]));
      runBlock(x, y, z);
    }
  }
  ++stats.launches;
  stats.warpInstructions += warpSteps_;
  stats.laneInstructions += laneSteps_;
}

void Launch::runBlock(uint32_t bx, uint32_t by, uint32_t bz) {
  block_[0] = bx;
  block_[1] = by;
  block_[2] = bz;
  // The order warps run in between barriers: index order, or shuffled.
  warpOrder_.resize(warpsPerBlock_);
  for (uint32_t i = 0; i < warpsPerBlock_; ++i) warpOrder_[i] = i;
  auto shuffleWarps = [&]() {
    if (shape_.orderSeed != 0) std::shuffle(warpOrder_.begin(), warpOrder_.end(), rng_);
  };
  if (!k_.usesBarrier) {
    Warp& w = warps_[0];
    shuffleWarps();
    for (uint32_t i : warpOrder_) {
      startWarp(w, i);
      runWarp(w);
    }
    return;
  }
  for (uint32_t i = 0; i < warpsPerBlock_; ++i) startWarp(warps_[i], i);
  while (true) {
    shuffleWarps();
    for (uint32_t i : warpOrder_) {
      Warp& w = warps_[i];
      if (w.live & ~w.exited & ~w.waiting) runWarp(w);
    }
    bool anyWaiting = false;
    for (Warp& w : warps_) anyWaiting = anyWaiting || w.waiting;
    if (!anyWaiting) return;
    // Every thread that has not exited waits at a barrier: release them.
    for (Warp& w : warps_) {
      w.waiting = 0;
      w.active = 0;
      reschedule(w);
    }
  }
}

void Launch::runWarp(Warp& w) {
  if (w.active == 0 && !reschedule(w)) return;
  const Instruction* code = k_.code.data();
  uint64_t* const R = w.regs;
  auto S = [R](uint32_t s) { return R + static_cast<size_t>(s) * kWarpSize; };
  uint64_t warpSteps = 0, laneSteps = 0;

  while (true) {
    const Instruction& in = code[w.pc];
    uint32_t exec = w.active;
    if (in.guard != kNoSlot) {
      const uint64_t* p = S(in.guard);
      const uint64_t want = (in.flags & kNegGuard) ? 0 : 1;
      uint32_t m = 0;
      lanes(exec, [&](uint32_t l) { m |= static_cast<uint32_t>((p[l] & 1) == want) << l; });
      exec = m;
    }
    ++warpSteps;
    laneSteps += static_cast<uint64_t>(std::popcount(exec));

    switch (in.op) {
      // ---- control flow
      case Opcode::Bra: {
        const uint32_t target = static_cast<uint32_t>(in.offset);
        if (exec == w.active) {
          w.pc = target;
          if (w.pc >= w.nextPc && !reschedule(w)) goto done;
        } else if (exec == 0) {
          if (++w.pc == w.nextPc) reschedule(w);
        } else {
          lanes(exec, [&](uint32_t l) { w.pcs[l] = target; });
          lanes(w.active & ~exec, [&](uint32_t l) { w.pcs[l] = w.pc + 1; });
          w.active = 0;
          if (!reschedule(w)) goto done;
        }
        continue;
      }
      case Opcode::Call: {
        const uint32_t target = static_cast<uint32_t>(in.offset);
        const uint32_t depth = k_.callDepth;
        lanes(exec, [&](uint32_t l) {
          w.returnStack[l * depth + w.depth[l]] = w.pc + 1;
          ++w.depth[l];
        });
        if (exec == w.active) {
          w.pc = target;
          if (w.pc >= w.nextPc && !reschedule(w)) goto done;
        } else if (exec == 0) {
          if (++w.pc == w.nextPc) reschedule(w);
        } else {
          lanes(exec, [&](uint32_t l) { w.pcs[l] = target; });
          lanes(w.active & ~exec, [&](uint32_t l) { w.pcs[l] = w.pc + 1; });
          w.active = 0;
          if (!reschedule(w)) goto done;
        }
        continue;
      }
      case Opcode::Ret: {
        const uint32_t depth = k_.callDepth;
        lanes(exec, [&](uint32_t l) {
          --w.depth[l];
          w.pcs[l] = w.returnStack[l * depth + w.depth[l]];
        });
        lanes(w.active & ~exec, [&](uint32_t l) { w.pcs[l] = w.pc + 1; });
        w.active = 0;
        if (!reschedule(w)) goto done;
        continue;
      }
      case Opcode::Exit:
        w.exited |= exec;
        w.active &= ~exec;
        ++w.pc;
        if (w.active == 0) {
          if (!reschedule(w)) goto done;
        } else if (w.pc == w.nextPc) {
          reschedule(w);
        }
        continue;
      case Opcode::BarSync:
        lanes(exec, [&](uint32_t l) { w.pcs[l] = w.pc + 1; });
        w.waiting |= exec;
        w.active &= ~exec;
        ++w.pc;
        if (w.active == 0) {
          if (!reschedule(w)) goto done;
        } else if (w.pc == w.nextPc) {
          reschedule(w);
        }
        continue;
      case Opcode::Trap:
        if (exec) fault(kLaunchFailed, "trap", w, static_cast<uint32_t>(std::countr_zero(exec)), in);
        break;
      case Opcode::WarpSync:
      case Opcode::Nop: break;

      // ---- moves and memory
      case Opcode::Mov: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t* a = S(in.src[0]);
        lanes(exec, [&](uint32_t l) { d[l] = a[l]; });
        break;
      }
      case Opcode::MovPack: {
        uint64_t* d = S(in.dst[0]);
        const uint32_t part = static_cast<uint32_t>(typeBytes(in.type)) * 8 / in.vector;
        const uint64_t partMask = part == 64 ? ~0ull : (1ull << part) - 1;
        lanes(exec, [&](uint32_t l) {
          uint64_t v = 0;
          for (uint32_t i = 0; i < in.vector; ++i) v |= (S(in.src[i])[l] & partMask) << (part * i);
          d[l] = v;
        });
        break;
      }
      case Opcode::MovUnpack: {
        const uint64_t* a = S(in.src[0]);
        const uint32_t part = static_cast<uint32_t>(typeBytes(in.type)) * 8 / in.vector;
        const uint64_t partMask = part == 64 ? ~0ull : (1ull << part) - 1;
        lanes(exec, [&](uint32_t l) {
          const uint64_t v = a[l];
          for (uint32_t i = 0; i < in.vector; ++i) S(in.dst[i])[l] = (v >> (part * i)) & partMask;
        });
        break;
      }
      case Opcode::LdParam:
        withMemory(in.type, [&](auto tag) { loadParam<typename decltype(tag)::type>(w, in, exec); });
        break;
      case Opcode::Ld: withMemory(in.type, [&](auto tag) { load<typename decltype(tag)::type>(w, in, exec); }); break;
      case Opcode::St:
        withMemory(in.type, [&](auto tag) {
          using T = std::make_unsigned_t<typename decltype(tag)::type>;
          store<T>(w, in, exec);
        });
        break;
      case Opcode::Atom:
        withNumber(in.type, [&](auto tag) { atomic<typename decltype(tag)::type>(w, in, exec); });
        break;
      case Opcode::Cvt: executeCvt(w, in, exec); break;
      case Opcode::Cvta: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t* a = S(in.src[0]);
        uint64_t window = 0;
        if (in.space == Space::Shared) window = kSharedWindow;
        if (in.space == Space::Local) window = kLocalWindow;
        if (in.space == Space::Param) window = kParamWindow;
        const uint64_t mask = in.type == PtxType::U32 ? 0xffffffffull : ~0ull;
        if (in.toGeneric) {
          lanes(exec, [&](uint32_t l) { d[l] = (a[l] + window) & mask; });
        } else {
          lanes(exec, [&](uint32_t l) { d[l] = (a[l] - window) & mask; });
        }
        break;
      }

      // ---- integer arithmetic
      case Opcode::Add:
        if (in.flags & kSat) {
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          uint64_t* d = S(in.dst[0]);
          lanes(exec, [&](uint32_t l) {
            d[l] = put<int32_t>(saturateInt<int32_t>(static_cast<__int128>(get<int32_t>(a[l])) + get<int32_t>(b[l])));
          });
          break;
        }
        withInt(in.type, [&](auto tag) {
          using U = std::make_unsigned_t<typename decltype(tag)::type>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) { d[l] = put<U>(static_cast<U>(get<U>(a[l]) + get<U>(b[l]))); });
        });
        break;
      case Opcode::Sub:
        if (in.flags & kSat) {
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          uint64_t* d = S(in.dst[0]);
          lanes(exec, [&](uint32_t l) {
            d[l] = put<int32_t>(saturateInt<int32_t>(static_cast<__int128>(get<int32_t>(a[l])) - get<int32_t>(b[l])));
          });
          break;
        }
        withInt(in.type, [&](auto tag) {
          using U = std::make_unsigned_t<typename decltype(tag)::type>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) { d[l] = put<U>(static_cast<U>(get<U>(a[l]) - get<U>(b[l]))); });
        });
        break;
      case Opcode::AddCarry:
      case Opcode::SubCarry: {
        const bool isAdd = in.op == Opcode::AddCarry;
        const bool carryIn = in.flags & kCarryIn, carryOut = in.flags & kCarryOut;
        withInt(in.type, [&](auto tag) {
          using U = std::make_unsigned_t<typename decltype(tag)::type>;
          uint64_t* d = S(in.dst[0]);
          uint64_t* cc = S(in.dst[1]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) {
            const U x = get<U>(a[l]), y = get<U>(b[l]);
            const U c = carryIn ? static_cast<U>(cc[l] & 1) : 0;
            U r;
            bool out;
            if (isAdd) {
              r = static_cast<U>(x + y + c);
              out = r < x || (c && r == x);
            } else {
              r = static_cast<U>(x - y - c);
              out = x < y || (c && x == y);
            }
            d[l] = put<U>(r);
            if (carryOut) cc[l] = out;
          });
        });
        break;
      }
      case Opcode::MulLo:
      case Opcode::MadLo:
        if (in.flags & (kCarryIn | kCarryOut)) {
          executeMadCarry(w, in, exec);
          break;
        }
        withInt(in.type, [&](auto tag) {
          using U = std::make_unsigned_t<typename decltype(tag)::type>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          if (in.op == Opcode::MulLo) {
            lanes(exec, [&](uint32_t l) { d[l] = put<U>(wrapMul<U>(get<U>(a[l]), get<U>(b[l]))); });
          } else {
            const uint64_t* c = S(in.src[2]);
            lanes(exec, [&](uint32_t l) {
              d[l] = put<U>(static_cast<U>(wrapMul<U>(get<U>(a[l]), get<U>(b[l])) + get<U>(c[l])));
            });
          }
        });
        break;
      case Opcode::MulHi:
      case Opcode::MadHi:
        if (in.flags & (kCarryIn | kCarryOut)) {
          executeMadCarry(w, in, exec);
          break;
        }
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          using U = std::make_unsigned_t<T>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          if (in.op == Opcode::MulHi) {
            lanes(exec, [&](uint32_t l) { d[l] = put<T>(mulHigh<T>(get<T>(a[l]), get<T>(b[l]))); });
          } else if (in.flags & kSat) {
            const uint64_t* c = S(in.src[2]);
            lanes(exec, [&](uint32_t l) {
              d[l] =
                  put<T>(saturateInt<T>(static_cast<__int128>(mulHigh<T>(get<T>(a[l]), get<T>(b[l]))) + get<T>(c[l])));
            });
          } else {
            const uint64_t* c = S(in.src[2]);
            lanes(exec, [&](uint32_t l) {
              d[l] = put<U>(static_cast<U>(static_cast<U>(mulHigh<T>(get<T>(a[l]), get<T>(b[l]))) + get<U>(c[l])));
            });
          }
        });
        break;
      case Opcode::MulWide:
      case Opcode::MadWide:
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          if constexpr (sizeof(T) == 2 || sizeof(T) == 4) {
            using W = typename Wider<T>::type;
            using UW = std::make_unsigned_t<W>;
            uint64_t* d = S(in.dst[0]);
            const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
            if (in.op == Opcode::MulWide) {
              lanes(exec, [&](uint32_t l) {
                d[l] = put<W>(static_cast<W>(static_cast<W>(get<T>(a[l])) * static_cast<W>(get<T>(b[l]))));
              });
            } else {
              const uint64_t* c = S(in.src[2]);
              lanes(exec, [&](uint32_t l) {
                const UW product = static_cast<UW>(static_cast<W>(get<T>(a[l])) * static_cast<W>(get<T>(b[l])));
                d[l] = put<UW>(static_cast<UW>(product + get<UW>(c[l])));
              });
            }
          }
        });
        break;
      case Opcode::Mul24Lo:
      case Opcode::Mad24Lo: {
        const bool isSigned = in.type == PtxType::S32;
        uint64_t* d = S(in.dst[0]);
        const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
        const uint64_t* c = in.op == Opcode::Mad24Lo ? S(in.src[2]) : nullptr;
        lanes(exec, [&](uint32_t l) {
          auto low24 = [&](uint64_t v) -> int64_t {
            const uint32_t x = static_cast<uint32_t>(v) & 0xffffff;
            return isSigned ? static_cast<int64_t>(static_cast<int32_t>(x << 8) >> 8) : static_cast<int64_t>(x);
          };
          uint32_t r = static_cast<uint32_t>(low24(a[l]) * low24(b[l]));
          if (c) r += static_cast<uint32_t>(c[l]);
          d[l] = r;
        });
        break;
      }
      case Opcode::Sad:
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          using U = std::make_unsigned_t<T>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]), *c = S(in.src[2]);
          lanes(exec, [&](uint32_t l) {
            const T x = get<T>(a[l]), y = get<T>(b[l]);
            const U diff = x > y ? static_cast<U>(static_cast<U>(x) - static_cast<U>(y))
                                 : static_cast<U>(static_cast<U>(y) - static_cast<U>(x));
            d[l] = put<U>(static_cast<U>(get<U>(c[l]) + diff));
          });
        });
        break;
      case Opcode::Div:
      case Opcode::Rem: {
        const bool isDiv = in.op == Opcode::Div;
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) {
            const T x = get<T>(a[l]), y = get<T>(b[l]);
            T r;
            if (y == 0) {
              r = isDiv ? static_cast<T>(-1) : x;  // what the GPU gives; never a host trap
            } else if (std::is_signed_v<T> && y == static_cast<T>(-1)) {
              r = isDiv ? static_cast<T>(0 - static_cast<std::make_unsigned_t<T>>(x)) : 0;
            } else {
              r = isDiv ? static_cast<T>(x / y) : static_cast<T>(x % y);
            }
            d[l] = put<T>(r);
          });
        });
        break;
      }
      case Opcode::Neg:
      case Opcode::Abs: {
        const bool isNeg = in.op == Opcode::Neg;
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          using U = std::make_unsigned_t<T>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t* a = S(in.src[0]);
          lanes(exec, [&](uint32_t l) {
            const T x = get<T>(a[l]);
            const U negated = static_cast<U>(U(0) - static_cast<U>(x));
            d[l] = put<U>(isNeg || x < 0 ? negated : static_cast<U>(x));
          });
        });
        break;
      }
      case Opcode::Min:
      case Opcode::Max: {
        const bool isMin = in.op == Opcode::Min;
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) {
            const T x = get<T>(a[l]), y = get<T>(b[l]);
            d[l] = put<T>(isMin ? std::min(x, y) : std::max(x, y));
          });
        });
        break;
      }

      // ---- floating point
      case Opcode::FAdd:
      case Opcode::FSub:
      case Opcode::FMul:
      case Opcode::Fma:
      case Opcode::FDiv:
      case Opcode::FNeg:
      case Opcode::FAbs:
      case Opcode::FMin:
      case Opcode::FMax:
      case Opcode::Rcp:
      case Opcode::Sqrt:
      case Opcode::Rsqrt:
      case Opcode::Ex2:
      case Opcode::Lg2:
      case Opcode::Sin:
      case Opcode::Cos:
      case Opcode::Tanh:
      case Opcode::Copysign:
      case Opcode::Testp: executeFloat(w, in, exec); break;

      // ---- bits
      case Opcode::And:
      case Opcode::Or:
      case Opcode::Xor: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
        const uint64_t mask = in.type == PtxType::Pred ? 1 : ~0ull;
        if (in.op == Opcode::And) lanes(exec, [&](uint32_t l) { d[l] = a[l] & b[l] & mask; });
        if (in.op == Opcode::Or) lanes(exec, [&](uint32_t l) { d[l] = (a[l] | b[l]) & mask; });
        if (in.op == Opcode::Xor) lanes(exec, [&](uint32_t l) { d[l] = (a[l] ^ b[l]) & mask; });
        break;
      }
      case Opcode::Not: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t* a = S(in.src[0]);
        const uint64_t mask = in.type == PtxType::Pred ? 1 : ~0ull;
        lanes(exec, [&](uint32_t l) { d[l] = ~a[l] & mask; });
        break;
      }
      case Opcode::Cnot:
        withInt(in.type, [&](auto tag) {
          using U = std::make_unsigned_t<typename decltype(tag)::type>;
          uint64_t* d = S(in.dst[0]);
          const uint64_t* a = S(in.src[0]);
          lanes(exec, [&](uint32_t l) { d[l] = get<U>(a[l]) == 0 ? 1 : 0; });
        });
        break;
      case Opcode::Shl:
      case Opcode::Shr: {
        const bool left = in.op == Opcode::Shl;
        withInt(in.type, [&](auto tag) {
          using T = typename decltype(tag)::type;
          using U = std::make_unsigned_t<T>;
          constexpr uint32_t bits = 8 * sizeof(T);
          uint64_t* d = S(in.dst[0]);
          const uint64_t *a = S(in.src[0]), *b = S(in.src[1]);
          lanes(exec, [&](uint32_t l) {
            const uint32_t n = static_cast<uint32_t>(b[l]);
            const T x = get<T>(a[l]);
            if (left) {
              d[l] = n >= bits ? 0 : put<U>(static_cast<U>(static_cast<U>(x) << n));
            } else if constexpr (std::is_signed_v<T>) {
              d[l] = put<T>(static_cast<T>(x >> std::min(n, bits - 1)));
            } else {
              d[l] = n >= bits ? 0 : put<U>(static_cast<U>(x >> n));
            }
          });
        });
        break;
      }
      case Opcode::Bfe:
      case Opcode::Bfi:
      case Opcode::Shf:
      case Opcode::Dp4a:
      case Opcode::Dp2a:
      case Opcode::Prmt:
      case Opcode::Popc:
      case Opcode::Clz:
      case Opcode::Brev:
      case Opcode::Bfind: executeBits(w, in, exec); break;

      // ---- comparison and selection
      case Opcode::Setp:
      case Opcode::Set: executeSetp(w, in, exec); break;
      case Opcode::Selp: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t *a = S(in.src[0]), *b = S(in.src[1]), *c = S(in.src[2]);
        lanes(exec, [&](uint32_t l) { d[l] = (c[l] & 1) ? a[l] : b[l]; });
        break;
      }
      case Opcode::Slct: {
        uint64_t* d = S(in.dst[0]);
        const uint64_t *a = S(in.src[0]), *b = S(in.src[1]), *c = S(in.src[2]);
        if (in.srcType == PtxType::F32) {
          const bool ftz = in.flags & kFtz;
          lanes(exec, [&](uint32_t l) {
            const float x = ftz ? flush(get<float>(c[l])) : get<float>(c[l]);
            d[l] = x >= 0.0f ? a[l] : b[l];
          });
        } else {
          lanes(exec, [&](uint32_t l) { d[l] = get<int32_t>(c[l]) >= 0 ? a[l] : b[l]; });
        }
        break;
      }

      // ---- warp collectives
      case Opcode::Shfl:
      case Opcode::Vote:
      case Opcode::Activemask:
      case Opcode::Redux: executeCollective(w, in, exec); break;
    }
    if (++w.pc == w.nextPc) reschedule(w);
  }
done:
  warpSteps_ += warpSteps;
  laneSteps_ += laneSteps;
}

}  // namespace

bool runKernel(const LoadedKernel& kernel, const LaunchShape& shape, const uint8_t* params, DeviceMemory& memory,
               Fault& fault, InterpreterStats* stats) {
  InterpreterStats local;
  InterpreterStats& counts = stats ? *stats : local;
  const auto start = std::chrono::steady_clock::now();
  Launch launch(kernel, shape, params, memory);
  bool ok = true;
  try {
    launch.run(counts);
  } catch (const FaultException& e) {
    fault.code = e.code;
    fault.message = e.message;
    ok = false;
  }
  counts.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ok;
}

}  // namespace kiln::emulator
