// Decoding PTX syntax (PtxSyntax.h) into the emulator's instructions
// (Ptx.h), once per kernel: names become slots and offsets, modifiers become
// fields, and each .func the kernel calls is decoded after its body with its
// own slots and its own frame in the thread's local memory (parameters,
// return values, .local arrays), so that a call is a jump and `ret` a jump
// back. Since every function has one fixed frame, recursion is refused.
//
// Anything the interpreter does not implement is refused here, at load
// time, naming the line and the instruction: an unknown opcode, a modifier
// nobody handles, a type an operation does not support.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "test/devices/emulator/PtxSyntax.h"

namespace kiln::emulator {

size_t typeBytes(PtxType type) {
  switch (type) {
    case PtxType::None:
    case PtxType::Pred: return 0;
    case PtxType::B8:
    case PtxType::U8:
    case PtxType::S8: return 1;
    case PtxType::B16:
    case PtxType::U16:
    case PtxType::S16:
    case PtxType::F16:
    case PtxType::BF16: return 2;
    case PtxType::B32:
    case PtxType::U32:
    case PtxType::S32:
    case PtxType::F32:
    case PtxType::F16x2:
    case PtxType::BF16x2: return 4;
    case PtxType::B64:
    case PtxType::U64:
    case PtxType::S64:
    case PtxType::F64: return 8;
  }
  return 0;
}

bool isSignedInt(PtxType t) { return t == PtxType::S8 || t == PtxType::S16 || t == PtxType::S32 || t == PtxType::S64; }

bool isFloat(PtxType t) {
  return t == PtxType::F16 || t == PtxType::F16x2 || t == PtxType::BF16 || t == PtxType::BF16x2 || t == PtxType::F32 ||
         t == PtxType::F64;
}

const char* typeName(PtxType t) {
  static const char* const kNames[] = {"none", "pred", "b8",  "b16", "b32", "b64",   "u8",   "u16",    "u32", "u64",
                                       "s8",   "s16",  "s32", "s64", "f16", "f16x2", "bf16", "bf16x2", "f32", "f64"};
  return kNames[static_cast<int>(t)];
}

const char* opcodeName(Opcode op) {
  static const char* const kNames[] = {
#define KILN_PTX_NAME(name) #name,
      KILN_PTX_OPCODES(KILN_PTX_NAME)
#undef KILN_PTX_NAME
  };
  return kNames[static_cast<int>(op)];
}

const Kernel* PtxModule::find(std::string_view name) const {
  for (const Kernel& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

bool looksLikePtx(const char* image) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(image);
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') return false;
  // Skip blank space; PTX starts with a comment or a directive.
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
  return (p[0] == '/' && (p[1] == '/' || p[1] == '*')) || p[0] == '.';
}

namespace {

using syntax::Declaration;
using syntax::Operand;
using OperandKind = syntax::Operand::Kind;

[[noreturn]] void fail(uint32_t line, const std::string& message) {
  throw PtxError("line " + std::to_string(line) + ": " + message);
}

/// An opcode's dotted modifiers, taken one by one as the decoder
/// understands them; any left over is an error.
class Modifiers {
 public:
  explicit Modifiers(std::string_view opcode) {
    size_t dot = opcode.find('.');
    base = opcode.substr(0, dot);
    while (dot != std::string_view::npos) {
      size_t next = opcode.find('.', dot + 1);
      rest_.push_back(opcode.substr(dot, next == std::string_view::npos ? std::string_view::npos : next - dot));
      dot = next;
    }
  }

  bool take(std::string_view m) {
    auto it = std::find(rest_.begin(), rest_.end(), m);
    if (it == rest_.end()) return false;
    rest_.erase(it);
    return true;
  }
  /// The index in `options` of the modifier present, or -1.
  int takeOneOf(std::initializer_list<std::string_view> options) {
    int i = 0;
    for (std::string_view o : options) {
      if (take(o)) return i;
      ++i;
    }
    return -1;
  }
  /// The type modifiers, in order.
  std::vector<PtxType> takeTypes() {
    std::vector<PtxType> types;
    for (auto it = rest_.begin(); it != rest_.end();) {
      PtxType t = syntax::typeFromName(*it);
      if (t == PtxType::None) {
        ++it;
      } else {
        types.push_back(t);
        it = rest_.erase(it);
      }
    }
    return types;
  }
  /// Memory-ordering, scope and cache qualifiers: they do not change what a
  /// sequential emulator computes.
  void dropMemoryHints() {
    static const std::string_view kHints[] = {
        ".nc",
        ".ca",
        ".cg",
        ".cs",
        ".lu",
        ".cv",
        ".wb",
        ".wt",
        ".volatile",
        ".relaxed",
        ".acquire",
        ".release",
        ".acq_rel",
        ".weak",
        ".sc",
        ".cta",
        ".gpu",
        ".sys",
        ".cluster",
        ".mmio",
        ".L1::evict_normal",
        ".L1::evict_unchanged",
        ".L1::evict_first",
        ".L1::evict_last",
        ".L1::no_allocate",
        ".L2::evict_normal",
        ".L2::evict_first",
        ".L2::evict_last",
        ".L2::64B",
        ".L2::128B",
        ".L2::256B",
    };
    for (std::string_view h : kHints) take(h);
  }
  bool empty() const { return rest_.empty(); }
  std::string_view first() const { return rest_.front(); }

  std::string_view base;

 private:
  std::vector<std::string_view> rest_;
};

bool isIntType(PtxType t) {
  switch (t) {
    case PtxType::B16:
    case PtxType::B32:
    case PtxType::B64:
    case PtxType::U16:
    case PtxType::U32:
    case PtxType::U64:
    case PtxType::S16:
    case PtxType::S32:
    case PtxType::S64: return true;
    default: return false;
  }
}
bool isBitType(PtxType t) { return t == PtxType::B8 || t == PtxType::B16 || t == PtxType::B32 || t == PtxType::B64; }
bool isF32OrF64(PtxType t) { return t == PtxType::F32 || t == PtxType::F64; }

/// The register-file and memory layout of one kernel, built while decoding
/// its body and the functions it calls.
class KernelDecoder {
 public:
  KernelDecoder(const syntax::Module& module, const std::unordered_map<std::string_view, size_t>& functions,
                const std::unordered_map<std::string_view, size_t>& variables, const syntax::Function& entry,
                Kernel& kernel)
      : module_(module), functions_(functions), variables_(variables), entry_(entry), k_(kernel) {}

  void decode() {
    k_.name = std::string(entry_.name);
    for (const Declaration& p : entry_.params) {
      const uint32_t align = std::max<uint32_t>(p.align ? p.align : static_cast<uint32_t>(typeBytes(p.type)), 1);
      k_.paramBytes = (k_.paramBytes + align - 1) / align * align;
      k_.params.push_back({std::string(p.name), k_.paramBytes, static_cast<uint32_t>(p.bytes())});
      kernelParams_[p.name] = k_.paramBytes;
      if (p.bytes() > kMaxParamBytes || k_.paramBytes + p.bytes() > kMaxParamBytes)
        fail(p.line, "kernel parameters larger than " + std::to_string(kMaxParamBytes) + " bytes");
      k_.paramBytes += static_cast<uint32_t>(p.bytes());
    }
    const uint32_t* dims = entry_.reqntid[0] ? entry_.reqntid : entry_.maxntid;
    if (dims[0]) k_.maxThreads = dims[0] * dims[1] * dims[2];
    std::copy(entry_.reqntid, entry_.reqntid + 3, k_.reqntid);
    zeroSlot_ = constant(0);

    decodeFunction(entry_, nullptr);
    while (!pending_.empty()) {
      Instance* instance = pending_.front();
      pending_.erase(pending_.begin());
      decodeFunction(*instance->function, instance);
    }
    for (auto& [index, instance] : callFixups_) k_.code[index].offset = instance->entryPc;
    // Dynamic shared memory starts after the static arrays.
    const uint32_t align = k_.dynamicSharedAlign;
    const uint32_t dynamicStart = (k_.staticSharedBytes + align - 1) / align * align;
    for (uint32_t slot : dynamicSharedSlots_)
      for (ConstantSlot& c : k_.constants)
        if (c.slot == slot) c.value += dynamicStart;
    k_.callDepth = callDepth(entry_);
    k_.localBytes = (localBytes_ + 15) / 16 * 16;
  }

 private:
  /// A .func decoded into this kernel: where its code starts and where its
  /// parameters and return values live in the thread's local memory.
  struct Instance {
    const syntax::Function* function = nullptr;
    uint32_t entryPc = 0;
    std::vector<uint32_t> paramOffsets;
    std::vector<uint32_t> returnOffsets;
  };

  /// What a name in a function body stands for.
  struct Binding {
    enum class Kind : uint8_t { Register, RegisterRange, Local, Shared, KernelParam, FrameParam, CallParam };
    Kind kind = Kind::Register;
    uint32_t slot = 0;    // Register; RegisterRange: the first slot
    uint32_t count = 0;   // RegisterRange
    uint64_t offset = 0;  // Local, FrameParam: in the thread's frame; Shared: in the block's shared memory
    uint32_t callParam = 0;
  };

  /// A `.param` declared in a call sequence: where it lives once the call
  /// binds it to the callee's parameter or return value, and the
  /// instructions that used it before (the st.param of the arguments).
  struct CallParam {
    bool bound = false;
    uint32_t offset = 0;
    std::vector<std::pair<uint32_t, int64_t>> uses;  // instruction index, displacement
  };

  struct FunctionState {
    const syntax::Function* function = nullptr;
    std::vector<std::unordered_map<std::string_view, Binding>> scopes;
    std::unordered_map<std::string_view, uint32_t> labels;
    std::vector<std::pair<uint32_t, std::string_view>> branchFixups;
    std::vector<CallParam> callParams;
    bool isEntry = false;
  };

  // ---- layout

  uint32_t newSlots(uint32_t n) {
    if (n > kMaxSlots || k_.slotCount > kMaxSlots - n)
      fail(line_, "more than " + std::to_string(kMaxSlots) + " registers and constants in kernel '" + k_.name + "'");
    const uint32_t first = k_.slotCount;
    k_.slotCount += n;
    return first;
  }
  /// Limits that keep a malformed module from exhausting host memory: a
  /// warp's register file is 32 * 8 bytes per slot.
  static constexpr uint32_t kMaxSlots = 1u << 18;
  static constexpr uint64_t kMaxLocalBytes = 512 * 1024;  // CUDA's per-thread limit
  static constexpr uint64_t kMaxParamBytes = 32764;       // CUDA's limit for kernel parameters

  uint32_t constant(uint64_t value) {
    auto it = constants_.find(value);
    if (it != constants_.end()) return it->second;
    const uint32_t slot = newSlots(1);
    k_.constants.push_back({slot, value, -1});
    constants_[value] = slot;
    return slot;
  }

  uint32_t variableAddress(size_t variable, int64_t offset) {
    auto key = std::make_pair(variable, offset);
    auto it = variableSlots_.find(key);
    if (it != variableSlots_.end()) return it->second;
    const uint32_t slot = newSlots(1);
    k_.constants.push_back({slot, static_cast<uint64_t>(offset), static_cast<int32_t>(variable)});
    variableSlots_[key] = slot;
    return slot;
  }

  uint32_t allocateLocal(uint64_t bytes, uint32_t align) {
    align = std::max<uint32_t>(align, 1);
    if (bytes > kMaxLocalBytes || localBytes_ + bytes + align > kMaxLocalBytes)
      fail(line_, "more than " + std::to_string(kMaxLocalBytes) + " bytes of local memory per thread");
    localBytes_ = (localBytes_ + align - 1) / align * align;
    const uint32_t offset = localBytes_;
    localBytes_ += static_cast<uint32_t>(bytes);
    return offset;
  }

  /// The offset of module-level shared variable `d` in this kernel's
  /// shared memory, laid out on first use.
  uint64_t sharedOffset(const Declaration& d, uint32_t line) {
    auto it = sharedOffsets_.find(d.name);
    if (it != sharedOffsets_.end()) return it->second;
    const uint32_t align = std::max<uint32_t>(d.align ? d.align : static_cast<uint32_t>(typeBytes(d.type)), 1);
    if (d.isExtern || (d.isArray && d.arrayCount == 0)) {
      k_.dynamicSharedAlign = std::max(k_.dynamicSharedAlign, align);
      sharedOffsets_[d.name] = kDynamicShared;
      return kDynamicShared;
    }
    k_.staticSharedBytes = (k_.staticSharedBytes + align - 1) / align * align;
    const uint64_t offset = k_.staticSharedBytes;
    if (d.bytes() > (1u << 24) || k_.staticSharedBytes + d.bytes() > (1u << 24))
      fail(line, "shared variable '" + std::string(d.name) + "' is too large");
    k_.staticSharedBytes += static_cast<uint32_t>(d.bytes());
    sharedOffsets_[d.name] = offset;
    return offset;
  }
  static constexpr uint64_t kDynamicShared = ~0ull;

  uint32_t specialSlot(Special s) {
    for (auto& [slot, special] : k_.specials)
      if (special == s) return slot;
    const uint32_t slot = newSlots(1);
    k_.specials.push_back({slot, s});
    return slot;
  }

  Instance* instanceOf(const syntax::Function& f) {
    auto it = instances_.find(f.name);
    if (it != instances_.end()) return it->second.get();
    auto instance = std::make_unique<Instance>();
    instance->function = &f;
    for (const Declaration& p : f.params)
      instance->paramOffsets.push_back(
          allocateLocal(p.bytes(), p.align ? p.align : static_cast<uint32_t>(typeBytes(p.type))));
    for (const Declaration& r : f.returns)
      instance->returnOffsets.push_back(
          allocateLocal(r.bytes(), r.align ? r.align : static_cast<uint32_t>(typeBytes(r.type))));
    Instance* result = instance.get();
    instances_[f.name] = std::move(instance);
    pending_.push_back(result);
    return result;
  }

  uint32_t callDepth(const syntax::Function& f) {
    auto it = depths_.find(f.name);
    if (it != depths_.end()) return it->second;
    depths_[f.name] = 0;
    uint32_t deepest = 0;
    for (const syntax::Statement& s : f.body) {
      if (s.kind != syntax::Statement::Kind::Instruction || Modifiers(s.instruction.opcode).base != "call") continue;
      auto callee = functions_.find(s.instruction.operands[0].name);
      if (callee != functions_.end()) deepest = std::max(deepest, 1 + callDepth(module_.functions[callee->second]));
    }
    depths_[f.name] = deepest;
    return deepest;
  }

  // ---- names

  const Binding* lookup(std::string_view name) {
    for (auto scope = state_->scopes.rbegin(); scope != state_->scopes.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return &it->second;
    }
    // %r12 in a %r<N> range.
    size_t digits = name.size();
    while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
    if (digits == name.size() || digits == 0) return nullptr;
    const std::string_view prefix = name.substr(0, digits);
    const std::string_view number = name.substr(digits);
    if (number.size() > 1 && number[0] == '0') return nullptr;
    uint64_t index = 0;
    for (char c : number) index = index * 10 + static_cast<uint64_t>(c - '0');
    for (auto scope = state_->scopes.rbegin(); scope != state_->scopes.rend(); ++scope) {
      auto it = scope->find(prefix);
      if (it != scope->end() && it->second.kind == Binding::Kind::RegisterRange) {
        if (index >= it->second.count) return nullptr;
        rangeBinding_ = Binding{Binding::Kind::Register, it->second.slot + static_cast<uint32_t>(index), 0, 0, 0};
        return &rangeBinding_;
      }
    }
    return nullptr;
  }

  static bool special(std::string_view name, Special& out) {
    static const struct {
      const char* name;
      Special special;
    } kSpecials[] = {
        {"%tid.x", Special::TidX},
        {"%tid.y", Special::TidY},
        {"%tid.z", Special::TidZ},
        {"%ntid.x", Special::NtidX},
        {"%ntid.y", Special::NtidY},
        {"%ntid.z", Special::NtidZ},
        {"%ctaid.x", Special::CtaidX},
        {"%ctaid.y", Special::CtaidY},
        {"%ctaid.z", Special::CtaidZ},
        {"%nctaid.x", Special::NctaidX},
        {"%nctaid.y", Special::NctaidY},
        {"%nctaid.z", Special::NctaidZ},
        {"%laneid", Special::LaneId},
        {"%warpid", Special::WarpId},
        {"%nwarpid", Special::NWarpId},
        {"%smid", Special::SmId},
        {"%nsmid", Special::NSmId},
        {"%gridid", Special::GridIdLow},
        {"%lanemask_eq", Special::LanemaskEq},
        {"%lanemask_lt", Special::LanemaskLt},
        {"%lanemask_le", Special::LanemaskLe},
        {"%lanemask_gt", Special::LanemaskGt},
        {"%lanemask_ge", Special::LanemaskGe},
        {"%clock", Special::Clock},
        {"%clock64", Special::Clock64},
        {"%globaltimer", Special::GlobalTimer},
        {"%dynamic_smem_size", Special::DynamicSmemSize},
        {"%total_smem_size", Special::TotalSmemSize},
    };
    for (const auto& s : kSpecials)
      if (name == s.name) {
        out = s.special;
        return true;
      }
    return false;
  }

  /// The slot of register operand `o` (a sink gets a scratch slot).
  uint32_t reg(const Operand& o) {
    if (o.kind == OperandKind::Sink) return scratchSlot();
    if (o.kind == OperandKind::Symbol && isRegister(o.name) && o.offset == 0) return regByName(o.name);
    if (o.kind != OperandKind::Register) fail(line_, "expected a register, found '" + describe(o) + "'");
    return regByName(o.name);
  }

  /// Register names need not start with '%' (`.reg .b16 tmp;`).
  bool isRegister(std::string_view name) {
    const Binding* b = lookup(name);
    return b && b->kind == Binding::Kind::Register;
  }

  uint32_t regByName(std::string_view name) {
    if (const Binding* b = lookup(name)) {
      if (b->kind != Binding::Kind::Register) fail(line_, "'" + std::string(name) + "' is not a register");
      return b->slot;
    }
    Special s;
    if (special(name, s)) return specialSlot(s);
    if (name.rfind("%envreg", 0) == 0 || name.rfind("%pm", 0) == 0)
      fail(line_, "special register '" + std::string(name) + "' is not implemented");
    fail(line_, "undeclared register '" + std::string(name) + "'");
  }

  uint32_t scratchSlot() {
    if (scratch_ == kNoSlot) scratch_ = newSlots(1);
    return scratch_;
  }

  /// An operand read as `type`: a register, an immediate (a constant slot
  /// with the value's bits as `type`), or a variable's address.
  uint32_t value(const Operand& o, PtxType type) {
    switch (o.kind) {
      case OperandKind::Register:
      case OperandKind::Sink: return reg(o);
      case OperandKind::Immediate: return constant(immediateBits(o, type));
      case OperandKind::Symbol: return isRegister(o.name) && o.offset == 0 ? regByName(o.name) : symbolAddress(o);
      default: fail(line_, "unexpected operand '" + describe(o) + "'");
    }
  }

  uint64_t immediateBits(const Operand& o, PtxType type) {
    if (type == PtxType::F32 || type == PtxType::F64) {
      double v;
      float f;
      switch (o.literal) {
        case Operand::Literal::Int: v = static_cast<double>(static_cast<int64_t>(o.bits)); break;
        case Operand::Literal::F32: {
          const uint32_t b = static_cast<uint32_t>(o.bits);
          std::memcpy(&f, &b, 4);
          if (type == PtxType::F32) return b;
          v = f;
          break;
        }
        case Operand::Literal::F64:
          if (type == PtxType::F64) return o.bits;
          std::memcpy(&v, &o.bits, 8);
          break;
      }
      if (type == PtxType::F32) {
        f = static_cast<float>(v);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        return b;
      }
      uint64_t b;
      std::memcpy(&b, &v, 8);
      return b;
    }
    if (type == PtxType::Pred) return o.bits != 0;
    if (o.literal != Operand::Literal::Int) {
      // A float literal where bits are expected (mov.b32 %r, 0f3F800000).
      return o.bits;
    }
    return o.bits;
  }

  /// The address `mov` or an address operand gives a symbol: a module
  /// variable's device address, a shared offset, a local offset, a kernel
  /// parameter's offset.
  uint32_t symbolAddress(const Operand& o) {
    if (const Binding* b = lookup(o.name)) {
      switch (b->kind) {
        case Binding::Kind::Local:
        case Binding::Kind::FrameParam: return constant(b->offset + static_cast<uint64_t>(o.offset));
        case Binding::Kind::Shared: return sharedAddress(b->offset, o.offset);
        default: fail(line_, "the address of '" + std::string(o.name) + "' is not implemented");
      }
    }
    auto param = kernelParams_.find(o.name);
    if (param != kernelParams_.end() && state_->isEntry)
      return constant(param->second + static_cast<uint64_t>(o.offset));
    auto variable = variables_.find(o.name);
    if (variable != variables_.end()) {
      const Declaration& d = module_.variables[variable->second];
      if (d.kind == Declaration::Kind::Shared) return sharedAddress(sharedOffset(d, line_), o.offset);
      return variableAddress(variable->second, o.offset);
    }
    fail(line_, "unknown symbol '" + std::string(o.name) + "'");
  }

  uint32_t sharedAddress(uint64_t offset, int64_t displacement) {
    if (offset == kDynamicShared) {
      // Patched once the static shared size is known.
      const uint32_t slot = newSlots(1);
      k_.constants.push_back({slot, static_cast<uint64_t>(displacement), -1});
      dynamicSharedSlots_.push_back(slot);
      return slot;
    }
    return constant(offset + static_cast<uint64_t>(displacement));
  }

  std::string describe(const Operand& o) {
    switch (o.kind) {
      case OperandKind::Register:
      case OperandKind::Symbol:
      case OperandKind::Sink: return std::string(o.name);
      case OperandKind::Immediate: return std::to_string(o.bits);
      case OperandKind::Address: return "[" + std::string(o.name) + "]";
      case OperandKind::Vector: return "{...}";
    }
    return "?";
  }

  // ---- addresses

  /// Fills `in.addr`, `in.offset` and `in.space` from address operand `o`
  /// of an instruction in state space `space`.
  void address(Instruction& in, const Operand& o, Space space) {
    if (o.kind != OperandKind::Address) fail(line_, "expected an address, found '" + describe(o) + "'");
    in.space = space;
    in.offset = o.offset;
    if (o.name.empty()) {
      in.addr = zeroSlot_;
      return;
    }
    if (o.name[0] == '%' || isRegister(o.name)) {
      in.addr = regByName(o.name);
      return;
    }
    in.addr = zeroSlot_;
    if (const Binding* b = lookup(o.name)) {
      switch (b->kind) {
        case Binding::Kind::Local:
        case Binding::Kind::FrameParam:
          in.space = Space::Local;
          in.offset += static_cast<int64_t>(b->offset);
          return;
        case Binding::Kind::CallParam: {
          in.space = Space::Local;
          CallParam& p = state_->callParams[b->callParam];
          if (p.bound) {
            in.offset += p.offset;
          } else {
            p.uses.push_back({static_cast<uint32_t>(k_.code.size()), in.offset});
          }
          return;
        }
        case Binding::Kind::Shared:
          if (space == Space::Generic) {
            in.addr = sharedAddress(b->offset, 0);
            in.space = Space::Shared;
            return;
          }
          in.space = Space::Shared;
          in.offset += static_cast<int64_t>(b->offset);
          return;
        default: fail(line_, "'" + std::string(o.name) + "' is not an address");
      }
    }
    auto param = kernelParams_.find(o.name);
    if (param != kernelParams_.end() && state_->isEntry) {
      in.space = Space::Param;
      in.offset += param->second;
      return;
    }
    auto variable = variables_.find(o.name);
    if (variable == variables_.end()) fail(line_, "unknown symbol '" + std::string(o.name) + "' in an address");
    const Declaration& d = module_.variables[variable->second];
    if (d.kind == Declaration::Kind::Shared) {
      in.space = Space::Shared;
      in.addr = sharedAddress(sharedOffset(d, line_), 0);
      return;
    }
    in.addr = variableAddress(variable->second, 0);
    if (in.space == Space::Generic || in.space == Space::Const) in.space = Space::Global;
  }

  static Space takeSpace(Modifiers& m) {
    switch (m.takeOneOf({".global", ".shared", ".local", ".param", ".const", ".generic", ".shared::cta"})) {
      case 0: return Space::Global;
      case 1: return Space::Shared;
      case 2: return Space::Local;
      case 3: return Space::Param;
      case 4: return Space::Const;
      case 6: return Space::Shared;
      default: return Space::Generic;
    }
  }

  // ---- functions

  void decodeFunction(const syntax::Function& f, Instance* instance) {
    FunctionState state;
    state.function = &f;
    state.isEntry = instance == nullptr;
    state.scopes.emplace_back();
    state_ = &state;
    if (instance) {
      instance->entryPc = static_cast<uint32_t>(k_.code.size());
      for (size_t i = 0; i < f.params.size(); ++i) {
        Binding b{Binding::Kind::FrameParam, 0, 0, instance->paramOffsets[i], 0};
        state.scopes[0][f.params[i].name] = b;
      }
      for (size_t i = 0; i < f.returns.size(); ++i) {
        Binding b{Binding::Kind::FrameParam, 0, 0, instance->returnOffsets[i], 0};
        state.scopes[0][f.returns[i].name] = b;
      }
    }
    for (const syntax::Statement& s : f.body) {
      line_ = s.line;
      switch (s.kind) {
        case syntax::Statement::Kind::OpenScope: state.scopes.emplace_back(); break;
        case syntax::Statement::Kind::CloseScope: state.scopes.pop_back(); break;
        case syntax::Statement::Kind::Label:
          if (!state.labels.emplace(s.label, static_cast<uint32_t>(k_.code.size())).second)
            fail(s.line, "label '" + std::string(s.label) + "' defined twice");
          break;
        case syntax::Statement::Kind::Declaration: declare(s.declaration); break;
        case syntax::Statement::Kind::Instruction: decodeInstruction(s.instruction); break;
      }
    }
    // Falling off the end of a function returns.
    Instruction end;
    end.op = state.isEntry ? Opcode::Exit : Opcode::Ret;
    end.line = line_;
    emit(end, "ret (end of function)");
    for (auto& [index, label] : state.branchFixups) {
      auto it = state.labels.find(label);
      if (it == state.labels.end()) fail(k_.code[index].line, "unknown label '" + std::string(label) + "'");
      k_.code[index].offset = it->second;
    }
    for (const CallParam& p : state.callParams)
      if (!p.uses.empty() && !p.bound) fail(line_, "a call parameter is used but never passed to a call");
    state_ = nullptr;
  }

  void declare(const Declaration& d) {
    auto& scope = state_->scopes.back();
    switch (d.kind) {
      case Declaration::Kind::Register:
        if (d.type == PtxType::None) fail(d.line, "register without a type");
        if (d.isArray) fail(d.line, "register arrays are not implemented");
        if (d.rangeCount) {
          scope[d.name] = Binding{Binding::Kind::RegisterRange, newSlots(d.rangeCount), d.rangeCount, 0, 0};
        } else {
          scope[d.name] = Binding{Binding::Kind::Register, newSlots(1), 0, 0, 0};
        }
        break;
      case Declaration::Kind::Local: {
        const uint32_t align = d.align ? d.align : static_cast<uint32_t>(typeBytes(d.type));
        scope[d.name] = Binding{Binding::Kind::Local, 0, 0, allocateLocal(d.bytes(), align), 0};
        break;
      }
      case Declaration::Kind::Shared:
        scope[d.name] = Binding{Binding::Kind::Shared, 0, 0, sharedOffset(d, d.line), 0};
        break;
      case Declaration::Kind::Param: {
        scope[d.name] = Binding{Binding::Kind::CallParam, 0, 0, 0, static_cast<uint32_t>(state_->callParams.size())};
        state_->callParams.emplace_back();
        break;
      }
      default: fail(d.line, "unexpected declaration in a function body");
    }
  }

  /// Appends `in`, keeping its text (whitespace runs collapsed) for fault
  /// messages.
  void emit(const Instruction& in, std::string_view text) {
    k_.code.push_back(in);
    std::string clean;
    for (char c : text) {
      const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
      if (!space) {
        clean += c;
      } else if (!clean.empty() && clean.back() != ' ') {
        clean += ' ';
      }
    }
    while (!clean.empty() && clean.back() == ' ') clean.pop_back();
    k_.text.push_back(std::move(clean));
  }

  // ---- instructions

  void decodeInstruction(const syntax::Instruction& s) {
    Modifiers m(s.opcode);
    Instruction in;
    in.line = s.line;
    if (!s.guard.empty()) {
      in.guard = regByName(s.guard);
      if (s.guardNegated) in.flags |= kNegGuard;
    }
    const std::string_view base = m.base;
    const auto& ops = s.operands;
    // A negated predicate operand (!%p) is implemented for setp's combining
    // operand and vote's operand only; anywhere else it is refused, never
    // read as %p.
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool allowed = ((base == "setp" || base == "set") && i == 3) || (base == "vote" && i == 1);
      if (ops[i].negated && !allowed)
        fail(s.line, "a negated operand of '" + std::string(s.opcode) + "' is not implemented");
    }
    auto need = [&](size_t n) {
      if (ops.size() != n)
        fail(s.line, "'" + std::string(s.opcode) + "' takes " + std::to_string(n) + " operands, found " +
                         std::to_string(ops.size()));
    };
    auto finish = [&]() {
      if (!m.empty())
        fail(s.line, "modifier '" + std::string(m.first()) + "' of '" + std::string(s.opcode) + "' is not implemented");
    };
    auto unsupported = [&](const std::string& what) -> void {
      fail(s.line, "'" + std::string(s.opcode) + "' is not implemented" + (what.empty() ? "" : " (" + what + ")"));
    };
    auto oneType = [&]() {
      std::vector<PtxType> types = m.takeTypes();
      if (types.size() != 1) unsupported("expected one type");
      return types[0];
    };
    auto rounding = [&]() {
      int r = m.takeOneOf({".rn", ".rz", ".rm", ".rp", ".rni", ".rzi", ".rmi", ".rpi"});
      return r < 0 ? Rounding::Default : static_cast<Rounding>(r + 1);
    };
    // Float arithmetic: f32 and f64 only (Kiln computes f16 and bf16 in f32).
    auto floatType = [&](PtxType t) {
      if (!isF32OrF64(t)) unsupported(std::string(".") + typeName(t) + " arithmetic");
    };
    auto intType = [&](PtxType t) {
      if (!isIntType(t)) unsupported(std::string(".") + typeName(t));
    };
    auto binary = [&](Opcode op, PtxType t) {
      need(3);
      in.op = op;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], t);
    };
    auto unary = [&](Opcode op, PtxType t) {
      need(2);
      in.op = op;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
    };
    auto ternary = [&](Opcode op, PtxType t, PtxType thirdType) {
      need(4);
      in.op = op;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], t);
      in.src[2] = value(ops[3], thirdType);
    };
    auto floatFlags = [&]() {
      if (m.take(".ftz")) in.flags |= kFtz;
      if (m.take(".sat")) in.flags |= kSat;
    };

    if (base == "mov") {
      const PtxType t = oneType();
      finish();
      need(2);
      in.type = t;
      if (ops[0].kind == OperandKind::Vector) {
        in.op = Opcode::MovUnpack;
        if (ops[0].elements.size() != 2 && ops[0].elements.size() != 4)
          unsupported("vector of " + std::to_string(ops[0].elements.size()));
        in.vector = static_cast<uint8_t>(ops[0].elements.size());
        for (size_t i = 0; i < in.vector; ++i) in.dst[i] = reg(ops[0].elements[i]);
        in.src[0] = value(ops[1], t);
      } else if (ops[1].kind == OperandKind::Vector) {
        in.op = Opcode::MovPack;
        if (ops[1].elements.size() != 2 && ops[1].elements.size() != 4)
          unsupported("vector of " + std::to_string(ops[1].elements.size()));
        in.vector = static_cast<uint8_t>(ops[1].elements.size());
        in.dst[0] = reg(ops[0]);
        const PtxType part = in.vector == 2 ? (t == PtxType::B64 ? PtxType::B32 : PtxType::B16) : PtxType::B16;
        for (size_t i = 0; i < in.vector; ++i) in.src[i] = value(ops[1].elements[i], part);
      } else {
        in.op = Opcode::Mov;
        in.dst[0] = reg(ops[0]);
        in.src[0] = value(ops[1], t);
      }
    } else if (base == "ld" || base == "ldu" || base == "st") {
      const bool store = base == "st";
      Space space = takeSpace(m);
      if (base == "ldu" && space == Space::Generic) space = Space::Global;
      m.dropMemoryHints();
      const int vector = m.takeOneOf({".v2", ".v4"});
      in.vector = vector < 0 ? 1 : (vector == 0 ? 2 : 4);
      const PtxType t = oneType();
      finish();
      if (t == PtxType::Pred || t == PtxType::F16x2 || t == PtxType::BF16x2) unsupported("");
      need(2);
      in.type = t;
      in.op = store ? Opcode::St : Opcode::Ld;
      const Operand& addr = store ? ops[0] : ops[1];
      const Operand& data = store ? ops[1] : ops[0];
      address(in, addr, space);
      if (in.space == Space::Param && in.addr == zeroSlot_ && !addr.name.empty() && addr.name[0] != '%' &&
          !isRegister(addr.name)) {
        if (store) unsupported("st.param to a kernel parameter");
        in.op = Opcode::LdParam;
      }
      if (in.space == Space::Const) in.space = Space::Global;
      if (in.vector > 1) {
        if (data.kind != OperandKind::Vector || data.elements.size() != in.vector) unsupported("vector operand");
        for (size_t i = 0; i < in.vector; ++i)
          (store ? in.src[i] : in.dst[i]) = store ? value(data.elements[i], t) : reg(data.elements[i]);
      } else if (store) {
        in.src[0] = value(data, t);
      } else {
        in.dst[0] = reg(data);
      }
    } else if (base == "cvt") {
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      if (m.take(".relu") || m.take(".satfinite")) unsupported("");
      std::vector<PtxType> types = m.takeTypes();
      finish();
      if (types.size() != 2) unsupported("expected two types");
      for (PtxType t : types)
        if (t == PtxType::Pred || t == PtxType::F16x2 || t == PtxType::BF16x2 || isBitType(t)) unsupported(typeName(t));
      unary(Opcode::Cvt, types[0]);
      in.srcType = types[1];
      in.src[0] = value(ops[1], types[1]);
      const Rounding r = static_cast<Rounding>(in.mode);
      const bool toInt = !isFloat(types[0]), fromInt = !isFloat(types[1]);
      if (toInt && !fromInt && (r == Rounding::Rn || r == Rounding::Rz || r == Rounding::Rm || r == Rounding::Rp))
        unsupported("float to integer needs an integer rounding (.rni .rzi .rmi .rpi)");
      if (toInt && !fromInt && r == Rounding::Default) unsupported("float to integer needs a rounding modifier");
    } else if (base == "cvta") {
      in.toGeneric = !m.take(".to");
      in.space = takeSpace(m);
      const PtxType t = oneType();
      finish();
      if (t != PtxType::U64 && t != PtxType::U32) unsupported("");
      if (in.space == Space::Generic) unsupported("");
      unary(Opcode::Cvta, t);
    } else if (base == "add" || base == "sub") {
      const bool isAdd = base == "add";
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      const bool carry = m.take(".cc");
      const PtxType t = oneType();
      finish();
      if (isFloat(t)) {
        floatType(t);
        binary(isAdd ? Opcode::FAdd : Opcode::FSub, t);
      } else {
        intType(t);
        if ((in.flags & kSat) && t != PtxType::S32) unsupported(".sat");
        if (carry) {
          if (typeBytes(t) < 4) unsupported(".cc");
          in.flags |= kCarryOut;
          binary(isAdd ? Opcode::AddCarry : Opcode::SubCarry, t);
          in.src[2] = carrySlot();
          in.dst[1] = carrySlot();
        } else {
          binary(isAdd ? Opcode::Add : Opcode::Sub, t);
        }
      }
    } else if (base == "addc" || base == "subc") {
      const bool carryOut = m.take(".cc");
      const PtxType t = oneType();
      finish();
      intType(t);
      if (typeBytes(t) < 4) unsupported("");
      binary(base == "addc" ? Opcode::AddCarry : Opcode::SubCarry, t);
      in.flags |= kCarryIn | (carryOut ? kCarryOut : 0);
      in.src[2] = carrySlot();
      in.dst[1] = carrySlot();
    } else if (base == "mul" || base == "mad" || base == "madc") {
      const bool isMad = base != "mul";
      const int part = m.takeOneOf({".lo", ".hi", ".wide"});
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      const bool carryOut = isMad && m.take(".cc");
      const PtxType t = oneType();
      finish();
      if (carryOut || base == "madc") {
        // Extended-precision multiply-add: mad{c}.lo/hi{.cc}, 32 and 64 bits.
        if ((part != 0 && part != 1) || !isIntType(t) || typeBytes(t) < 4) unsupported("");
        ternary(part == 0 ? Opcode::MadLo : Opcode::MadHi, t, t);
        in.flags |= (base == "madc" ? kCarryIn : 0) | (carryOut ? kCarryOut : 0);
        in.src[3] = carrySlot();
        in.dst[1] = carrySlot();
        emit(in, s.text);
        return;
      }
      if (isFloat(t)) {
        floatType(t);
        if (part >= 0) unsupported("");
        if (isMad) {
          ternary(Opcode::Fma, t, t);
        } else {
          binary(Opcode::FMul, t);
        }
      } else {
        intType(t);
        if (part < 0) unsupported("needs .lo, .hi or .wide");
        if (part == 2 && typeBytes(t) == 8) unsupported(".wide of 64-bit operands");
        if ((in.flags & kSat) && !(isMad && part == 1 && t == PtxType::S32)) unsupported(".sat");
        static const Opcode kMul[] = {Opcode::MulLo, Opcode::MulHi, Opcode::MulWide};
        static const Opcode kMad[] = {Opcode::MadLo, Opcode::MadHi, Opcode::MadWide};
        if (isMad) {
          ternary(kMad[part], t, part == 2 ? wideType(t) : t);
        } else {
          binary(kMul[part], t);
        }
      }
    } else if (base == "mul24" || base == "mad24") {
      if (!m.take(".lo")) unsupported("only .lo");
      const PtxType t = oneType();
      finish();
      if (t != PtxType::U32 && t != PtxType::S32) unsupported("");
      if (base == "mul24") {
        binary(Opcode::Mul24Lo, t);
      } else {
        ternary(Opcode::Mad24Lo, t, t);
      }
    } else if (base == "sad") {
      const PtxType t = oneType();
      finish();
      intType(t);
      ternary(Opcode::Sad, t, isSignedInt(t) ? unsignedOf(t) : t);
    } else if (base == "fma") {
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      const PtxType t = oneType();
      finish();
      floatType(t);
      if (in.mode == static_cast<uint8_t>(Rounding::Default)) unsupported("fma needs a rounding modifier");
      ternary(Opcode::Fma, t, t);
    } else if (base == "div") {
      const bool approx = m.take(".approx");
      const bool full = m.take(".full");
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      const PtxType t = oneType();
      finish();
      if (isFloat(t)) {
        floatType(t);
        if (!approx && !full && in.mode == static_cast<uint8_t>(Rounding::Default))
          unsupported("needs .rn, .approx or .full");
        if (approx || full) in.mode = static_cast<uint8_t>(Rounding::Rn);
        binary(Opcode::FDiv, t);
      } else {
        intType(t);
        binary(Opcode::Div, t);
      }
    } else if (base == "rem") {
      const PtxType t = oneType();
      finish();
      intType(t);
      binary(Opcode::Rem, t);
    } else if (base == "abs" || base == "neg") {
      floatFlags();
      const PtxType t = oneType();
      finish();
      if (isFloat(t)) {
        floatType(t);
        unary(base == "abs" ? Opcode::FAbs : Opcode::FNeg, t);
      } else {
        if (!isSignedInt(t)) unsupported("");
        unary(base == "abs" ? Opcode::Abs : Opcode::Neg, t);
      }
    } else if (base == "min" || base == "max") {
      floatFlags();
      if (m.take(".NaN")) in.flags |= kNanMode;
      const PtxType t = oneType();
      finish();
      if (isFloat(t)) {
        floatType(t);
        binary(base == "min" ? Opcode::FMin : Opcode::FMax, t);
      } else {
        intType(t);
        if (isBitType(t)) unsupported("");
        binary(base == "min" ? Opcode::Min : Opcode::Max, t);
      }
    } else if (base == "rcp" || base == "sqrt" || base == "rsqrt" || base == "ex2" || base == "lg2" || base == "sin" ||
               base == "cos" || base == "tanh") {
      const bool approx = m.take(".approx");
      in.mode = static_cast<uint8_t>(rounding());
      floatFlags();
      const PtxType t = oneType();
      finish();
      floatType(t);
      const bool roundable = base == "rcp" || base == "sqrt";
      if (!approx && !(roundable && in.mode != static_cast<uint8_t>(Rounding::Default)))
        unsupported("needs .approx or a rounding modifier");
      if (approx) in.mode = static_cast<uint8_t>(Rounding::Rn);
      if (t == PtxType::F64 && (base == "ex2" || base == "lg2" || base == "sin" || base == "cos" || base == "tanh"))
        unsupported("");
      Opcode op = base == "rcp"     ? Opcode::Rcp
                  : base == "sqrt"  ? Opcode::Sqrt
                  : base == "rsqrt" ? Opcode::Rsqrt
                  : base == "ex2"   ? Opcode::Ex2
                  : base == "lg2"   ? Opcode::Lg2
                  : base == "sin"   ? Opcode::Sin
                  : base == "cos"   ? Opcode::Cos
                                    : Opcode::Tanh;
      unary(op, t);
    } else if (base == "copysign") {
      const PtxType t = oneType();
      finish();
      floatType(t);
      binary(Opcode::Copysign, t);
    } else if (base == "testp") {
      const int mode = m.takeOneOf({".finite", ".infinite", ".number", ".notanumber", ".normal", ".subnormal"});
      const PtxType t = oneType();
      finish();
      floatType(t);
      if (mode < 0) unsupported("");
      unary(Opcode::Testp, t);
      in.mode = static_cast<uint8_t>(mode);
    } else if (base == "and" || base == "or" || base == "xor") {
      const PtxType t = oneType();
      finish();
      if (t != PtxType::Pred && !isBitType(t)) unsupported("");
      if (t == PtxType::B8) unsupported("");
      binary(base == "and" ? Opcode::And : base == "or" ? Opcode::Or : Opcode::Xor, t);
    } else if (base == "not" || base == "cnot") {
      const PtxType t = oneType();
      finish();
      if (t != PtxType::Pred && !isBitType(t)) unsupported("");
      if (base == "cnot" && t == PtxType::Pred) unsupported("");
      unary(base == "not" ? Opcode::Not : Opcode::Cnot, t);
    } else if (base == "shl" || base == "shr") {
      const PtxType t = oneType();
      finish();
      intType(t);
      if (base == "shl" && !isBitType(t)) unsupported("");
      need(3);
      in.op = base == "shl" ? Opcode::Shl : Opcode::Shr;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], PtxType::U32);
    } else if (base == "shf") {
      // Funnel shift of the 64-bit b:a, mode bit 0: right, bit 1: clamp.
      const int direction = m.takeOneOf({".l", ".r"});
      const int mode = m.takeOneOf({".wrap", ".clamp"});
      const PtxType t = oneType();
      finish();
      if (direction < 0 || mode < 0 || t != PtxType::B32) unsupported("");
      ternary(Opcode::Shf, t, PtxType::U32);
      in.mode = static_cast<uint8_t>(direction | (mode << 1));
    } else if (base == "dp4a" || base == "dp2a") {
      // Dot products of bytes (dp4a) or of halves with bytes (dp2a); mode
      // bit 0: a signed, bit 1: b signed, bit 2: dp2a's .hi.
      const int half = base == "dp2a" ? m.takeOneOf({".lo", ".hi"}) : 0;
      std::vector<PtxType> types = m.takeTypes();
      finish();
      if (half < 0 || types.size() != 2) unsupported("");
      for (PtxType t : types)
        if (t != PtxType::U32 && t != PtxType::S32) unsupported(typeName(t));
      const bool anySigned = isSignedInt(types[0]) || isSignedInt(types[1]);
      ternary(base == "dp4a" ? Opcode::Dp4a : Opcode::Dp2a, PtxType::U32, anySigned ? PtxType::S32 : PtxType::U32);
      in.mode = static_cast<uint8_t>((isSignedInt(types[0]) ? 1 : 0) | (isSignedInt(types[1]) ? 2 : 0) | (half << 2));
    } else if (base == "bfe") {
      const PtxType t = oneType();
      finish();
      if (t != PtxType::U32 && t != PtxType::S32 && t != PtxType::U64 && t != PtxType::S64) unsupported("");
      ternary(Opcode::Bfe, t, PtxType::U32);
      in.src[1] = value(ops[2], PtxType::U32);
    } else if (base == "bfi") {
      const PtxType t = oneType();
      finish();
      if (t != PtxType::B32 && t != PtxType::B64) unsupported("");
      need(5);
      in.op = Opcode::Bfi;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], t);
      in.src[2] = value(ops[3], PtxType::U32);
      in.src[3] = value(ops[4], PtxType::U32);
    } else if (base == "prmt") {
      const int mode = m.takeOneOf({".f4e", ".b4e", ".rc8", ".ecl", ".ecr", ".rc16"});
      const PtxType t = oneType();
      finish();
      if (t != PtxType::B32) unsupported("");
      ternary(Opcode::Prmt, t, PtxType::B32);
      in.mode = static_cast<uint8_t>(mode + 1);
    } else if (base == "popc" || base == "clz" || base == "brev" || base == "bfind") {
      const bool shiftAmount = base == "bfind" && m.take(".shiftamt");
      const PtxType t = oneType();
      finish();
      if (base == "bfind" ? (t != PtxType::U32 && t != PtxType::S32 && t != PtxType::U64 && t != PtxType::S64)
                          : (t != PtxType::B32 && t != PtxType::B64))
        unsupported("");
      unary(base == "popc"   ? Opcode::Popc
            : base == "clz"  ? Opcode::Clz
            : base == "brev" ? Opcode::Brev
                             : Opcode::Bfind,
            t);
      in.mode = shiftAmount;
    } else if (base == "setp" || base == "set") {
      const int cmp = m.takeOneOf({".eq", ".ne", ".lt", ".le", ".gt", ".ge", ".lo", ".ls", ".hi", ".hs", ".equ", ".neu",
                                   ".ltu", ".leu", ".gtu", ".geu", ".num", ".nan"});
      const int combine = m.takeOneOf({".and", ".or", ".xor"});
      floatFlags();
      std::vector<PtxType> types = m.takeTypes();
      finish();
      if (cmp < 0) unsupported("needs a comparison");
      const bool isSet = base == "set";
      if (types.size() != (isSet ? 2u : 1u)) unsupported("types");
      const PtxType t = types.back();
      if (isFloat(t)) {
        floatType(t);
      } else {
        intType(t);
        if (cmp >= static_cast<int>(Compare::Equ)) unsupported("unordered comparison of integers");
        if (isBitType(t) && cmp != static_cast<int>(Compare::Eq) && cmp != static_cast<int>(Compare::Ne))
          unsupported("ordered comparison of bits");
      }
      in.op = isSet ? Opcode::Set : Opcode::Setp;
      in.mode = static_cast<uint8_t>(cmp);
      in.mode2 = static_cast<uint8_t>(combine + 1);
      in.srcType = t;
      in.type = isSet ? types[0] : PtxType::Pred;
      if (isSet && types[0] != PtxType::U32 && types[0] != PtxType::S32 && types[0] != PtxType::F32) unsupported("");
      need(combine >= 0 ? 4 : 3);
      if (ops[0].kind != OperandKind::Register && !(ops[0].kind == OperandKind::Symbol && isRegister(ops[0].name)))
        unsupported("destination");
      in.dst[0] = regByName(ops[0].name);
      if (!ops[0].second.empty()) {
        if (isSet) unsupported("two destinations");
        in.dst[1] = regByName(ops[0].second);
        in.flags |= kDoubleDst;
      }
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], t);
      if (combine >= 0) {
        in.src[2] = value(ops[3], PtxType::Pred);
        if (ops[3].negated) in.flags |= kNegSrc;
      }
    } else if (base == "selp") {
      const PtxType t = oneType();
      finish();
      if (t == PtxType::Pred || t == PtxType::B8 || t == PtxType::U8 || t == PtxType::S8) unsupported("");
      ternary(Opcode::Selp, t, PtxType::Pred);
    } else if (base == "slct") {
      floatFlags();
      std::vector<PtxType> types = m.takeTypes();
      finish();
      if (types.size() != 2 || (types[1] != PtxType::S32 && types[1] != PtxType::F32)) unsupported("");
      ternary(Opcode::Slct, types[0], types[1]);
      in.srcType = types[1];
    } else if (base == "atom" || base == "red") {
      const bool isRed = base == "red";
      Space space = takeSpace(m);
      m.dropMemoryHints();
      const int op = m.takeOneOf({".add", ".min", ".max", ".exch", ".cas", ".inc", ".dec", ".and", ".or", ".xor"});
      m.take(".noftz");
      const PtxType t = oneType();
      finish();
      if (op < 0) unsupported("needs an operation");
      if (space != Space::Global && space != Space::Shared && space != Space::Generic) unsupported("state space");
      const AtomOp a = static_cast<AtomOp>(op);
      const bool bits =
          a == AtomOp::Exch || a == AtomOp::Cas || a == AtomOp::And || a == AtomOp::Or || a == AtomOp::Xor;
      const size_t bytes = typeBytes(t);
      if (bytes != 4 && bytes != 8) unsupported(typeName(t));
      if (isFloat(t) && a != AtomOp::Add && a != AtomOp::Exch) unsupported(typeName(t));
      if (!bits && isBitType(t)) unsupported(typeName(t));
      if ((a == AtomOp::Inc || a == AtomOp::Dec) && t != PtxType::U32) unsupported(typeName(t));
      in.op = Opcode::Atom;
      in.mode = static_cast<uint8_t>(op);
      in.type = t;
      size_t first = isRed ? 0 : 1;
      need(first + (a == AtomOp::Cas ? 3 : 2));
      if (!isRed) in.dst[0] = reg(ops[0]);
      address(in, ops[first], space);
      if (in.space == Space::Local || in.space == Space::Param) unsupported("state space");
      in.src[0] = value(ops[first + 1], t);
      if (a == AtomOp::Cas) in.src[1] = value(ops[first + 2], t);
    } else if (base == "shfl") {
      if (!m.take(".sync")) unsupported("only shfl.sync");
      const int mode = m.takeOneOf({".up", ".down", ".bfly", ".idx"});
      const PtxType t = oneType();
      finish();
      if (mode < 0 || t != PtxType::B32) unsupported("");
      need(5);
      in.op = Opcode::Shfl;
      in.mode = static_cast<uint8_t>(mode);
      in.type = t;
      in.dst[0] = reg(ops[0]);
      if (!ops[0].second.empty()) {
        in.dst[1] = regByName(ops[0].second);
        in.flags |= kDoubleDst;
      }
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], PtxType::U32);
      in.src[2] = value(ops[3], PtxType::U32);
      in.src[3] = value(ops[4], PtxType::U32);
      k_.usesWarpCollectives = true;
    } else if (base == "vote") {
      if (!m.take(".sync")) unsupported("only vote.sync");
      const int mode = m.takeOneOf({".all", ".any", ".uni", ".ballot"});
      const PtxType t = oneType();
      finish();
      if (mode < 0 || (mode == 3) != (t == PtxType::B32) || (mode != 3 && t != PtxType::Pred)) unsupported("");
      need(3);
      in.op = Opcode::Vote;
      in.mode = static_cast<uint8_t>(mode);
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], PtxType::Pred);
      if (ops[1].negated) in.flags |= kNegSrc;
      in.src[1] = value(ops[2], PtxType::U32);
      k_.usesWarpCollectives = true;
    } else if (base == "activemask") {
      const PtxType t = oneType();
      finish();
      if (t != PtxType::B32) unsupported("");
      need(1);
      in.op = Opcode::Activemask;
      in.type = t;
      in.dst[0] = reg(ops[0]);
      k_.usesWarpCollectives = true;
    } else if (base == "redux") {
      if (!m.take(".sync")) unsupported("");
      const int op = m.takeOneOf({".add", ".min", ".max", ".and", ".or", ".xor"});
      const PtxType t = oneType();
      finish();
      if (op < 0 || (t != PtxType::U32 && t != PtxType::S32 && t != PtxType::B32)) unsupported("");
      static const AtomOp kOps[] = {AtomOp::Add, AtomOp::Min, AtomOp::Max, AtomOp::And, AtomOp::Or, AtomOp::Xor};
      need(3);
      in.op = Opcode::Redux;
      in.mode = static_cast<uint8_t>(kOps[op]);
      in.type = t;
      in.dst[0] = reg(ops[0]);
      in.src[0] = value(ops[1], t);
      in.src[1] = value(ops[2], PtxType::U32);
      k_.usesWarpCollectives = true;
    } else if (base == "bar" || base == "barrier") {
      if (m.take(".warp")) {
        if (!m.take(".sync")) unsupported("");
        finish();
        need(1);
        in.op = Opcode::WarpSync;
        in.src[0] = value(ops[0], PtxType::U32);
      } else {
        const bool sync = m.take(".sync");
        m.take(".aligned");
        if (!sync && !(base == "bar" && m.empty())) unsupported("only bar.sync and barrier.sync");
        finish();
        if (ops.empty() || ops.size() > 2) unsupported("operands");
        in.op = Opcode::BarSync;
        in.src[0] = value(ops[0], PtxType::U32);
        if (ops.size() == 2) in.src[1] = value(ops[1], PtxType::U32);
        k_.usesBarrier = true;
      }
    } else if (base == "membar" || base == "fence") {
      m.take(".sc");
      m.take(".acq_rel");
      m.takeOneOf({".cta", ".gl", ".gpu", ".sys", ".cluster"});
      finish();
      in.op = Opcode::Nop;
    } else if (base == "nanosleep" || base == "prefetch" || base == "prefetchu" || base == "pmevent") {
      in.op = Opcode::Nop;
    } else if (base == "bra") {
      m.take(".uni");
      finish();
      need(1);
      if (ops[0].kind != OperandKind::Symbol) unsupported("indirect branch");
      in.op = Opcode::Bra;
      state_->branchFixups.push_back({static_cast<uint32_t>(k_.code.size()), ops[0].name});
    } else if (base == "ret") {
      m.take(".uni");
      finish();
      in.op = state_->isEntry ? Opcode::Exit : Opcode::Ret;
    } else if (base == "exit") {
      finish();
      in.op = Opcode::Exit;
    } else if (base == "trap") {
      finish();
      in.op = Opcode::Trap;
    } else if (base == "call") {
      m.take(".uni");
      finish();
      decodeCall(in, s);
      return;
    } else {
      fail(s.line, "unknown instruction '" + std::string(s.opcode) + "'");
    }
    emit(in, s.text);
  }

  uint32_t carrySlot() {
    if (carry_ == kNoSlot) carry_ = newSlots(1);
    return carry_;
  }

  static PtxType wideType(PtxType t) {
    switch (t) {
      case PtxType::U16: return PtxType::U32;
      case PtxType::S16: return PtxType::S32;
      case PtxType::U32: return PtxType::U64;
      case PtxType::S32: return PtxType::S64;
      default: return t;
    }
  }
  static PtxType unsignedOf(PtxType t) {
    switch (t) {
      case PtxType::S16: return PtxType::U16;
      case PtxType::S32: return PtxType::U32;
      case PtxType::S64: return PtxType::U64;
      default: return t;
    }
  }

  void decodeCall(Instruction& in, const syntax::Instruction& s) {
    const Operand& target = s.operands[0];
    if (target.kind != OperandKind::Symbol) fail(s.line, "indirect calls are not implemented");
    auto it = functions_.find(target.name);
    if (it == functions_.end()) fail(s.line, "call of unknown function '" + std::string(target.name) + "'");
    const syntax::Function& callee = module_.functions[it->second];
    if (!callee.defined) {
      fail(s.line, "call of external function '" + std::string(target.name) + "' (not implemented)");
    }
    if (onStack(callee)) fail(s.line, "recursive call of '" + std::string(target.name) + "' (not implemented)");
    if (s.callArguments.size() != callee.params.size() || s.callReturns.size() != callee.returns.size())
      fail(s.line, "call of '" + std::string(target.name) + "' with the wrong number of arguments");
    Instance* instance = instanceOf(callee);
    auto bind = [&](const Operand& o, uint32_t offset) {
      const Binding* b = o.kind == OperandKind::Symbol ? lookup(o.name) : nullptr;
      if (!b || b->kind != Binding::Kind::CallParam)
        fail(s.line, "call argument '" + describe(o) + "' is not a .param of the call sequence");
      CallParam& p = state_->callParams[b->callParam];
      p.bound = true;
      p.offset = offset;
      for (auto& [index, displacement] : p.uses) k_.code[index].offset = offset + displacement;
      p.uses.clear();
    };
    for (size_t i = 0; i < s.callArguments.size(); ++i) bind(s.callArguments[i], instance->paramOffsets[i]);
    for (size_t i = 0; i < s.callReturns.size(); ++i) bind(s.callReturns[i], instance->returnOffsets[i]);
    in.op = Opcode::Call;
    callFixups_.push_back({static_cast<uint32_t>(k_.code.size()), instance});
    emit(in, s.text);
  }

  /// Whether `f` calls, directly or not, the function being decoded' caller
  /// chain: with one frame per function, recursion cannot work.
  bool onStack(const syntax::Function& callee) {
    std::unordered_set<std::string_view> seen;
    std::function<bool(const syntax::Function&)> reaches = [&](const syntax::Function& f) {
      if (&f == state_->function) return true;
      if (!seen.insert(f.name).second) return false;
      for (const syntax::Statement& st : f.body) {
        if (st.kind != syntax::Statement::Kind::Instruction || Modifiers(st.instruction.opcode).base != "call")
          continue;
        auto it = functions_.find(st.instruction.operands[0].name);
        if (it != functions_.end() && reaches(module_.functions[it->second])) return true;
      }
      return false;
    };
    return reaches(callee) || &callee == &entry_;
  }

  const syntax::Module& module_;
  const std::unordered_map<std::string_view, size_t>& functions_;
  const std::unordered_map<std::string_view, size_t>& variables_;
  const syntax::Function& entry_;
  Kernel& k_;

  FunctionState* state_ = nullptr;
  uint32_t line_ = 0;
  uint32_t zeroSlot_ = 0;
  uint32_t scratch_ = kNoSlot;
  uint32_t carry_ = kNoSlot;
  uint32_t localBytes_ = 0;
  Binding rangeBinding_;
  std::unordered_map<std::string_view, uint32_t> kernelParams_;
  std::unordered_map<uint64_t, uint32_t> constants_;
  std::map<std::pair<size_t, int64_t>, uint32_t> variableSlots_;
  std::unordered_map<std::string_view, uint64_t> sharedOffsets_;
  std::vector<uint32_t> dynamicSharedSlots_;
  std::unordered_map<std::string_view, std::unique_ptr<Instance>> instances_;
  std::vector<Instance*> pending_;
  std::vector<std::pair<uint32_t, Instance*>> callFixups_;
  std::unordered_map<std::string_view, uint32_t> depths_;
};

}  // namespace

PtxModule loadPtx(std::string_view text) {
  const syntax::Module syntax = syntax::parse(text);
  PtxModule module;
  std::unordered_map<std::string_view, size_t> functions, variables;
  for (size_t i = 0; i < syntax.functions.size(); ++i) {
    const syntax::Function& f = syntax.functions[i];
    auto it = functions.find(f.name);
    // A prototype followed by the definition: the definition counts.
    if (it == functions.end() || f.defined) functions[f.name] = i;
  }
  for (size_t i = 0; i < syntax.variables.size(); ++i) {
    const Declaration& d = syntax.variables[i];
    variables[d.name] = i;
  }
  // Device memory for .global and .const variables; indices follow the
  // syntax's variable list (shared ones get no memory and stay empty).
  for (const Declaration& d : syntax.variables) {
    ModuleVariable v;
    v.name = std::string(d.name);
    v.space = d.kind == Declaration::Kind::Const    ? Space::Const
              : d.kind == Declaration::Kind::Shared ? Space::Shared
                                                    : Space::Global;
    if (v.space != Space::Shared) {
      if (d.isArray && d.arrayCount == 0) fail(d.line, "unsized variable '" + v.name + "'");
      v.bytes = d.bytes();
      v.align = std::max<uint32_t>(d.align ? d.align : static_cast<uint32_t>(typeBytes(d.type)), 1);
      v.init = d.init;
      if (v.init.size() > v.bytes) fail(d.line, "initializer of '" + v.name + "' is longer than the variable");
    }
    module.variables.push_back(std::move(v));
  }
  for (const syntax::Function& f : syntax.functions) {
    if (!f.isEntry || !f.defined) continue;
    Kernel kernel;
    KernelDecoder(syntax, functions, variables, f, kernel).decode();
    module.kernels.push_back(std::move(kernel));
  }
  return module;
}

}  // namespace kiln::emulator
