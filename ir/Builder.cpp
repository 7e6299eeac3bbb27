// Builder implementation.
#include "ir/Builder.h"

namespace kiln {

Builder::Builder(Function& f) : f_(&f), before_(f.returnOp()) {}

Op* Builder::create(OpKind kind, std::vector<Value*> operands, std::vector<TensorType> resultTypes,
                    AttrMap attrs) {
  return f_->insert(before_, Op::create(kind, std::move(operands), std::move(resultTypes),
                                        std::move(attrs), loc_));
}

Expected<Op*> Builder::build(OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                             std::vector<TensorType> declared) {
  std::vector<TensorType> operandTypes;
  for (Value* v : operands) operandTypes.push_back(v->type());
  ShapeQuery q{kind, operandTypes, &attrs, declared, loc_};
  auto types = inferResultTypes(q);
  if (!types) return types.takeError();
  return create(kind, std::move(operands), std::move(*types), std::move(attrs));
}

Expected<Value*> Builder::value(OpKind kind, std::vector<Value*> operands, AttrMap attrs,
                                std::vector<TensorType> declared) {
  auto op = build(kind, std::move(operands), std::move(attrs), std::move(declared));
  if (!op) return op.takeError();
  return (*op)->result(0);
}

Value* Builder::constant(DenseTensor t) {
  TensorType type = t.type;
  return create(OpKind::Constant, {}, {type}, {{"value", Attribute(std::move(t))}})->result(0);
}

Value* Builder::scalar(DType dtype, double v) {
  DenseTensor t = DenseTensor::zeros(TensorType{dtype, {}});
  t.setDouble(0, v);
  return constant(std::move(t));
}

Op* Builder::ret(std::vector<Value*> values) {
  std::vector<TensorType> types;
  for (Value* v : values) types.push_back(v->type());
  f_->setResultTypes(types);
  Op* op = f_->insert(nullptr, Op::create(OpKind::Return, std::move(values), {}, {}, loc_));
  before_ = op;
  return op;
}

}  // namespace kiln
