// Emits kernel IR as LLVM IR. Loops keep their counters in allocas that
// mem2reg promotes; the vectorizable loop's latch carries
// `llvm.loop.vectorize.enable`. Bool elements are i8 in memory and i1 in
// registers. The scalar rules (NaN-propagating max/min, mod and rem,
// integer division that never traps, wrapping integer arithmetic and pow,
// round half to even, sign, relu, float-to-integer casts) are calls of
// ir/ScalarSemantics.h's functions, linked in as bitcode and inlined by O3
// (ScalarLibrary.h), so the interpreter, this emitter and the CUDA emitter
// share one definition. Integer + - * that provably stay in range (index
// arithmetic, codegen/ValueRanges.h) and division by a positive divisor
// are plain instructions. Reductions keep their own NaN-sticky combiners;
// float sums longer than a block are summed in blocks combined pairwise
// (sumBlocking, codegen/Schedule.h).
// On f32, exp, log, tanh, erf and sigmoid are inline IR (VectorMath.h), so
// loops calling them vectorize; f64 and the other functions call libm.
// f16 and bf16 compute in f32 (as the interpreter rounds each op's result
// through float): loads widen, stores and casts to them round to nearest
// even (bf16 in integer arithmetic, as ir/Types.cpp's floatToBFloat16, so
// no bf16 support in the backend is needed; bf16 is i16 in memory).
#include "codegen/llvm/LlvmEmitter.h"

#include "codegen/Schedule.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "codegen/ValueRanges.h"
#include "codegen/cpu/CpuTarget.h"
#include "codegen/llvm/ScalarLibrary.h"
#include "codegen/llvm/VectorMath.h"

namespace kiln::codegen {
namespace {

using kir::BinaryFn;
using kir::Expr;
using kir::ExprKind;
using kir::ReduceKind;
using kir::UnaryFn;

bool isUnsigned(DType t) { return t == DType::Bool || (isInteger(t) && !isSigned(t)); }

class KernelEmitter {
 public:
  KernelEmitter(const kir::Kernel& kernel, llvm::Module& module, ScalarLibrary& scalars)
      : kernel_(kernel), module_(module), ctx_(module.getContext()), b_(ctx_), scalars_(scalars), ranges_(kernel) {}

  void emit() {
    llvm::Type* ptr = llvm::PointerType::get(ctx_, 0);
    llvm::Type* i64 = b_.getInt64Ty();
    // The body: one noalias pointer per buffer, then begin and end.
    std::vector<llvm::Type*> bodyParams(kernel_.buffers.size(), ptr);
    bodyParams.push_back(i64);
    bodyParams.push_back(i64);
    auto* bodyType = llvm::FunctionType::get(b_.getVoidTy(), bodyParams, false);
    llvm::Function* body =
        llvm::Function::Create(bodyType, llvm::Function::InternalLinkage, kernel_.name + ".body", module_);
    body->addFnAttr(llvm::Attribute::AlwaysInline);
    body->addFnAttr(llvm::Attribute::NoUnwind);
    for (size_t i = 0; i < kernel_.buffers.size(); ++i) {
      body->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
      buffers_.push_back(body->getArg(static_cast<unsigned>(i)));
    }
    begin_ = body->getArg(static_cast<unsigned>(kernel_.buffers.size()));
    end_ = body->getArg(static_cast<unsigned>(kernel_.buffers.size() + 1));
    entry_ = llvm::BasicBlock::Create(ctx_, "entry", body);
    b_.SetInsertPoint(entry_);
    for (const kir::StmtPtr& s : kernel_.body) emitStmt(*s);
    b_.CreateRetVoid();

    // The entry point of docs/codegen.md unpacks the buffer array.
    auto* kernelType = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64}, false);
    llvm::Function* fn = llvm::Function::Create(kernelType, llvm::Function::ExternalLinkage, kernel_.name, module_);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn));
    std::vector<llvm::Value*> args;
    for (size_t i = 0; i < kernel_.buffers.size(); ++i)
      args.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, fn->getArg(0), i)));
    args.push_back(fn->getArg(2));
    args.push_back(fn->getArg(3));
    b_.CreateCall(body, args);
    b_.CreateRetVoid();
  }

 private:
  // --- Types ---------------------------------------------------------------

  llvm::Type* memoryType(DType t) {
    switch (t) {
      case DType::F64:
        return b_.getDoubleTy();
      case DType::F32:
        return b_.getFloatTy();
      case DType::F16:
        return b_.getHalfTy();
      case DType::BF16:
        return b_.getInt16Ty();
      case DType::I64:
      case DType::U64:
        return b_.getInt64Ty();
      case DType::I32:
      case DType::U32:
        return b_.getInt32Ty();
      case DType::I16:
      case DType::U16:
        return b_.getInt16Ty();
      case DType::I8:
      case DType::U8:
      case DType::Bool:
        return b_.getInt8Ty();
    }
    return b_.getInt8Ty();
  }
  static bool isHalf(DType t) { return t == DType::F16 || t == DType::BF16; }
  llvm::Type* valueType(DType t) {
    if (isHalf(t)) return b_.getFloatTy();
    return t == DType::Bool ? b_.getInt1Ty() : memoryType(t);
  }

  /// An f16/bf16 element as loaded from memory, widened to f32.
  llvm::Value* widenHalf(llvm::Value* v, DType t) {
    if (t == DType::F16) return b_.CreateFPExt(v, b_.getFloatTy());
    return b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(v, b_.getInt32Ty()), 16), b_.getFloatTy());
  }

  /// An f32 value rounded to f16/bf16 as stored in memory. bf16: round to
  /// nearest even on the bits, NaN kept quiet (ir/Types.cpp).
  llvm::Value* narrowHalf(llvm::Value* f, DType t) {
    if (t == DType::F16) return b_.CreateFPTrunc(f, b_.getHalfTy());
    llvm::Value* x = b_.CreateBitCast(f, b_.getInt32Ty());
    llvm::Value* isNan = b_.CreateFCmpUNO(f, f);
    llvm::Value* quiet = b_.CreateOr(b_.CreateLShr(x, 16), b_.getInt32(0x40));
    llvm::Value* rounding = b_.CreateAdd(b_.getInt32(0x7fff), b_.CreateAnd(b_.CreateLShr(x, 16), b_.getInt32(1)));
    llvm::Value* rounded = b_.CreateLShr(b_.CreateAdd(x, rounding), 16);
    return b_.CreateTrunc(b_.CreateSelect(isNan, quiet, rounded), b_.getInt16Ty());
  }

  llvm::AllocaInst* entryAlloca(llvm::Type* type) {
    llvm::IRBuilder<> e(entry_, entry_->begin());
    return e.CreateAlloca(type);
  }

  // --- Loops ---------------------------------------------------------------

  /// Emits `for (iv = lo; iv < hi; ++iv) bodyFn(iv)`.
  template <typename BodyFn>
  void emitLoop(llvm::Value* lo, llvm::Value* hi, bool vectorize, BodyFn bodyFn, bool keepRolled = false) {
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::AllocaInst* slot = entryAlloca(b_.getInt64Ty());
    b_.CreateStore(lo, slot);
    auto* cond = llvm::BasicBlock::Create(ctx_, "loop.cond", fn);
    auto* body = llvm::BasicBlock::Create(ctx_, "loop.body", fn);
    auto* exit = llvm::BasicBlock::Create(ctx_, "loop.exit", fn);
    b_.CreateBr(cond);
    b_.SetInsertPoint(cond);
    llvm::Value* iv = b_.CreateLoad(b_.getInt64Ty(), slot);
    b_.CreateCondBr(b_.CreateICmpSLT(iv, hi), body, exit);
    b_.SetInsertPoint(body);
    bodyFn(iv);
    b_.CreateStore(b_.CreateAdd(iv, b_.getInt64(1), "", true, true), slot);
    llvm::BranchInst* latch = b_.CreateBr(cond);
    if (vectorize) {
      llvm::Metadata* enable[] = {llvm::MDString::get(ctx_, "llvm.loop.vectorize.enable"),
                                  llvm::ConstantAsMetadata::get(b_.getTrue())};
      llvm::TempMDNode placeholder = llvm::MDNode::getTemporary(ctx_, std::nullopt);
      std::vector<llvm::Metadata*> ops = {placeholder.get(), llvm::MDNode::get(ctx_, enable)};
      // A short loop the unroller would otherwise flatten into scalars
      // before the vectorizer sees it (the lanes of a column reduction).
      if (keepRolled) ops.push_back(llvm::MDNode::get(ctx_, {llvm::MDString::get(ctx_, "llvm.loop.unroll.disable")}));
      llvm::MDNode* loopId = llvm::MDNode::getDistinct(ctx_, ops);
      loopId->replaceOperandWith(0, loopId);
      latch->setMetadata(llvm::LLVMContext::MD_loop, loopId);
    }
    b_.SetInsertPoint(exit);
  }

  void emitStmt(const kir::Stmt& s) {
    if (s.kind == kir::Stmt::Kind::Store) {
      llvm::Value* value = emitExpr(*s.value);
      const DType t = kernel_.buffers[s.buffer].dtype;
      if (t == DType::Bool) value = b_.CreateZExt(value, b_.getInt8Ty());
      if (isHalf(t)) value = narrowHalf(value, t);
      b_.CreateStore(value, address(s.buffer, *s.index));
      return;
    }
    llvm::Value* lo = b_.getInt64(0);
    llvm::Value* hi = b_.getInt64(s.extent);
    const kir::LoopMapping mapping = kernel_.schedule.of(s.var);
    if (mapping == kir::LoopMapping::Threads) {
      // The thread's slice, clipped to the loop so a caller's rounding
      // cannot run past it.
      lo = b_.CreateSelect(b_.CreateICmpSGT(begin_, lo), begin_, lo);
      hi = b_.CreateSelect(b_.CreateICmpSLT(end_, hi), end_, hi);
    }
    if (mapping == kir::LoopMapping::Vector)
      if (const auto reductions = columnReductions(s); !reductions.empty()) {
        emitColumnReduction(s, lo, hi, reductions);
        return;
      }
    if (mapping == kir::LoopMapping::Tile) {
      emitRegisterTile(s);
      return;
    }
    // A row's reductions that do not depend on this loop, the innermost
    // (a softmax's max and sum, a layer norm's mean and variance, which a
    // fused group reads back over the row: rowInvariantReductions), are
    // computed once before it instead of once per element of the row.
    std::vector<std::string> hoisted;
    if (s.body.size() == 1 && s.body[0]->kind == kir::Stmt::Kind::Store)
      for (const kir::ExprPtr& r : rowInvariantReductions(*s.body[0], loopVars_)) {
        std::string key = reductionKey(*r);
        if (rowValues_.count(key)) continue;
        llvm::Value* value = emitExpr(*r);
        rowValues_.emplace(key, value);
        hoisted.push_back(std::move(key));
      }
    loopVars_.push_back(s.var);
    emitLoop(lo, hi, mapping == kir::LoopMapping::Vector, [&](llvm::Value* iv) {
      vars_[s.var] = iv;
      for (const kir::StmtPtr& inner : s.body) emitStmt(*inner);
    });
    loopVars_.pop_back();
    for (const std::string& key : hoisted) rowValues_.erase(key);
  }

  /// A loop mapped Tile (codegen/Schedule.h): its body is the Vector
  /// loop along a row of the tile, holding one store. Each load that reads
  /// across the rows (tileTransposedLoads) is read once per tile as n (8
  /// or 16) vectors along the rows (one per column, each n consecutive
  /// elements of the operand), transposed in registers by swapping the
  /// off-diagonal blocks of 1, 2, 4 (and 8) elements (n log2 n two-vector
  /// shuffles, which the backend makes unpacks and permutes), and stored
  /// row by row into a
  /// tile on the stack; the loops then read it there, contiguously along
  /// each row, so the row loop is vectorized loads and stores only. An
  /// 8 x 8 f32 tile moved through gathers ran at 14 GB/s here, through
  /// shuffles at 20 to 50.
  void emitRegisterTile(const kir::Stmt& s) {
    const kir::Stmt& row = *s.body[0];
    const kir::Stmt& store = *row.body[0];
    const int64_t n = s.extent;
    std::map<std::string, llvm::Value*> tiles;
    for (const kir::ExprPtr& load : tileTransposedLoads(store, s.var, row.var)) {
      llvm::Type* element = memoryType(load->type);
      auto* vector = llvm::FixedVectorType::get(element, static_cast<unsigned>(n));
      llvm::AllocaInst* memory = entryAlloca(llvm::ArrayType::get(element, static_cast<uint64_t>(n * n)));
      memory->setAlignment(llvm::Align(64));
      const llvm::Align elementAlign(dtypeSize(load->type));
      // m[c]: column c of the tile, its rows in the lanes.
      std::vector<llvm::Value*> m;
      vars_[s.var] = b_.getInt64(0);
      for (int64_t c = 0; c < n; ++c) {
        vars_[row.var] = b_.getInt64(c);
        m.push_back(b_.CreateAlignedLoad(vector, address(load->id, *load->args[0]), elementAlign));
      }
      // Swapping bit h between the vector number and the lane, for each
      // h, exchanges them: afterwards m[r] holds row r.
      for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; ++i) {
          if (i & h) continue;
          std::vector<int> first, second;
          for (int64_t k = 0; k < n; ++k) {
            first.push_back(static_cast<int>((k & h) ? n + k - h : k));
            second.push_back(static_cast<int>((k & h) ? n + k : k + h));
          }
          llvm::Value* a = m[static_cast<size_t>(i)];
          llvm::Value* b = m[static_cast<size_t>(i + h)];
          m[static_cast<size_t>(i)] = b_.CreateShuffleVector(a, b, first);
          m[static_cast<size_t>(i + h)] = b_.CreateShuffleVector(a, b, second);
        }
      for (int64_t r = 0; r < n; ++r)
        b_.CreateAlignedStore(m[static_cast<size_t>(r)], b_.CreateConstInBoundsGEP1_64(element, memory, r * n),
                              llvm::Align(dtypeSize(load->type) * static_cast<uint64_t>(n)));
      tiles[kir::printExpr(load)] = memory;
    }
    // Every load equal to a transposed one (a group may read it twice) reads the tile.
    std::function<void(const kir::ExprPtr&)> mark = [&](const kir::ExprPtr& e) {
      for (const kir::ExprPtr& arg : e->args) mark(arg);
      if (e->kind == ExprKind::Load)
        if (auto it = tiles.find(kir::printExpr(e)); it != tiles.end())
          transposed_[e.get()] = TransposedTile{it->second, s.var, row.var, n};
    };
    mark(store.value);
    // The row loop is kept rolled for the vectorizer: fully unrolled first,
    // the rows of an elementwise group were left scalar.
    emitLoop(b_.getInt64(0), b_.getInt64(s.extent), false, [&](llvm::Value* iv) {
      vars_[s.var] = iv;
      emitLoop(
          b_.getInt64(0), b_.getInt64(row.extent), true,
          [&](llvm::Value* column) {
            vars_[row.var] = column;
            emitStmt(store);
          },
          /*keepRolled=*/true);
    });
    transposed_.clear();
  }

  llvm::Value* address(int buffer, const Expr& index) {
    return b_.CreateInBoundsGEP(memoryType(kernel_.buffers[buffer].dtype), buffers_[buffer], emitExpr(index));
  }

  // --- Expressions ------------------------------------------------------------

  llvm::Value* emitExpr(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Const:
        if (isFloat(e.type)) return llvm::ConstantFP::get(valueType(e.type), e.floatValue);
        return llvm::ConstantInt::get(valueType(e.type), static_cast<uint64_t>(e.intValue), !isUnsigned(e.type));
      case ExprKind::Var:
        return vars_.at(e.id);
      case ExprKind::Load: {
        llvm::Value* at = nullptr;
        if (auto it = transposed_.find(&e); it != transposed_.end()) {
          // Row r, column c of the tile transposed in registers.
          const TransposedTile& tile = it->second;
          llvm::Value* offset = b_.CreateAdd(b_.CreateMul(vars_.at(tile.rowVar), b_.getInt64(tile.side)),
                                             vars_.at(tile.colVar));
          at = b_.CreateInBoundsGEP(memoryType(e.type), tile.memory, offset);
        }
        llvm::Value* v = b_.CreateLoad(memoryType(e.type), at ? at : address(e.id, *e.args[0]));
        if (isHalf(e.type)) return widenHalf(v, e.type);
        return e.type == DType::Bool ? b_.CreateICmpNE(v, b_.getInt8(0)) : v;
      }
      case ExprKind::Unary:
        return emitUnary(e.unary, e.args[0]->type, emitExpr(*e.args[0]));
      case ExprKind::Binary:
        return emitBinary(e.binary, e.args[0]->type, emitExpr(*e.args[0]), emitExpr(*e.args[1]), &e);
      case ExprKind::Select:
        return b_.CreateSelect(emitExpr(*e.args[0]), emitExpr(*e.args[1]), emitExpr(*e.args[2]));
      case ExprKind::Cast:
        return emitCast(emitExpr(*e.args[0]), e.args[0]->type, e.type);
      case ExprKind::Reduce:
        if (auto it = overrides_.find(&e); it != overrides_.end()) return it->second;
        if (!rowValues_.empty())
          if (auto it = rowValues_.find(reductionKey(e)); it != rowValues_.end()) return it->second;
        return e.reduce == ReduceKind::ArgMax || e.reduce == ReduceKind::ArgMin ? emitArgReduce(e) : emitReduce(e);
    }
    return nullptr;
  }

  llvm::Value* intrinsic(llvm::Intrinsic::ID id, llvm::Value* x) { return b_.CreateUnaryIntrinsic(id, x); }

  /// A call of ir/ScalarSemantics.h's `function` for dtype `t`
  /// (kiln_<function>_<dtype>; f16 and bf16 are held in f32), returning `t`.
  llvm::Value* scalar(const char* function, DType t, std::initializer_list<llvm::Value*> args) {
    return scalarReturning(function, t, valueType(t), args);
  }
  llvm::Value* scalarReturning(const char* function, DType t, llvm::Type* result,
                               std::initializer_list<llvm::Value*> args) {
    const std::string_view dtype = isHalf(t) ? "f32" : dtypeName(t);
    return scalars_.call(b_, "kiln_" + std::string(function) + "_" + std::string(dtype), result, args);
  }

  /// A libm function (`tanhf` for f32, `tanh` for f64).
  llvm::Value* libm(const std::string& name, llvm::Value* x) {
    const bool f32 = x->getType()->isFloatTy();
    auto callee = module_.getOrInsertFunction(f32 ? name + "f" : name, x->getType(), x->getType());
    llvm::CallInst* call = b_.CreateCall(callee, {x});
    call->setDoesNotThrow();
    call->setOnlyReadsMemory();
    return call;
  }

  llvm::Value* emitUnary(UnaryFn fn, DType t, llvm::Value* x) {
    llvm::Type* ty = x->getType();
    if (!isFloat(t)) {
      switch (fn) {
        case UnaryFn::Neg:
          return scalar("neg", t, {x});
        case UnaryFn::Abs:
          return scalar("abs", t, {x});
        case UnaryFn::Sign:
          return scalar("sign", t, {x});
        case UnaryFn::Relu:
          return scalar("relu", t, {x});
        case UnaryFn::Not:
          return b_.CreateNot(x);
        default:
          break;
      }
      // Float math on integers is refused by the verifier; reaching here is
      // a lowering bug, so compute in double rather than emit bad IR.
      llvm::Value* d = emitCast(x, t, DType::F64);
      return emitCast(emitUnary(fn, DType::F64, d), DType::F64, t);
    }
    llvm::Value* zero = llvm::ConstantFP::get(ty, 0.0);
    llvm::Value* one = llvm::ConstantFP::get(ty, 1.0);
    const bool f32 = ty->isFloatTy();
    switch (fn) {
      case UnaryFn::Neg:
        return b_.CreateFNeg(x);
      case UnaryFn::Abs:
        return intrinsic(llvm::Intrinsic::fabs, x);
      case UnaryFn::Sign:
        return scalar("sign", t, {x});
      case UnaryFn::Exp:
        return f32 ? emitExpF32(b_, x) : intrinsic(llvm::Intrinsic::exp, x);
      case UnaryFn::Log:
        return f32 ? emitLogF32(b_, x) : intrinsic(llvm::Intrinsic::log, x);
      case UnaryFn::Sqrt:
        return intrinsic(llvm::Intrinsic::sqrt, x);
      case UnaryFn::Rsqrt:
        return b_.CreateFDiv(one, intrinsic(llvm::Intrinsic::sqrt, x));
      case UnaryFn::Reciprocal:
        return b_.CreateFDiv(one, x);
      case UnaryFn::Tanh:
        return f32 ? emitTanhF32(b_, x) : libm("tanh", x);
      case UnaryFn::Sigmoid:
        if (f32) return emitSigmoidF32(b_, x);
        return b_.CreateFDiv(one, b_.CreateFAdd(one, intrinsic(llvm::Intrinsic::exp, b_.CreateFNeg(x))));
      case UnaryFn::Relu:
        return scalar("relu", t, {x});
      case UnaryFn::Erf:
        return f32 ? emitErfF32(b_, x) : libm("erf", x);
      case UnaryFn::Sin:
        return intrinsic(llvm::Intrinsic::sin, x);
      case UnaryFn::Cos:
        return intrinsic(llvm::Intrinsic::cos, x);
      case UnaryFn::Tan:
        return libm("tan", x);
      case UnaryFn::Asin:
        return libm("asin", x);
      case UnaryFn::Acos:
        return libm("acos", x);
      case UnaryFn::Atan:
        return libm("atan", x);
      case UnaryFn::Sinh:
        return libm("sinh", x);
      case UnaryFn::Cosh:
        return libm("cosh", x);
      case UnaryFn::Asinh:
        return libm("asinh", x);
      case UnaryFn::Acosh:
        return libm("acosh", x);
      case UnaryFn::Atanh:
        return libm("atanh", x);
      case UnaryFn::Floor:
        return intrinsic(llvm::Intrinsic::floor, x);
      case UnaryFn::Ceil:
        return intrinsic(llvm::Intrinsic::ceil, x);
      case UnaryFn::Round:
        return scalar("round", t, {x});
      case UnaryFn::Not:
        return b_.CreateFCmpOEQ(x, zero);
      case UnaryFn::IsNan:
        return b_.CreateFCmpUNO(x, x);
      case UnaryFn::IsInf:
        return b_.CreateFCmpOEQ(intrinsic(llvm::Intrinsic::fabs, x), llvm::ConstantFP::getInfinity(ty));
    }
    return x;
  }

  /// `e`, when given, is the expression computed, whose operands' ranges
  /// may show that plain integer arithmetic is exact.
  llvm::Value* emitBinary(BinaryFn fn, DType t, llvm::Value* x, llvm::Value* y, const Expr* e = nullptr) {
    if (isFloat(t)) {
      switch (fn) {
        case BinaryFn::Add:
          return b_.CreateFAdd(x, y);
        case BinaryFn::Sub:
          return b_.CreateFSub(x, y);
        case BinaryFn::Mul:
          return b_.CreateFMul(x, y);
        case BinaryFn::Div:
          return b_.CreateFDiv(x, y);
        case BinaryFn::Rem:
          return scalar("rem", t, {x, y});
        case BinaryFn::Mod:
          return scalar("mod", t, {x, y});
        case BinaryFn::Pow:
          return b_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, x, y);
        case BinaryFn::Max:
          return scalar("max", t, {x, y});
        case BinaryFn::Min:
          return scalar("min", t, {x, y});
        case BinaryFn::Eq:
          return b_.CreateFCmpOEQ(x, y);
        case BinaryFn::Ne:
          return b_.CreateFCmpUNE(x, y);
        case BinaryFn::Lt:
          return b_.CreateFCmpOLT(x, y);
        case BinaryFn::Le:
          return b_.CreateFCmpOLE(x, y);
        case BinaryFn::Gt:
          return b_.CreateFCmpOGT(x, y);
        case BinaryFn::Ge:
          return b_.CreateFCmpOGE(x, y);
        default:
          break;
      }
    }
    const bool u = isUnsigned(t);
    // Index arithmetic: plain instructions (ValueRanges.h).
    const bool plain = e && ranges_.plainOperatorSuffices(*e);
    switch (fn) {
      case BinaryFn::Add:
        return plain ? b_.CreateAdd(x, y) : scalar("add", t, {x, y});
      case BinaryFn::Sub:
        return plain ? b_.CreateSub(x, y) : scalar("sub", t, {x, y});
      case BinaryFn::Mul:
        return plain ? b_.CreateMul(x, y) : scalar("mul", t, {x, y});
      case BinaryFn::Div:
        if (plain) return u ? b_.CreateUDiv(x, y) : b_.CreateSDiv(x, y);
        return scalar("div", t, {x, y});
      case BinaryFn::Rem:
      case BinaryFn::Mod:
        if (plain) return u ? b_.CreateURem(x, y) : b_.CreateSRem(x, y);
        return scalar(fn == BinaryFn::Rem ? "rem" : "mod", t, {x, y});
      case BinaryFn::Max:
        if (t == DType::Bool) return b_.CreateOr(x, y);
        return scalar("max", t, {x, y});
      case BinaryFn::Min:
        if (t == DType::Bool) return b_.CreateAnd(x, y);
        return scalar("min", t, {x, y});
      case BinaryFn::And:
        return b_.CreateAnd(x, y);
      case BinaryFn::Or:
        return b_.CreateOr(x, y);
      case BinaryFn::Xor:
        return b_.CreateXor(x, y);
      case BinaryFn::Eq:
        return b_.CreateICmpEQ(x, y);
      case BinaryFn::Ne:
        return b_.CreateICmpNE(x, y);
      case BinaryFn::Lt:
        return u ? b_.CreateICmpULT(x, y) : b_.CreateICmpSLT(x, y);
      case BinaryFn::Le:
        return u ? b_.CreateICmpULE(x, y) : b_.CreateICmpSLE(x, y);
      case BinaryFn::Gt:
        return u ? b_.CreateICmpUGT(x, y) : b_.CreateICmpSGT(x, y);
      case BinaryFn::Ge:
        return u ? b_.CreateICmpUGE(x, y) : b_.CreateICmpSGE(x, y);
      case BinaryFn::Pow:
        return scalar("pow", t, {x, y});
    }
    return x;
  }

  /// The interpreter's cast rules: float to integer is kiln_ftoi (toward
  /// zero into i64, saturating, NaN 0; kiln_ftou for u64) and then wraps to
  /// the width, integers wrap (zero-extending the unsigned ones), anything
  /// to bool is x != 0.
  llvm::Value* emitCast(llvm::Value* x, DType from, DType to) {
    if (from == to) return x;
    if (isHalf(from)) from = DType::F32;  // held in f32
    if (isHalf(to)) {
      // Through f32 and rounded, as the interpreter stores f16/bf16.
      llvm::Value* f = emitCast(x, from, DType::F32);
      llvm::Value* narrow = narrowHalf(f, to);
      return widenHalf(narrow, to);
    }
    if (from == to) return x;
    llvm::Type* ty = valueType(to);
    if (to == DType::Bool) {
      if (isFloat(from)) return b_.CreateFCmpUNE(x, llvm::ConstantFP::get(x->getType(), 0.0));
      return b_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
    }
    if (isFloat(from) && isFloat(to)) return b_.CreateFPCast(x, ty);
    // A u64 from 2^63 up needs kiln_ftou; the narrower dtypes wrap the i64.
    if (isFloat(from))
      return b_.CreateTrunc(scalarReturning(to == DType::U64 ? "fptoui" : "fptosi", from, b_.getInt64Ty(), {x}), ty);
    if (isFloat(to)) return isUnsigned(from) ? b_.CreateUIToFP(x, ty) : b_.CreateSIToFP(x, ty);
    return b_.CreateIntCast(x, ty, !isUnsigned(from));
  }

  llvm::Value* identity(ReduceKind kind, DType t) {
    llvm::Type* ty = valueType(t);
    if (isFloat(t)) {
      switch (kind) {
        case ReduceKind::Sum:
          return llvm::ConstantFP::get(ty, 0.0);
        case ReduceKind::Prod:
          return llvm::ConstantFP::get(ty, 1.0);
        case ReduceKind::Max:
          return llvm::ConstantFP::getInfinity(ty, true);
        default:
          return llvm::ConstantFP::getInfinity(ty, false);
      }
    }
    const unsigned bits = ty->getIntegerBitWidth();
    switch (kind) {
      case ReduceKind::Sum:
        return llvm::ConstantInt::get(ty, 0);
      case ReduceKind::Prod:
        return llvm::ConstantInt::get(ty, 1);
      case ReduceKind::Max:
        return llvm::ConstantInt::get(
            ctx_, isUnsigned(t) ? llvm::APInt::getMinValue(bits) : llvm::APInt::getSignedMinValue(bits));
      default:
        return llvm::ConstantInt::get(
            ctx_, isUnsigned(t) ? llvm::APInt::getMaxValue(bits) : llvm::APInt::getSignedMaxValue(bits));
    }
  }

  /// Emits the loops of a reduction around `inner()`, which runs with
  /// the reduction's variables bound.
  template <typename InnerFn>
  void emitReductionNest(const Expr& e, size_t level, InnerFn inner) {
    if (level == e.extents.size()) {
      inner();
      return;
    }
    emitLoop(b_.getInt64(level == 0 && e.reduce >= ReduceKind::ArgMax ? 1 : 0), b_.getInt64(e.extents[level]), false,
             [&](llvm::Value* iv) {
               vars_[e.id + static_cast<int>(level)] = iv;
               emitReductionNest(e, level + 1, inner);
             });
  }

  /// Emits the loops of a reduction around `step(body)`.
  template <typename StepFn>
  void emitReductionLoops(const Expr& e, size_t level, StepFn step) {
    emitReductionNest(e, level, [&] { step(emitExpr(*e.args[0])); });
  }

  /// A float max or min that keeps NaN: `v` replaces `a` when it is
  /// greater (smaller), or NaN; once `a` is NaN it stays.
  llvm::Value* minMaxStep(ReduceKind kind, llvm::Value* a, llvm::Value* v) {
    llvm::Value* better = kind == ReduceKind::Max ? b_.CreateFCmpOGT(v, a) : b_.CreateFCmpOLT(v, a);
    return b_.CreateSelect(b_.CreateOr(better, b_.CreateFCmpUNO(v, v)), v, a);
  }

  /// A float max or min over a long innermost extent, in a form LLVM 16's
  /// loop vectorizer takes: a max whose compare and select promise no NaN
  /// (its FMax reduction; `llvm.maximum` reductions come in LLVM 17) and
  /// beside it an or of "is NaN", which makes the result NaN at the end.
  /// Where the promise is broken the max is poison, and the final select
  /// takes the NaN instead. With one NaN-keeping accumulator each element
  /// was a compare and select after the last: a softmax's row max over
  /// [12,128,128] took 0.24 ms on 2 threads, longer than its exp; this
  /// form takes 0.008 ms. Which of -0 and +0 wins a tie is left open, as
  /// any vectorized max leaves it.
  static constexpr int64_t kVectorMinMaxExtent = 16;

  llvm::Value* emitVectorMinMax(const Expr& e) {
    const DType t = e.type;
    llvm::AllocaInst* acc = entryAlloca(valueType(t));
    llvm::AllocaInst* sawNan = entryAlloca(b_.getInt8Ty());
    b_.CreateStore(identity(e.reduce, t), acc);
    b_.CreateStore(b_.getInt8(0), sawNan);
    llvm::FastMathFlags noNans;
    noNans.setNoNaNs();
    noNans.setNoSignedZeros();
    emitReductionLoops(e, 0, [&](llvm::Value* v) {
      llvm::Value* a = b_.CreateLoad(valueType(t), acc);
      llvm::Value* better = e.reduce == ReduceKind::Max ? b_.CreateFCmpOGT(v, a) : b_.CreateFCmpOLT(v, a);
      if (auto* inst = llvm::dyn_cast<llvm::Instruction>(better)) inst->setFastMathFlags(noNans);
      llvm::Value* next = b_.CreateSelect(better, v, a);
      if (auto* inst = llvm::dyn_cast<llvm::Instruction>(next)) inst->setFastMathFlags(noNans);
      b_.CreateStore(next, acc);
      llvm::Value* isNan = b_.CreateZExt(b_.CreateFCmpUNO(v, v), b_.getInt8Ty());
      b_.CreateStore(b_.CreateOr(b_.CreateLoad(b_.getInt8Ty(), sawNan), isNan), sawNan);
    });
    llvm::Value* anyNan = b_.CreateICmpNE(b_.CreateLoad(b_.getInt8Ty(), sawNan), b_.getInt8(0));
    return b_.CreateSelect(anyNan, llvm::ConstantFP::getNaN(valueType(t)), b_.CreateLoad(valueType(t), acc));
  }

  llvm::Value* emitReduce(const Expr& e) {
    const DType t = e.type;
    if (isFloat(t) && (e.reduce == ReduceKind::Max || e.reduce == ReduceKind::Min) && !e.extents.empty() &&
        e.extents.back() >= kVectorMinMaxExtent)
      return emitVectorMinMax(e);
    if (std::optional<SumBlocking> blocking = sumBlocking(e)) return emitBlockedSum(e, *blocking);
    llvm::AllocaInst* acc = entryAlloca(valueType(t));
    b_.CreateStore(identity(e.reduce, t), acc);
    emitReductionLoops(e, 0, [&](llvm::Value* v) {
      b_.CreateStore(combine(e.reduce, t, b_.CreateLoad(valueType(t), acc), v), acc);
    });
    return b_.CreateLoad(valueType(t), acc);
  }

  // --- Long sums ----------------------------------------------------------------

  /// Runs `block(lo, hi)` once per block of the long sum `e` (SumBlocking,
  /// codegen/Schedule.h), with the levels outside the split one bound;
  /// `block` emits the split level's loop over [lo, hi) and the levels
  /// inside it.
  template <typename BlockFn>
  void emitSumBlocks(const Expr& e, const SumBlocking& blocking, size_t level, BlockFn block) {
    if (level < blocking.level) {
      emitLoop(b_.getInt64(0), b_.getInt64(e.extents[level]), false, [&](llvm::Value* iv) {
        vars_[e.id + static_cast<int>(level)] = iv;
        emitSumBlocks(e, blocking, level + 1, block);
      });
      return;
    }
    emitLoop(b_.getInt64(0), b_.getInt64(blocking.chunks), false, [&](llvm::Value* c) {
      llvm::Value* lo = b_.CreateMul(c, b_.getInt64(blocking.chunk), "", true, true);
      llvm::Value* hi = b_.CreateAdd(lo, b_.getInt64(blocking.chunk), "", true, true);
      llvm::Value* extent = b_.getInt64(e.extents[blocking.level]);
      block(lo, b_.CreateSelect(b_.CreateICmpSLT(hi, extent), hi, extent));
    });
  }

  /// Counts one more block in `count` and returns how many complete
  /// subtrees it closes: ctz of the new count, the partials it absorbs.
  llvm::Value* closeBlock(llvm::AllocaInst* count) {
    llvm::Value* k = b_.CreateAdd(b_.CreateLoad(b_.getInt64Ty(), count), b_.getInt64(1), "", true, true);
    b_.CreateStore(k, count);
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, k, b_.getTrue());
  }

  /// A long float sum in blocks: each block of at most kSumBlock elements
  /// is summed from zero by the loop as before (reassociable, so LLVM
  /// splits it over SIMD lanes), then combined pairwise with the blocks
  /// before it; the partials are added in a fixed tree, not reassociated.
  llvm::Value* emitBlockedSum(const Expr& e, const SumBlocking& blocking) {
    const DType t = e.type;
    llvm::Type* ty = valueType(t);
    llvm::AllocaInst* partials = entryAlloca(llvm::ArrayType::get(ty, static_cast<uint64_t>(blocking.levels)));
    llvm::AllocaInst* count = entryAlloca(b_.getInt64Ty());
    llvm::AllocaInst* acc = entryAlloca(ty);
    auto partial = [&](llvm::Value* level) { return b_.CreateInBoundsGEP(ty, partials, {level}); };
    b_.CreateStore(b_.getInt64(0), count);
    emitSumBlocks(e, blocking, 0, [&](llvm::Value* lo, llvm::Value* hi) {
      b_.CreateStore(identity(ReduceKind::Sum, t), acc);
      emitLoop(lo, hi, false, [&](llvm::Value* iv) {
        vars_[e.id + static_cast<int>(blocking.level)] = iv;
        emitReductionNest(e, blocking.level + 1, [&] {
          b_.CreateStore(combine(ReduceKind::Sum, t, b_.CreateLoad(ty, acc), emitExpr(*e.args[0])), acc);
        });
      });
      llvm::Value* carries = closeBlock(count);
      emitLoop(b_.getInt64(0), carries, false, [&](llvm::Value* l) {
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(ty, partial(l)), b_.CreateLoad(ty, acc)), acc);
      });
      b_.CreateStore(b_.CreateLoad(ty, acc), partial(carries));
    });
    // The partials left, smallest subtree first.
    llvm::Value* total = nullptr;
    for (int l = 0; l < blocking.levels; ++l) {
      if (((blocking.blocks >> l) & 1) == 0) continue;
      llvm::Value* p = b_.CreateLoad(ty, partial(b_.getInt64(l)));
      total = total ? b_.CreateFAdd(total, p) : p;
    }
    return total;
  }

  /// One step of a Sum, Prod, Max or Min reduction: `a` combined with `v`.
  llvm::Value* combine(ReduceKind kind, DType t, llvm::Value* a, llvm::Value* v) {
    switch (kind) {
      case ReduceKind::Sum:
        return isFloat(t) ? reassociable(b_.CreateFAdd(a, v)) : scalar("add", t, {a, v});
      case ReduceKind::Prod:
        return isFloat(t) ? reassociable(b_.CreateFMul(a, v)) : scalar("mul", t, {a, v});
      case ReduceKind::Max:
      case ReduceKind::Min:
        if (isFloat(t)) return minMaxStep(kind, a, v);
        return emitBinary(kind == ReduceKind::Max ? BinaryFn::Max : BinaryFn::Min, t, a, v);
      default:
        return nullptr;
    }
  }

  // --- Column reductions ------------------------------------------------------

  /// The reductions a vector loop's single store computes, when they are
  /// worth running column-wise, grouped by value (reductionKey: a fused
  /// SGD update writes `select(first, g, m * 0.9 + g)` with the column sum
  /// g lowered twice, which one accumulator pass computes once): every
  /// reduction of the store's value (those not inside another) is a Sum,
  /// Prod, Max or Min whose elements lie next to each other along the
  /// vector loop's variable (`vectorVar`) but not along the reduction's
  /// innermost variable. A global average pool of a channels-last
  /// [1,112,112,32] is one: out[c] = sum over h, w of x[h,w,c], and so is a
  /// bias gradient, out[c] = sum over rows r of g[r,c]. Emitted as written,
  /// each lane sums its elements a row apart, one after another (0.2 ms on
  /// one thread for the pool); column-wise, a vector of lanes adds one
  /// contiguous row at a time. Empty when the loop is no such loop.
  std::vector<std::vector<const Expr*>> columnReductions(const kir::Stmt& loop) {
    if (loop.body.size() != 1 || loop.body[0]->kind != kir::Stmt::Kind::Store) return {};
    std::vector<const Expr*> found;
    std::function<void(const Expr&)> visit = [&](const Expr& e) {
      if (e.kind == ExprKind::Reduce) {
        found.push_back(&e);
        return;
      }
      for (const kir::ExprPtr& a : e.args) visit(*a);
    };
    visit(*loop.body[0]->value);
    if (found.empty()) return {};
    std::vector<std::vector<const Expr*>> groups;
    std::map<std::string, size_t> keys;
    for (const Expr* r : found) {
      if (!isColumnReduction(loop, *r)) return {};
      auto [it, added] = keys.emplace(reductionKey(*r), groups.size());
      if (added) groups.emplace_back();
      groups[it->second].push_back(r);
    }
    // Each distinct reduction is an accumulator pass over its input.
    if (groups.size() > kMaxColumnReductions) return {};
    return groups;
  }

  /// Whether `found`, a reduction in the store of vector loop `loop`, may
  /// run column-wise (columnReductions).
  bool isColumnReduction(const kir::Stmt& loop, const Expr& found) {
    if (found.extents.empty() || found.reduce > ReduceKind::Min) return false;
    // A pooling window (2x2, 3x3) is too short to pay for the accumulators'
    // loops: max_pool over [64,14,14,16] took 0.073 ms column-wise against
    // 0.026 ms as written.
    if (iterations(found) < kColumnMinElements) return false;
    const int innermost = found.id + static_cast<int>(found.extents.size()) - 1;
    bool contiguousLanes = false;
    bool stridedReduction = false;
    std::function<bool(const Expr&)> loads = [&](const Expr& e) {
      if (e.kind == ExprKind::Load) {
        std::optional<int64_t> lane = strideIn(*e.args[0], loop.var);
        std::optional<int64_t> step = strideIn(*e.args[0], innermost);
        if (!lane || !step) return false;
        contiguousLanes = contiguousLanes || *lane == 1;
        stridedReduction = stridedReduction || (*step != 1 && *step != 0);
        return true;
      }
      for (const kir::ExprPtr& a : e.args)
        if (!loads(*a)) return false;
      return true;
    };
    return loads(*found.args[0]) && contiguousLanes && stridedReduction;
  }

  /// The vector loop `loop` whose store holds `reductions`
  /// (columnReductions), column-wise: for each chunk of at most
  /// kColumnChunk lanes, and for each distinct reduction, the accumulators
  /// of the chunk's lanes start at the identity; the reduction loops run
  /// outside a vectorized loop over the lanes that combines each lane's
  /// element into its accumulator; then a vectorized loop stores each lane's
  /// value with its accumulators in place of the reductions. Each lane
  /// combines its elements in the same order as before.
  static constexpr int64_t kColumnChunk = 256;
  static constexpr int64_t kColumnMinElements = 32;
  static constexpr size_t kMaxColumnReductions = 4;
  /// The most rows a lane of a column sum adds in one block. A lane adds
  /// its block's elements one after another (a row sum's block is split
  /// over 64 SIMD accumulators), so its blocks are shorter than kSumBlock:
  /// a bias gradient over 1024 rows is 4 blocks combined pairwise rather
  /// than one sequential sum, for a pass over the lanes' accumulators every
  /// 256 rows.
  static constexpr int64_t kColumnSumBlock = 256;

  void emitColumnReduction(const kir::Stmt& loop, llvm::Value* lo, llvm::Value* hi,
                           const std::vector<std::vector<const Expr*>>& reductions) {
    std::vector<llvm::AllocaInst*> accs;
    for (const std::vector<const Expr*>& group : reductions)
      accs.push_back(entryAlloca(llvm::ArrayType::get(valueType(group.front()->type), kColumnChunk)));
    const kir::Stmt& store = *loop.body[0];
    llvm::Value* chunks = b_.CreateSDiv(b_.CreateAdd(b_.CreateSub(hi, lo), b_.getInt64(kColumnChunk - 1)),
                                        b_.getInt64(kColumnChunk));
    emitLoop(b_.getInt64(0), chunks, false, [&](llvm::Value* chunk) {
      llvm::Value* first = b_.CreateAdd(lo, b_.CreateMul(chunk, b_.getInt64(kColumnChunk)));
      llvm::Value* rest = b_.CreateSub(hi, first);
      llvm::Value* count =
          b_.CreateSelect(b_.CreateICmpSLT(rest, b_.getInt64(kColumnChunk)), rest, b_.getInt64(kColumnChunk));
      for (size_t g = 0; g < reductions.size(); ++g)
        emitColumnAccumulators(loop, *reductions[g].front(), accs[g], first, count);
      emitLoop(b_.getInt64(0), count, true, [&](llvm::Value* j) {
        vars_[loop.var] = b_.CreateAdd(first, j);
        for (size_t g = 0; g < reductions.size(); ++g) {
          llvm::Type* ty = valueType(reductions[g].front()->type);
          llvm::Value* value = b_.CreateLoad(ty, b_.CreateInBoundsGEP(ty, accs[g], {j}));
          for (const Expr* r : reductions[g]) overrides_[r] = value;
        }
        emitStmt(store);
        for (const std::vector<const Expr*>& group : reductions)
          for (const Expr* r : group) overrides_.erase(r);
      }, true);
    });
  }

  /// The accumulators `acc` of lanes [first, first + count) of `loop` for
  /// `reduction` (emitColumnReduction).
  void emitColumnAccumulators(const kir::Stmt& loop, const Expr& reduction, llvm::AllocaInst* acc, llvm::Value* first,
                              llvm::Value* count) {
    const DType t = reduction.type;
    llvm::Type* ty = valueType(t);
    auto lane = [&](llvm::Value* j) { return b_.CreateInBoundsGEP(ty, acc, {j}); };
    auto lanes = [&](const std::function<void(llvm::Value*)>& fn) { emitLoop(b_.getInt64(0), count, true, fn, true); };
    auto clear = [&] { lanes([&](llvm::Value* j) { b_.CreateStore(identity(reduction.reduce, t), lane(j)); }); };
    // Each lane's element of the innermost iteration into its accumulator.
    auto accumulate = [&] {
      lanes([&](llvm::Value* j) {
        vars_[loop.var] = b_.CreateAdd(first, j);
        llvm::Value* v = emitExpr(*reduction.args[0]);
        llvm::Value* a = b_.CreateLoad(ty, lane(j));
        // Lanes are independent: no reassociation is needed to vectorize.
        llvm::Value* next = combine(reduction.reduce, t, a, v);
        if (auto* inst = llvm::dyn_cast<llvm::Instruction>(next)) inst->setHasAllowReassoc(false);
        b_.CreateStore(next, lane(j));
      });
    };
    if (std::optional<SumBlocking> blocking = sumBlocking(reduction, kColumnSumBlock)) {
      // A long column sum: each lane sums blocks and combines them
      // pairwise (emitBlockedSum), all lanes at once.
      llvm::AllocaInst* partials =
          entryAlloca(llvm::ArrayType::get(ty, static_cast<uint64_t>(blocking->levels * kColumnChunk)));
      auto partial = [&](llvm::Value* level, llvm::Value* j) {
        return b_.CreateInBoundsGEP(
            ty, partials, {b_.CreateAdd(b_.CreateMul(level, b_.getInt64(kColumnChunk), "", true, true), j)});
      };
      llvm::AllocaInst* blocks = entryAlloca(b_.getInt64Ty());
      b_.CreateStore(b_.getInt64(0), blocks);
      emitSumBlocks(reduction, *blocking, 0, [&](llvm::Value* blockLo, llvm::Value* blockHi) {
        clear();
        emitLoop(blockLo, blockHi, false, [&](llvm::Value* iv) {
          vars_[reduction.id + static_cast<int>(blocking->level)] = iv;
          emitReductionNest(reduction, blocking->level + 1, accumulate);
        });
        llvm::Value* carries = closeBlock(blocks);
        emitLoop(b_.getInt64(0), carries, false, [&](llvm::Value* l) {
          lanes([&](llvm::Value* j) {
            b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(ty, partial(l, j)), b_.CreateLoad(ty, lane(j))), lane(j));
          });
        });
        lanes([&](llvm::Value* j) { b_.CreateStore(b_.CreateLoad(ty, lane(j)), partial(carries, j)); });
      });
      bool firstPartial = true;
      for (int l = 0; l < blocking->levels; ++l) {
        if (((blocking->blocks >> l) & 1) == 0) continue;
        lanes([&](llvm::Value* j) {
          llvm::Value* p = b_.CreateLoad(ty, partial(b_.getInt64(l), j));
          b_.CreateStore(firstPartial ? p : b_.CreateFAdd(b_.CreateLoad(ty, lane(j)), p), lane(j));
        });
        firstPartial = false;
      }
    } else {
      clear();
      emitReductionNest(reduction, 0, accumulate);
    }
  }

  /// Sums and products may be reassociated, so that the vectorizer can
  /// split them into lanes; results then differ from the sequential order
  /// in the last bits, well inside the tolerance backends are held to.
  llvm::Value* reassociable(llvm::Value* v) {
    if (auto* inst = llvm::dyn_cast<llvm::Instruction>(v)) inst->setHasAllowReassoc(true);
    return v;
  }

  /// argmax/argmin as the interpreter: start at element 0; NaN beats every
  /// number; among equals the first wins, or the last with selectLast.
  llvm::Value* emitArgReduce(const Expr& e) {
    const DType t = e.args[0]->type;
    const bool wantMax = e.reduce == ReduceKind::ArgMax;
    llvm::AllocaInst* bestIndex = entryAlloca(b_.getInt64Ty());
    llvm::AllocaInst* bestValue = entryAlloca(valueType(t));
    vars_[e.id] = b_.getInt64(0);
    b_.CreateStore(b_.getInt64(0), bestIndex);
    b_.CreateStore(emitExpr(*e.args[0]), bestValue);
    emitReductionLoops(e, 0, [&](llvm::Value* v) {
      llvm::Value* best = b_.CreateLoad(valueType(t), bestValue);
      llvm::Value* last = b_.getInt1(e.selectLast);
      llvm::Value* better;
      if (isFloat(t)) {
        llvm::Value* vNan = b_.CreateFCmpUNO(v, v);
        llvm::Value* bestNan = b_.CreateFCmpUNO(best, best);
        llvm::Value* nanCase = b_.CreateAnd(vNan, b_.CreateOr(b_.CreateNot(bestNan), last));
        llvm::Value* strict = wantMax ? b_.CreateFCmpOGT(v, best) : b_.CreateFCmpOLT(v, best);
        llvm::Value* numCase = b_.CreateOr(strict, b_.CreateAnd(last, b_.CreateFCmpOEQ(v, best)));
        better = b_.CreateSelect(b_.CreateOr(vNan, bestNan), nanCase, numCase);
      } else {
        llvm::Value* strict = emitBinary(wantMax ? BinaryFn::Gt : BinaryFn::Lt, t, v, best);
        better = b_.CreateOr(strict, b_.CreateAnd(last, b_.CreateICmpEQ(v, best)));
      }
      b_.CreateStore(b_.CreateSelect(better, v, best), bestValue);
      b_.CreateStore(b_.CreateSelect(better, vars_[e.id], b_.CreateLoad(b_.getInt64Ty(), bestIndex)), bestIndex);
    });
    return b_.CreateLoad(b_.getInt64Ty(), bestIndex);
  }

  const kir::Kernel& kernel_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  ScalarLibrary& scalars_;
  kir::ValueRanges ranges_;
  std::vector<llvm::Value*> buffers_;
  llvm::Value* begin_ = nullptr;
  llvm::Value* end_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::map<int, llvm::Value*> vars_;
  /// Reductions whose value is already computed (emitColumnReduction).
  std::map<const Expr*, llvm::Value*> overrides_;
  /// The loop variables of the loops being emitted, outermost first, and
  /// the row-invariant reductions computed before the innermost one, by
  /// reductionKey.
  std::vector<int> loopVars_;
  std::map<std::string, llvm::Value*> rowValues_;
  /// Loads read from a tile transposed in registers (emitRegisterTile).
  struct TransposedTile {
    llvm::Value* memory;
    int rowVar;
    int colVar;
    int64_t side;
  };
  std::map<const Expr*, TransposedTile> transposed_;
};

}  // namespace

Expected<std::unique_ptr<llvm::Module>> emitLlvmModule(const std::vector<kir::Kernel>& kernels,
                                                       llvm::LLVMContext& context) {
  auto module = std::make_unique<llvm::Module>("kiln", context);
  // One library per module: CpuJit gives each module its own context.
  auto scalars = ScalarLibrary::load(context);
  if (!scalars) return scalars.takeError();
  for (const kir::Kernel& k : kernels) {
    if (k.schedule.target == kCpuTargetName) {
      KernelEmitter(k, *module, **scalars).emit();
      continue;
    }
    // A kernel built without a target (a test's) gets the CPU's schedule.
    if (!k.schedule.target.empty())
      return Error("kernel '" + k.name + "' is scheduled for " + k.schedule.target + ", not for the CPU");
    kir::Kernel scheduled = k;
    scheduleForCpu(scheduled);
    KernelEmitter(scheduled, *module, **scalars).emit();
  }
  KILN_TRY((*scalars)->linkInto(*module));
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(*module, &os)) return Error("internal error: the LLVM IR of a kernel is invalid: " + os.str());
  return module;
}

}  // namespace kiln::codegen
