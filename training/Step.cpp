// Building and feeding one training step (Step.h).
#include "training/Step.h"

#include "ir/Builder.h"

namespace kiln::training {

Status makeTrainingStep(Function& f, const TrainingStepOptions& options, bool classesLast) {
  if (classesLast && !f.resultTypes().empty() && f.resultTypes()[0].rank() > 2) {
    // [N, T..., C] -> [N, C, T...]: the class axis where the loss ops read it.
    const int64_t rank = f.resultTypes()[0].rank();
    std::vector<int64_t> perm = {0, rank - 1};
    for (int64_t d = 1; d < rank - 1; ++d) perm.push_back(d);
    Builder b(f);
    auto transposed = b.value(OpKind::Transpose, {f.returnOp()->operand(0)}, {{"perm", Attribute(perm)}});
    if (!transposed) return transposed.takeError();
    std::vector<Value*> results(f.returnOp()->operands().begin(), f.returnOp()->operands().end());
    results[0] = *transposed;
    std::vector<TensorType> types = f.resultTypes();
    types[0] = (*transposed)->type();
    f.returnOp()->setOperands(results);
    f.setResultTypes(types);
  }
  return buildTrainingStep(f, options);
}

TrainState initialState(const Function& step) {
  TrainState state;
  const size_t numState = step.resultTypes().size() - 1;
  for (size_t i = 0; i < numState; ++i) {
    state.names.push_back(step.argument(i)->name());
    state.values.push_back(Tensor::fromDense(*step.argumentDefault(i)));
  }
  return state;
}

Tensor learningRateTensor(DType dtype, double lr) {
  Tensor t(dtype, {});
  t.setDouble(0, lr);
  return t;
}

Expected<std::vector<Tensor>> bindStepInputs(const Function& step, std::vector<Tensor>&& leading, StepFeed feed) {
  // The other arguments first, checked, so that an error leaves `leading`
  // untouched.
  std::vector<Tensor> rest;
  for (size_t i = leading.size(); i < step.numArguments(); ++i) {
    const Value* a = step.argument(i);
    const std::string& name = a->name();
    if (name == "labels") {
      rest.push_back(std::move(feed.labels));
    } else if (name == "lr") {
      rest.push_back(std::move(feed.lr));
    } else if (auto it = feed.inputs.find(name); it != feed.inputs.end()) {
      rest.push_back(std::move(it->second));
    } else if (const DenseTensor* d = step.argumentDefault(i)) {
      rest.push_back(Tensor::fromDense(*d));
    } else {
      return Error("no value for the model input '" + name + "' (" + a->type().str() + ")");
    }
    if (rest.back().type() != a->type())
      return Error("'" + name + "' is " + rest.back().type().str() + ", the training step expects " + a->type().str());
  }
  std::vector<Tensor> in = std::move(leading);
  leading.clear();
  in.insert(in.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return in;
}

}  // namespace kiln::training
