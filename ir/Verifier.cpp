// The verifier: the structural and type invariants of Kiln IR that the
// parser establishes and every pass must preserve. It walks each function
// once, reporting every problem it finds (each attached to the op or
// function it concerns) and returning the first, so a user sees all the
// problems of a file in one run. The checks are listed in ir/Verifier.h; the
// per-op type checks delegate to the shape rules, which the verifier runs
// only once the op's arity and attributes are known to be well formed. A
// region (the body of a `fused` op) is verified as a function of its own,
// plus what ties it to its op: its arguments take the operands' types, its
// results are the op's, it holds only primitives and it uses only its own
// values. The bodies of `if` and `loop` may hold any op; their arguments
// and results must admit the types the op passes and declares (Ops.def).
#include "ir/Verifier.h"

#include <set>
#include <string>
#include <unordered_set>

#include "ir/ShapeRules.h"

namespace kiln {

namespace {

/// `%name` when the value has a name, else a description by position.
std::string describeValue(const Value* v, const std::string& fallback) {
  return v->name().empty() ? fallback : "%" + v->name();
}

/// `1 operand`, `2 operands`.
std::string count(size_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

/// Verifies one function, collecting every error.
class FunctionVerifier {
 public:
  /// `owner` is the op whose region `f` is, or null for a module's function.
  FunctionVerifier(const Function& f, const DiagnosticHandler& report, const Op* owner = nullptr)
      : f_(f), report_(report), owner_(owner) {}

  Status run() {
    collectValues();
    checkValueNames();
    checkSignature();
    for (Value* arg : f_.arguments()) defined_.insert(arg);
    for (const auto& op : f_.ops()) {
      checkOperands(*op);
      if (checkArity(*op) && checkAttributes(*op)) checkTypes(*op);
      checkRegion(*op);
      for (Value* r : op->results()) defined_.insert(r);
    }
    checkReturn();
    if (first_) return *first_;
    return Status::success();
  }

 private:
  void emit(Error e) {
    if (report_) report_(e);
    if (!first_) first_ = std::move(e);
  }
  /// What messages call the function: `function @f` or `the region of 'fused'`.
  std::string subject() const {
    return owner_ ? "the region of '" + std::string(owner_->name()) + "'" : "function @" + f_.name();
  }
  Error functionError(const std::string& message) const {
    if (owner_) return owner_->emitError("region " + message);
    return Error(subject() + " " + message, f_.loc());
  }

  /// An op owns a region exactly when the op table says it does; the region
  /// matches the op and holds only primitives, and is verified in itself.
  void checkRegion(const Op& op) {
    const Function* region = op.region();
    if (!op.info().hasRegion()) {
      if (region) emit(op.emitError("cannot have a region"));
      return;
    }
    if (op.info().isControlFlow()) {
      checkControlFlow(op);
      return;
    }
    if (op.numRegions() > 1) emit(op.emitError("has " + count(op.numRegions(), "region") + ", expected 1"));
    if (!region) {
      emit(op.emitError("requires a region"));
      return;
    }
    if (region->numArguments() != op.numOperands()) {
      emit(op.emitError("has " + count(op.numOperands(), "operand") + " but its region has " +
                        count(region->numArguments(), "argument")));
    } else {
      for (size_t i = 0; i < op.numOperands(); ++i) {
        const Value* operand = op.operand(i);
        const TensorType& argType = region->argument(i)->type();
        if (operand && operand->type() != argType)
          emit(op.emitError("region argument " + std::to_string(i) + " has type " + argType.str() + " but operand " +
                            std::to_string(i) + " is " + operand->type().str()));
      }
    }
    std::vector<TensorType> resultTypes;
    for (Value* r : op.results()) resultTypes.push_back(r->type());
    if (region->resultTypes() != resultTypes)
      emit(op.emitError("region result types do not match the op's result types"));
    // A library call takes whole activations (`gelu`) as post-ops; other
    // groups are kernels made of primitives.
    const bool library = op.attr("kind") && op.attr("kind")->kind() == AttrKind::String &&
                         op.getString("kind") == "library";
    for (const auto& inner : region->ops()) {
      if (inner->info().hasRegion() || inner->kind() == OpKind::Check)
        emit(inner->emitError("is not allowed in a region: regions hold only primitive ops"));
      else if (inner->info().isComposite() && !library)
        emit(inner->emitError("is not allowed in a region: regions hold only primitive ops (composites only in a "
                              "library group)"));
    }
    // The region's own errors go to the same handler; only its first is kept here.
    if (Status s = FunctionVerifier(*region, report_, &op).run(); !s && !first_) first_ = s.takeError();
  }

  /// `what` of a body admits type `want`: same dtype and rank, compatible dims.
  void expectAdmits(const Op& op, const std::string& what, const TensorType& got, const TensorType& want) {
    if (!typesCompatible(got, want))
      emit(op.emitError(what + " has type " + got.str() + ", which does not admit " + want.str()));
  }

  /// The regions of `if` and `loop` against the op (Ops.def): how many, their
  /// arguments and results; then each body is verified in itself.
  void checkControlFlow(const Op& op) {
    const bool isIf = op.kind() == OpKind::If;
    const size_t wantRegions = isIf ? 2 : 1;
    if (op.numRegions() != wantRegions) {
      emit(op.emitError("has " + count(op.numRegions(), "region") + ", expected " + std::to_string(wantRegions) +
                        (isIf ? " (then and else)" : " (the body)")));
      return;
    }
    if (isIf) {
      for (size_t b = 0; b < 2; ++b) {
        const Function& body = *op.region(b);
        const std::string name = b == 0 ? "the then branch" : "the else branch";
        if (body.numArguments() != op.numOperands() - 1) {
          emit(op.emitError("has " + count(op.numOperands() - 1, "captured operand") + " but " + name + " has " +
                            count(body.numArguments(), "argument")));
        } else {
          for (size_t i = 1; i < op.numOperands(); ++i)
            if (op.operand(i))
              expectAdmits(op, name + "'s argument " + std::to_string(i - 1), body.argument(i - 1)->type(),
                           op.operand(i)->type());
        }
        if (body.resultTypes().size() != op.numResults()) {
          emit(op.emitError("has " + count(op.numResults(), "result") + " but " + name + " returns " +
                            std::to_string(body.resultTypes().size())));
        } else {
          for (size_t i = 0; i < op.numResults(); ++i)
            expectAdmits(op, "result " + std::to_string(i), op.result(i)->type(), body.resultTypes()[i]);
        }
      }
    } else {
      checkLoopBody(op, *op.region());
    }
    for (size_t b = 0; b < op.numRegions(); ++b)
      if (Status s = FunctionVerifier(*op.region(b), report_, &op).run(); !s && !first_) first_ = s.takeError();
  }

  /// A loop body takes (i64[] iteration, bool[] condition, carried...,
  /// captures...) and returns (bool[] condition, carried..., scans...); each
  /// result of the op is a carried value or a scan value with a leading dim.
  void checkLoopBody(const Op& op, const Function& body) {
    const Attribute* attr = op.attr("num_carried");
    if (!attr || attr->kind() != AttrKind::Int) return;  // checkAttributes reported it
    const int64_t carried = attr->getInt();
    if (carried < 0 || carried + 2 > static_cast<int64_t>(op.numOperands()) ||
        carried > static_cast<int64_t>(op.numResults()))
      return;  // the shape rule reported it
    const size_t n = static_cast<size_t>(carried);
    const TensorType iterType{DType::I64, {}};
    const TensorType condType{DType::Bool, {}};
    if (body.numArguments() != op.numOperands()) {
      emit(op.emitError("has " + count(op.numOperands(), "operand") + " but its body has " +
                        count(body.numArguments(), "argument") + " (the iteration number, the condition, then one " +
                        "per carried value and capture)"));
    } else {
      if (body.argument(0)->type() != iterType)
        emit(op.emitError("body argument 0 (the iteration number) is " + body.argument(0)->type().str() +
                          ", expected i64[]"));
      if (body.argument(1)->type() != condType)
        emit(op.emitError("body argument 1 (the condition) is " + body.argument(1)->type().str() + ", expected bool[]"));
      for (size_t i = 2; i < op.numOperands(); ++i)
        if (op.operand(i))
          expectAdmits(op, "body argument " + std::to_string(i), body.argument(i)->type(), op.operand(i)->type());
    }
    const size_t scans = op.numResults() - n;
    const std::vector<TensorType>& returned = body.resultTypes();
    if (returned.size() != 1 + n + scans) {
      emit(op.emitError("has " + count(n, "carried value") + " and " + count(scans, "scan result") +
                        " but its body returns " + std::to_string(returned.size()) + " values, expected " +
                        std::to_string(1 + n + scans) + " (the condition first)"));
      return;
    }
    if (returned[0] != condType)
      emit(op.emitError("body result 0 (the next condition) is " + returned[0].str() + ", expected bool[]"));
    for (size_t c = 0; c < n; ++c) {
      if (body.numArguments() == op.numOperands())
        expectAdmits(op, "body argument " + std::to_string(2 + c), body.argument(2 + c)->type(), returned[1 + c]);
      expectAdmits(op, "result " + std::to_string(c), op.result(c)->type(), returned[1 + c]);
    }
    for (size_t s = 0; s < scans; ++s) {
      const TensorType& row = returned[1 + n + s];
      TensorType stacked = row;
      stacked.shape.insert(stacked.shape.begin(), Dim::unknown());
      expectAdmits(op, "scan result " + std::to_string(n + s), op.result(n + s)->type(), stacked);
    }
  }

  void collectValues() {
    for (Value* arg : f_.arguments()) inFunction_.insert(arg);
    for (const auto& op : f_.ops())
      for (Value* r : op->results()) inFunction_.insert(r);
  }

  /// Argument defaults fit their arguments; result names are unique.
  void checkSignature() {
    for (size_t i = 0; i < f_.numArguments(); ++i) {
      const DenseTensor* d = f_.argumentDefault(i);
      const Value* arg = f_.argument(i);
      if (!d) continue;
      if (!d->type.isStatic() || !typesCompatible(d->type, arg->type()) ||
          d->bytes.size() != static_cast<size_t>(d->numElements()) * dtypeSize(d->type.dtype))
        emit(functionError("argument " + describeValue(arg, "#" + std::to_string(i)) + " has a default of type " +
                           d->type.str() + " that does not fit its type " + arg->type().str()));
    }
    std::set<std::string> names;
    for (size_t i = 0; i < f_.resultTypes().size(); ++i)
      if (!f_.resultName(i).empty() && !names.insert(f_.resultName(i)).second)
        emit(functionError("has two results named \"" + f_.resultName(i) + "\""));
    // A donated argument's buffer receives one result of its own type.
    std::set<int> aliased;
    for (size_t i = 0; i < f_.resultTypes().size(); ++i) {
      const int a = f_.resultAlias(i);
      if (a < 0) continue;
      if (static_cast<size_t>(a) >= f_.numArguments()) {
        emit(functionError("result " + std::to_string(i) + " aliases argument " + std::to_string(a) + ", but @" +
                           f_.name() + " has " + std::to_string(f_.numArguments()) + " arguments"));
        continue;
      }
      const Value* arg = f_.argument(static_cast<size_t>(a));
      if (arg->type() != f_.resultTypes()[i])
        emit(functionError("result " + std::to_string(i) + " of type " + f_.resultTypes()[i].str() + " aliases " +
                           describeValue(arg, "#" + std::to_string(a)) + " of another type, " + arg->type().str()));
      if (!aliased.insert(a).second)
        emit(functionError("argument " + describeValue(arg, "#" + std::to_string(a)) +
                           " is aliased by two results"));
    }
  }

  void checkValueNames() {
    std::set<std::string> names;
    for (Value* arg : f_.arguments())
      if (!arg->name().empty() && !names.insert(arg->name()).second)
        emit(functionError("has two arguments named %" + arg->name()));
    for (const auto& op : f_.ops())
      for (Value* r : op->results())
        if (!r->name().empty() && !names.insert(r->name()).second)
          emit(op->emitError("result %" + r->name() + " redefines a value name already used in " +
                           (owner_ ? "its region" : "@" + f_.name())));
  }

  void checkOperands(const Op& op) {
    for (size_t i = 0; i < op.numOperands(); ++i) {
      const Value* v = op.operand(i);
      std::string what = "operand " + std::to_string(i);
      if (!v) {
        emit(op.emitError(what + " is null"));
      } else if (!defined_.count(v)) {
        if (inFunction_.count(v))
          emit(op.emitError("use of value " + describeValue(v, what) + " before its definition"));
        else if (owner_)
          emit(op.emitError(what + " (" + describeValue(v, "unnamed") +
                            ") is defined outside its region; a region uses only its arguments and its own values"));
        else
          emit(op.emitError(what + " (" + describeValue(v, "unnamed") + ") is defined in another function"));
      }
    }
  }

  bool checkArity(const Op& op) {
    const OpInfo& info = op.info();
    int operands = static_cast<int>(op.numOperands());
    bool ok = true;
    if (operands < info.minOperands || (info.maxOperands >= 0 && operands > info.maxOperands)) {
      std::string expected = info.maxOperands < 0 ? "at least " + std::to_string(info.minOperands)
                             : info.minOperands == info.maxOperands
                                 ? std::to_string(info.minOperands)
                                 : std::to_string(info.minOperands) + " to " + std::to_string(info.maxOperands);
      emit(op.emitError("has " + count(op.numOperands(), "operand") + ", expected " + expected));
      ok = false;
    }
    if (info.numResults >= 0 && static_cast<int>(op.numResults()) != info.numResults) {
      emit(op.emitError("has " + count(op.numResults(), "result") + ", expected " + std::to_string(info.numResults)));
      ok = false;
    }
    return ok;
  }

  bool checkAttributes(const Op& op) {
    const OpInfo& info = op.info();
    bool ok = true;
    for (const auto& [name, value] : op.attrs()) {
      const AttrSpec* spec = info.findAttr(name);
      if (!spec) {
        std::string valid;
        for (const AttrSpec& s : info.attrs) valid += (valid.empty() ? "'" : ", '") + std::string(s.name) + "'";
        emit(op.emitError("has unknown attribute '" + name + "'" +
                          (valid.empty() ? " (it takes no attributes)" : "; valid attributes: " + valid)));
        ok = false;
      } else if (value.kind() != spec->kind) {
        emit(op.emitError("attribute '" + name + "' must be " + std::string(attrKindName(spec->kind)) + ", got " +
                          std::string(attrKindName(value.kind()))));
        ok = false;
      }
    }
    for (const AttrSpec& spec : info.attrs)
      if (spec.required && !op.attrs().count(std::string(spec.name))) {
        emit(op.emitError("requires attribute '" + std::string(spec.name) + "'"));
        ok = false;
      }
    return ok;
  }

  void checkTypes(const Op& op) {
    for (Value* v : op.operands())
      if (!v) return;  // already reported
    auto inferred = inferResultTypes(op);
    if (!inferred) {
      emit(inferred.takeError());
      return;
    }
    if (inferred->size() != op.numResults()) {
      emit(op.emitError("has " + count(op.numResults(), "result") + ", but its shape rule gives " +
                        std::to_string(inferred->size())));
      return;
    }
    for (size_t i = 0; i < inferred->size(); ++i) {
      const TensorType& declared = op.result(i)->type();
      if (!typesCompatible(declared, (*inferred)[i]))
        emit(op.emitError("result " + std::to_string(i) + " type " + declared.str() + " does not match inferred " +
                          (*inferred)[i].str()));
    }
  }

  void checkReturn() {
    const Op* last = f_.ops().empty() ? nullptr : f_.ops().back().get();
    for (const auto& op : f_.ops())
      if (op->kind() == OpKind::Return && op.get() != last)
        emit(op->emitError("must be the last op of " + subject()));
    if (!last || last->kind() != OpKind::Return) {
      emit(functionError("does not end with 'return'"));
      return;
    }
    const auto& expected = f_.resultTypes();
    // A control-flow body declares its own result types; a fused region's are its op's.
    const bool body = owner_ && owner_->info().isControlFlow();
    if (last->numOperands() != expected.size()) {
      emit(last->emitError("returns " + count(last->numOperands(), "value") + ", but " +
                           (body ? "its body declares "
                            : owner_ ? "its '" + std::string(owner_->name()) + "' op has "
                                     : "@" + f_.name() + " declares ") +
                           count(expected.size(), "result")));
      return;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      const Value* v = last->operand(i);
      if (v && !typesCompatible(v->type(), expected[i]))
        emit(last->emitError("operand " + std::to_string(i) + " type " + v->type().str() + " does not match " +
                             (body ? "the body's" : owner_ ? "the op's" : "the function's") + " result type " +
                             expected[i].str()));
    }
  }

  const Function& f_;
  const DiagnosticHandler& report_;
  const Op* owner_;
  std::unordered_set<const Value*> inFunction_;
  std::unordered_set<const Value*> defined_;
  std::optional<Error> first_;
};

}  // namespace

Status verify(const Function& f, const DiagnosticHandler& report) { return FunctionVerifier(f, report).run(); }

Status verify(const Module& m, const DiagnosticHandler& report) {
  std::optional<Error> first;
  auto emit = [&](Error e) {
    if (report) report(e);
    if (!first) first = std::move(e);
  };
  std::set<std::string> names;
  for (const auto& f : m.functions()) {
    if (!names.insert(f->name()).second)
      emit(Error("function @" + f->name() + " is already defined in this module", f->loc()));
    // Each function reports its own errors; only its first is needed here.
    if (Status s = verify(*f, report); !s && !first) first = s.takeError();
  }
  if (first) return *first;
  return Status::success();
}

}  // namespace kiln
