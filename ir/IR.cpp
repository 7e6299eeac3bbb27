// Use-list maintenance and ownership for Values, Ops and Functions.
#include "ir/IR.h"

#include <algorithm>
#include <unordered_map>

namespace kiln {

void Value::removeUser(Op* op) {
  auto it = std::find(users_.begin(), users_.end(), op);
  assert(it != users_.end() && "use list out of sync");
  users_.erase(it);
}

void Value::replaceAllUsesWith(Value* other) {
  if (other == this) return;
  // Each setOperand call removes one entry from users_.
  while (!users_.empty()) {
    Op* user = users_.back();
    for (size_t i = 0; i < user->numOperands(); ++i)
      if (user->operand(i) == this) user->setOperand(i, other);
  }
}

std::unique_ptr<Op> Op::create(OpKind kind, std::vector<Value*> operands,
                               std::vector<TensorType> resultTypes, AttrMap attrs, Location loc) {
  std::unique_ptr<Op> op(new Op(kind, std::move(attrs), std::move(loc)));
  op->setOperands(std::move(operands));
  for (size_t i = 0; i < resultTypes.size(); ++i)
    op->results_.push_back(std::unique_ptr<Value>(
        new Value(std::move(resultTypes[i]), {}, op.get(), static_cast<int>(i))));
  return op;
}

Op::Op(OpKind kind, AttrMap attrs, Location loc) : kind_(kind), attrs_(std::move(attrs)), loc_(std::move(loc)) {}

Op::~Op() {
  // The regions go first: their ops use only their own values.
  regions_.clear();
  for (Value* v : operands_)
    if (v) v->removeUser(this);
#ifndef NDEBUG
  for (auto& r : results_) assert(!r->hasUses() && "destroying an op whose results are still used");
#endif
}

void Op::setOperand(size_t i, Value* v) {
  if (operands_[i]) operands_[i]->removeUser(this);
  operands_[i] = v;
  if (v) v->users_.push_back(this);
}

void Op::setOperands(std::vector<Value*> operands) {
  for (Value* v : operands_)
    if (v) v->removeUser(this);
  operands_ = std::move(operands);
  for (Value* v : operands_)
    if (v) v->users_.push_back(this);
}

std::vector<Value*> Op::results() const {
  std::vector<Value*> out;
  for (auto& r : results_) out.push_back(r.get());
  return out;
}

bool Op::hasUses() const {
  for (auto& r : results_)
    if (r->hasUses()) return true;
  return false;
}

void Op::setRegion(std::unique_ptr<Function> body) {
  regions_.clear();
  if (body) addRegion(std::move(body));
}

Value* Op::addResult(TensorType type) {
  results_.push_back(std::unique_ptr<Value>(new Value(std::move(type), {}, this, static_cast<int>(results_.size()))));
  return results_.back().get();
}

void Op::addRegion(std::unique_ptr<Function> body) {
  body->parentOp_ = this;
  regions_.push_back(std::move(body));
}

const Attribute* Op::attr(std::string_view name) const {
  auto it = attrs_.find(std::string(name));
  if (it != attrs_.end()) return &it->second;
  if (const AttrSpec* spec = info().findAttr(name); spec && !spec->required) return &spec->defaultValue;
  return nullptr;
}

Expected<int64_t> checkedAxis(const Op& op, int64_t axis, int64_t rank) {
  if (auto a = normalizeAxis(axis, rank)) return *a;
  return op.emitError("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
}

Error Op::emitError(const std::string& message) const {
  return Error("'" + std::string(name()) + "' " + message, loc_);
}

Function::~Function() {
  // Destroy users before the values they use.
  while (!ops_.empty()) {
    for (auto& r : ops_.back()->results_) r->users_.clear();
    ops_.back()->operands_.clear();
    ops_.pop_back();
  }
}

std::vector<Value*> Function::arguments() const {
  std::vector<Value*> out;
  for (auto& a : args_) out.push_back(a.get());
  return out;
}

Value* Function::addArgument(TensorType type, std::string name) {
  args_.push_back(std::unique_ptr<Value>(
      new Value(std::move(type), std::move(name), nullptr, static_cast<int>(args_.size()))));
  argDefaults_.emplace_back();
  return args_.back().get();
}

void Function::eraseArgument(size_t i) {
  assert(!args_[i]->hasUses() && "erasing a used argument");
  args_.erase(args_.begin() + static_cast<ptrdiff_t>(i));
  argDefaults_.erase(argDefaults_.begin() + static_cast<ptrdiff_t>(i));
  for (size_t j = i; j < args_.size(); ++j) args_[j]->index_ = static_cast<int>(j);
  for (int& alias : resultAliases_) {
    if (alias == static_cast<int>(i))
      alias = -1;
    else if (alias > static_cast<int>(i))
      --alias;
  }
}

Op* Function::returnOp() const {
  if (ops_.empty() || ops_.back()->kind() != OpKind::Return) return nullptr;
  return ops_.back().get();
}

Op* Function::insert(Op* before, std::unique_ptr<Op> op) {
  auto pos = before ? before->self_ : ops_.end();
  Op* raw = op.get();
  raw->parent_ = this;
  raw->self_ = ops_.insert(pos, std::move(op));
  return raw;
}

void Function::erase(Op* op) {
  assert(op->parent_ == this);
  ops_.erase(op->self_);
}

std::unique_ptr<Op> Function::take(Op* op) {
  assert(op->parent_ == this);
  std::unique_ptr<Op> owned = std::move(*op->self_);
  ops_.erase(op->self_);
  owned->parent_ = nullptr;
  return owned;
}

void Function::moveBefore(Op* op, Op* before) {
  auto pos = before ? before->self_ : ops_.end();
  ops_.splice(pos, ops_, op->self_);
}

std::unique_ptr<Function> Function::clone() const {
  auto copy = std::make_unique<Function>(name_);
  copy->setLoc(loc_);
  std::unordered_map<const Value*, Value*> map;
  for (size_t i = 0; i < args_.size(); ++i) {
    map[args_[i].get()] = copy->addArgument(args_[i]->type(), args_[i]->name());
    copy->argDefaults_[i] = argDefaults_[i];  // immutable, so shared
  }
  for (const auto& op : ops_) {
    std::vector<Value*> operands;
    for (Value* v : op->operands()) {
      // A value from elsewhere (invalid IR) stays as it is; the verifier reports it.
      auto it = map.find(v);
      operands.push_back(it == map.end() ? v : it->second);
    }
    std::vector<TensorType> types;
    for (const auto& r : op->results_) types.push_back(r->type());
    Op* c = copy->insert(nullptr, Op::create(op->kind(), std::move(operands), std::move(types), op->attrs_, op->loc_));
    for (size_t i = 0; i < op->numResults(); ++i) {
      c->result(i)->setName(op->result(i)->name());
      map[op->result(i)] = c->result(i);
    }
    for (const auto& region : op->regions_) c->addRegion(region->clone());
  }
  copy->resultTypes_ = resultTypes_;
  copy->resultNames_ = resultNames_;
  copy->resultAliases_ = resultAliases_;
  return copy;
}

Function* Module::lookup(std::string_view name) const {
  for (auto& f : functions_)
    if (f->name() == name) return f.get();
  return nullptr;
}

Function* Module::addFunction(std::string name) {
  functions_.push_back(std::make_unique<Function>(std::move(name)));
  return functions_.back().get();
}

}  // namespace kiln
