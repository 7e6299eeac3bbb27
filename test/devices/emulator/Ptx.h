// The emulator's form of a PTX module: each kernel decoded once into a flat
// array of instructions over numbered 64-bit register slots, which
// PtxInterpreter.cpp executes. Decoding resolves everything the
// interpreter would otherwise look up per instruction: register names
// become slot numbers, immediates and special registers (%tid.x, ...)
// become slots filled before a warp runs, labels become instruction
// indices, variables become addresses (shared and local offsets, or a
// global variable's device address patched in at load time), and the
// .func bodies a kernel calls are appended to its code, each with its own
// slots, so that a call is a jump with a per-thread return stack.
//
// A value of any PTX type sits in the low bits of its 64-bit slot; every
// instruction reads its operands' low bits as its own type, so a 32-bit
// register read as .u32 ignores whatever the upper bits hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::emulator {

/// A load error: the message names the line and what is wrong or not
/// implemented ("line 12: unknown instruction 'foo.b32'").
class PtxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// clang-format off
enum class PtxType : uint8_t {
  None, Pred,
  B8, B16, B32, B64,
  U8, U16, U32, U64,
  S8, S16, S32, S64,
  F16, F16x2, BF16, BF16x2, F32, F64,
};
// clang-format on

/// Bytes of one value of `type` (0 for None and Pred).
size_t typeBytes(PtxType type);
bool isSignedInt(PtxType type);
bool isFloat(PtxType type);  // f16, bf16, f32, f64 and their pairs
const char* typeName(PtxType type);

/// Where an address points. Generic addresses are resolved per access:
/// the shared, local and parameter windows (Ptx.h constants below), else
/// global memory.
enum class Space : uint8_t { Generic, Global, Shared, Local, Param, Const };

/// Generic addresses of the per-block shared memory, the per-thread local
/// memory and the kernel parameters: windows no device allocation reaches
/// (allocations start at DeviceMemory's kFirstAddress).
constexpr uint64_t kSharedWindow = 0x0000500000000000ull;
constexpr uint64_t kLocalWindow = 0x0000600000000000ull;
constexpr uint64_t kParamWindow = 0x0000680000000000ull;
constexpr uint64_t kWindowSize = 0x0000010000000000ull;

// Every operation the interpreter implements, one dense enum. The type and
// the sub-operation (comparison, rounding, atomic operation, shuffle mode)
// are fields of the instruction, switched on once per warp, outside the loop
// over lanes.
// clang-format off
#define KILN_PTX_OPCODES(X)                                                                                     \
  X(Mov) X(MovPack) X(MovUnpack) X(LdParam) X(Ld) X(St) X(Cvt) X(Cvta)                                          \
  X(Add) X(Sub) X(MulLo) X(MulHi) X(MulWide) X(MadLo) X(MadHi) X(MadWide) X(Mul24Lo) X(Mad24Lo) X(Sad)          \
  X(Div) X(Rem) X(Neg) X(Abs) X(Min) X(Max) X(AddCarry) X(SubCarry)                                             \
  X(FAdd) X(FSub) X(FMul) X(Fma) X(FDiv) X(FNeg) X(FAbs) X(FMin) X(FMax) X(Rcp) X(Sqrt) X(Rsqrt) X(Ex2) X(Lg2)  \
  X(Sin) X(Cos) X(Tanh) X(Copysign) X(Testp)                                                                    \
  X(And) X(Or) X(Xor) X(Not) X(Cnot) X(Shl) X(Shr) X(Shf) X(Bfe) X(Bfi) X(Prmt) X(Popc) X(Clz) X(Brev) X(Bfind) \
  X(Dp4a) X(Dp2a)                                                                                               \
  X(Setp) X(Set) X(Selp) X(Slct)                                                                                \
  X(Atom) X(Shfl) X(Vote) X(Activemask) X(Redux)                                                                \
  X(Bra) X(Call) X(Ret) X(Exit) X(BarSync) X(WarpSync) X(Nop) X(Trap)
// clang-format on

enum class Opcode : uint8_t {
#define KILN_PTX_ENUM(name) name,
  KILN_PTX_OPCODES(KILN_PTX_ENUM)
#undef KILN_PTX_ENUM
};
const char* opcodeName(Opcode op);

/// Comparisons of setp/set: ordered float comparisons are false on NaN, the
/// unordered ones (U suffix) true; Lo/Ls/Hi/Hs are the unsigned integer ones.
enum class Compare : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, Lo, Ls, Hi, Hs, Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan };
/// How setp combines its result with a predicate operand (.and/.or/.xor).
enum class BoolOp : uint8_t { None, And, Or, Xor };
/// Float rounding (.rn .rz .rm .rp), or round-to-integer for cvt (.rni ...).
enum class Rounding : uint8_t { Default, Rn, Rz, Rm, Rp, Rni, Rzi, Rmi, Rpi };
enum class AtomOp : uint8_t { Add, Min, Max, Exch, Cas, Inc, Dec, And, Or, Xor };
enum class ShuffleMode : uint8_t { Up, Down, Bfly, Idx };
enum class VoteMode : uint8_t { All, Any, Uni, Ballot };
enum class TestpMode : uint8_t { Finite, Infinite, Number, NotANumber, Normal, Subnormal };

/// Instruction flags.
enum : uint8_t {
  kFtz = 1,         // flush f32 subnormals to zero
  kSat = 2,         // saturate (floats to [0, 1], integers to the type's range)
  kNegGuard = 4,    // @!%p
  kNanMode = 8,     // min/max.NaN: NaN propagates
  kDoubleDst = 16,  // a second destination (setp's %p|%q, shfl's predicate)
  kNegSrc = 32,     // the predicate operand is negated (setp.and ..., !%q; vote !%p)
  kCarryIn = 64,    // addc/subc read the carry
  kCarryOut = 128,  // .cc: write the carry
};

constexpr uint32_t kNoSlot = 0xffffffffu;

struct Instruction {
  Opcode op = Opcode::Nop;
  PtxType type = PtxType::None;     // the operation's type; cvt's destination
  PtxType srcType = PtxType::None;  // cvt's source; setp's operand type
  uint8_t mode = 0;                 // Compare, Rounding, AtomOp, ShuffleMode, VoteMode, TestpMode, bfind's .shiftamt
  uint8_t mode2 = 0;                // setp's BoolOp; atom's Rounding is not needed
  Space space = Space::Generic;     // ld/st/atom/cvta; cvta's direction is `toGeneric`
  uint8_t vector = 1;               // 1, 2 or 4 values (ld/st/mov pack)
  uint8_t flags = 0;
  bool toGeneric = false;    // cvta (true) or cvta.to (false)
  uint32_t guard = kNoSlot;  // the guard predicate's slot
  uint32_t dst[4] = {kNoSlot, kNoSlot, kNoSlot, kNoSlot};
  uint32_t src[4] = {kNoSlot, kNoSlot, kNoSlot, kNoSlot};
  uint32_t addr = kNoSlot;  // ld/st/atom: the slot holding the address (a zero slot for [symbol])
  int64_t offset = 0;       // address displacement; branch or call target
  uint32_t line = 0;        // in the PTX text
};

/// Special registers a kernel reads, each held in a slot that is set for
/// every warp before it runs.
enum class Special : uint8_t {
  TidX,
  TidY,
  TidZ,
  NtidX,
  NtidY,
  NtidZ,
  CtaidX,
  CtaidY,
  CtaidZ,
  NctaidX,
  NctaidY,
  NctaidZ,
  LaneId,
  WarpId,
  NWarpId,
  SmId,
  NSmId,
  GridIdLow,
  LanemaskEq,
  LanemaskLt,
  LanemaskLe,
  LanemaskGt,
  LanemaskGe,
  Clock,
  Clock64,
  GlobalTimer,
  DynamicSmemSize,
  TotalSmemSize,
};

/// A slot whose value is the same for every thread: a literal, or the
/// device address (plus `value` as an offset) of module variable `variable`.
struct ConstantSlot {
  uint32_t slot = 0;
  uint64_t value = 0;
  int32_t variable = -1;
};

struct KernelParam {
  std::string name;
  uint32_t offset = 0;
  uint32_t bytes = 0;
};

struct Kernel {
  std::string name;
  std::vector<Instruction> code;
  std::vector<std::string> text;  // each instruction as written, for fault messages
  uint32_t slotCount = 0;
  std::vector<ConstantSlot> constants;
  std::vector<std::pair<uint32_t, Special>> specials;
  std::vector<KernelParam> params;
  uint32_t paramBytes = 0;
  uint32_t staticSharedBytes = 0;
  uint32_t dynamicSharedAlign = 1;  // where `.extern .shared` arrays start, after the static ones
  uint32_t localBytes = 0;          // per thread: .local arrays, .func parameters
  uint32_t maxThreads = 0;          // .maxntid / .reqntid product, 0 when not given
  uint32_t reqntid[3] = {0, 0, 0};  // .reqntid, 0 when not given
  uint32_t callDepth = 0;           // deepest chain of .func calls
  bool usesBarrier = false;
  bool usesWarpCollectives = false;  // shfl, vote, redux, activemask
};

/// A module-level .global or .const variable, given device memory (and its
/// initializer) when the module is loaded.
struct ModuleVariable {
  std::string name;
  Space space = Space::Global;
  uint64_t bytes = 0;
  uint32_t align = 1;
  std::vector<uint8_t> init;  // the first bytes; the rest are zero
};

struct PtxModule {
  std::vector<Kernel> kernels;
  std::vector<ModuleVariable> variables;
  const Kernel* find(std::string_view name) const;
};

/// True for text that looks like PTX (a NUL-terminated image starting with
/// comments or directives), as opposed to an ELF CUBIN or a fatbin.
bool looksLikePtx(const char* image);

/// Parses and decodes `text`; throws PtxError naming the line and the
/// instruction or directive it does not implement.
PtxModule loadPtx(std::string_view text);

}  // namespace kiln::emulator
