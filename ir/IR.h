// The in-memory IR: a Module holds Functions; a Function holds its argument
// Values and a list of Ops in topological order ending in `return`; an Op has
// operand Values, result Values, attributes, a location and, for `fused`,
// `if` and `loop`, regions: unnamed Functions whose arguments take (some of)
// the op's operands and whose `return`s give its results. A region uses only
// its own arguments and values (an `if` or `loop` passes the outer values its
// bodies read as operands), so passes see every use as an operand. Values
// keep their users so that passes can replace and erase in O(uses).
#pragma once

#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/Attributes.h"
#include "ir/OpTable.h"
#include "ir/Support.h"
#include "ir/Types.h"

namespace kiln {

class Function;
class Op;

/// An SSA value: a function argument or an op result.
class Value {
 public:
  const TensorType& type() const { return type_; }
  void setType(TensorType type) { type_ = std::move(type); }
  /// Name hint used by the printer (without `%`); may be empty.
  const std::string& name() const { return name_; }
  void setName(std::string name) { name_ = std::move(name); }

  /// The op producing this value, or null for a function argument.
  Op* definingOp() const { return def_; }
  bool isArgument() const { return def_ == nullptr; }
  /// Result number for an op result, argument number for an argument.
  int index() const { return index_; }

  /// Ops using this value, once per use.
  const std::vector<Op*>& users() const { return users_; }
  bool hasUses() const { return !users_.empty(); }
  /// Makes every user of this value use `other` instead.
  void replaceAllUsesWith(Value* other);

 private:
  friend class Op;
  friend class Function;
  Value(TensorType type, std::string name, Op* def, int index)
      : type_(std::move(type)), name_(std::move(name)), def_(def), index_(index) {}
  void removeUser(Op* op);

  TensorType type_;
  std::string name_;
  Op* def_;
  int index_;
  std::vector<Op*> users_;
};

/// One operation. Create with Op::create or a Builder; a Function owns it.
class Op {
 public:
  static std::unique_ptr<Op> create(OpKind kind, std::vector<Value*> operands,
                                    std::vector<TensorType> resultTypes, AttrMap attrs = {},
                                    Location loc = {});
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  OpKind kind() const { return kind_; }
  const OpInfo& info() const { return opInfo(kind_); }
  std::string_view name() const { return opName(kind_); }
  Function* parent() const { return parent_; }

  size_t numOperands() const { return operands_.size(); }
  Value* operand(size_t i) const { return operands_[i]; }
  std::span<Value* const> operands() const { return operands_; }
  void setOperand(size_t i, Value* v);
  void setOperands(std::vector<Value*> operands);

  size_t numResults() const { return results_.size(); }
  Value* result(size_t i = 0) const { return results_[i].get(); }
  std::vector<Value*> results() const;
  /// Appends a result of `type`, keeping the others and their uses: a
  /// rewrite that widens an op in place (the VJP of `loop` makes the forward
  /// loop also stack what its backward reads).
  Value* addResult(TensorType type);
  /// True when some result of this op has a user.
  bool hasUses() const;

  const AttrMap& attrs() const { return attrs_; }
  void setAttr(const std::string& name, Attribute value) { attrs_[name] = std::move(value); }
  void removeAttr(const std::string& name) { attrs_.erase(name); }
  /// The attribute if set, else the op table's default, else null.
  const Attribute* attr(std::string_view name) const;
  int64_t getInt(std::string_view name) const { return attr(name)->getInt(); }
  double getFloat(std::string_view name) const { return attr(name)->getFloat(); }
  bool getBool(std::string_view name) const { return attr(name)->getBool(); }
  const std::string& getString(std::string_view name) const { return attr(name)->getString(); }
  const std::vector<int64_t>& getInts(std::string_view name) const { return attr(name)->getInts(); }
  const std::vector<double>& getFloats(std::string_view name) const { return attr(name)->getFloats(); }
  const DenseTensor& getTensor(std::string_view name) const { return attr(name)->getTensor(); }

  const Location& loc() const { return loc_; }
  void setLoc(Location loc) { loc_ = std::move(loc); }
  /// An error attached to this op's location, naming the op.
  Error emitError(const std::string& message) const;

  /// Region `i` (the body of a `fused` op or a `loop`; an `if`'s then
  /// (0) and else (1) branches), or null when the op has no such region.
  /// Its ops may use only its own arguments and values (the verifier checks
  /// that).
  Function* region(size_t i = 0) const { return i < regions_.size() ? regions_[i].get() : nullptr; }
  size_t numRegions() const { return regions_.size(); }
  /// Makes `body` this op's only region (replacing any previous ones).
  void setRegion(std::unique_ptr<Function> body);
  /// Appends `body` as this op's next region.
  void addRegion(std::unique_ptr<Function> body);

 private:
  friend class Function;
  Op(OpKind kind, AttrMap attrs, Location loc);

  OpKind kind_;
  std::vector<Value*> operands_;
  std::vector<std::unique_ptr<Value>> results_;
  AttrMap attrs_;
  Location loc_;
  std::vector<std::unique_ptr<Function>> regions_;
  Function* parent_ = nullptr;
  std::list<std::unique_ptr<Op>>::iterator self_;
};

/// normalizeAxis (Types.h) for an axis of `op`, or an error on `op` naming
/// the axis and the rank: for the interpreter's kernels and the rewrites
/// and lowerings of ops, which meet axes the verifier may not have seen.
Expected<int64_t> checkedAxis(const Op& op, int64_t axis, int64_t rank);

using OpList = std::list<std::unique_ptr<Op>>;

/// A function: arguments, result types and a body of ops ending in `return`.
class Function {
 public:
  explicit Function(std::string name) : name_(std::move(name)) {}
  ~Function();
  Function(const Function&) = delete;
  Function& operator=(const Function&) = delete;

  const std::string& name() const { return name_; }
  void setName(std::string name) { name_ = std::move(name); }
  const Location& loc() const { return loc_; }
  void setLoc(Location loc) { loc_ = std::move(loc); }

  size_t numArguments() const { return args_.size(); }
  Value* argument(size_t i) const { return args_[i].get(); }
  std::vector<Value*> arguments() const;
  Value* addArgument(TensorType type, std::string name = {});
  /// Removes an unused argument (and its default).
  void eraseArgument(size_t i);

  /// The value an argument takes when the caller does not bind it (an ONNX
  /// graph input that also has an initializer), or null when it is required.
  const DenseTensor* argumentDefault(size_t i) const { return argDefaults_[i].get(); }
  void setArgumentDefault(size_t i, std::shared_ptr<const DenseTensor> value) { argDefaults_[i] = std::move(value); }

  const std::vector<TensorType>& resultTypes() const { return resultTypes_; }
  /// Sets the result types; result names and aliases are kept where they
  /// still apply.
  void setResultTypes(std::vector<TensorType> types) {
    resultTypes_ = std::move(types);
    resultNames_.resize(resultTypes_.size());
    resultAliases_.resize(resultTypes_.size(), -1);
  }
  /// The name callers know result `i` by (a model's graph output name), or
  /// empty when the result is unnamed.
  const std::string& resultName(size_t i) const { return resultNames_[i]; }
  void setResultName(size_t i, std::string name) { resultNames_[i] = std::move(name); }
  /// The argument that result `i` is written into (`-> (f32[4] aliases %w)`):
  /// the caller donates that argument's buffer, which then holds the result
  /// after a call, as a training step updates its parameters in place. -1
  /// when the result has a buffer of its own.
  int resultAlias(size_t i) const { return resultAliases_[i]; }
  void setResultAlias(size_t i, int argument) { resultAliases_[i] = argument; }

  const OpList& ops() const { return ops_; }
  bool empty() const { return ops_.empty(); }
  /// The terminating `return`, or null while the body is incomplete.
  Op* returnOp() const;
  /// Inserts `op` before `before` (at the end when null) and returns it.
  Op* insert(Op* before, std::unique_ptr<Op> op);
  /// Removes and destroys `op`; its results must have no uses.
  void erase(Op* op);
  /// Removes `op` from the body without destroying it, so that it can be
  /// inserted elsewhere (into a region); its operands and uses are kept.
  std::unique_ptr<Op> take(Op* op);
  /// Moves `op` to just before `before` (to the end when null).
  void moveBefore(Op* op, Op* before);

  /// The op whose region this function is, or null for a module's function.
  Op* parentOp() const { return parentOp_; }
  /// A copy of this function (arguments with their defaults, result types
  /// and names, ops with their attributes, locations, name hints and
  /// regions) whose values are its own.
  std::unique_ptr<Function> clone() const;

 private:
  friend class Op;
  std::string name_;
  Location loc_;
  std::vector<std::unique_ptr<Value>> args_;
  std::vector<std::shared_ptr<const DenseTensor>> argDefaults_;
  std::vector<TensorType> resultTypes_;
  std::vector<std::string> resultNames_;
  std::vector<int> resultAliases_;
  OpList ops_;
  Op* parentOp_ = nullptr;
};

/// A translation unit: an ordered list of functions with unique names.
class Module {
 public:
  const std::vector<std::unique_ptr<Function>>& functions() const { return functions_; }
  Function* lookup(std::string_view name) const;
  Function* addFunction(std::string name);
  void addFunction(std::unique_ptr<Function> f) { functions_.push_back(std::move(f)); }

 private:
  std::vector<std::unique_ptr<Function>> functions_;
};

}  // namespace kiln
