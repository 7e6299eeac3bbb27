// `if` and `loop` on concrete tensors (ControlFlow.h): the semantics of
// docs/ir.md's control-flow ops, shared by the interpreter and the CPU
// program's control-flow steps.
#include "runtime/ControlFlow.h"

#include <cstring>
#include <string>

namespace kiln {

namespace {

Expected<bool> readCondition(const Tensor& t, std::string_view what, const Location& loc) {
  if (t.dtype() != DType::Bool || t.rank() != 0)
    return Error(std::string(what) + " is " + t.type().str() + ", expected bool[]", loc);
  return t.data<uint8_t>()[0] != 0;
}

/// `rows` (each of one shape and dtype) stacked along a new leading dim.
Expected<Tensor> stack(const std::vector<Tensor>& rows, const TensorType& declared, size_t index, const Location& loc) {
  if (rows.empty()) {
    // No iteration ran: the stack is empty, with the declared row shape.
    if (declared.rank() < 1 || !isStaticShape(Shape(declared.shape.begin() + 1, declared.shape.end())))
      return Error("scan value " + std::to_string(index) + " of a loop that ran no iteration has type " +
                       declared.str() + ", whose rows have no static shape to make an empty result of",
                   loc);
    std::vector<int64_t> dims = staticDims(Shape(declared.shape.begin() + 1, declared.shape.end()));
    dims.insert(dims.begin(), 0);
    return Tensor(declared.dtype, std::move(dims));
  }
  const Tensor& first = rows.front();
  std::vector<int64_t> dims = first.shape();
  dims.insert(dims.begin(), static_cast<int64_t>(rows.size()));
  Tensor out(first.dtype(), std::move(dims));
  const size_t rowBytes = first.numBytes();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].dtype() != first.dtype() || rows[i].shape() != first.shape())
      return Error("scan value " + std::to_string(index) + " is " + rows[i].type().str() + " in iteration " +
                       std::to_string(i) + " but " + first.type().str() + " in iteration 0; the rows of a scan " +
                       "value must have one shape",
                   loc);
    if (rowBytes) std::memcpy(out.raw() + i * rowBytes, rows[i].raw(), rowBytes);
  }
  return out;
}

}  // namespace

Expected<std::vector<Tensor>> runIf(std::span<const Tensor* const> operands, size_t numResults,
                                    const BodyRunner& runBody, const Location& loc) {
  if (operands.empty()) return Error("'if' has no condition operand", loc);
  auto cond = readCondition(*operands[0], "the condition of 'if'", loc);
  if (!cond) return cond.takeError();
  std::vector<Tensor> inputs;
  for (size_t i = 1; i < operands.size(); ++i) inputs.push_back(*operands[i]);
  auto results = runBody(*cond ? 0 : 1, std::move(inputs));
  if (!results) return results.takeError();
  if (results->size() != numResults)
    return Error(std::string("the ") + (*cond ? "then" : "else") + " branch of 'if' returned " +
                     std::to_string(results->size()) + " values for " + std::to_string(numResults) + " results",
                 loc);
  return results;
}

Expected<std::vector<Tensor>> runLoop(std::span<const Tensor* const> operands, int64_t numCarried,
                                      std::span<const TensorType> resultTypes, const BodyRunner& runBody,
                                      const Location& loc) {
  if (operands.size() < 2 || numCarried < 0 || static_cast<size_t>(numCarried) > operands.size() - 2 ||
      resultTypes.size() < static_cast<size_t>(numCarried))
    return Error("'loop' has " + std::to_string(operands.size()) + " operands and " +
                     std::to_string(resultTypes.size()) + " results for " + std::to_string(numCarried) +
                     " carried values",
                 loc);
  const Tensor& bound = *operands[0];
  if (bound.dtype() != DType::I64 || bound.rank() != 0)
    return Error("the trip bound of 'loop' is " + bound.type().str() + ", expected i64[]", loc);
  const int64_t maxTrip = bound.data<int64_t>()[0];
  auto cond = readCondition(*operands[1], "the condition of 'loop'", loc);
  if (!cond) return cond.takeError();

  const size_t carriedEnd = 2 + static_cast<size_t>(numCarried);
  std::vector<Tensor> carried;
  for (size_t i = 2; i < carriedEnd; ++i) carried.push_back(*operands[i]);
  const size_t numScans = resultTypes.size() - static_cast<size_t>(numCarried);
  std::vector<std::vector<Tensor>> scans(numScans);

  bool running = *cond;
  for (int64_t i = 0; running && i < maxTrip; ++i) {
    if (i >= kMaxLoopIterations)
      return Error("'loop' ran " + std::to_string(kMaxLoopIterations) +
                       " iterations without its condition becoming false; stopped it as a loop that does not end",
                   loc);
    std::vector<Tensor> inputs;
    Tensor iteration(DType::I64, {});
    iteration.data<int64_t>()[0] = i;
    inputs.push_back(std::move(iteration));
    Tensor condition(DType::Bool, {});
    condition.data<uint8_t>()[0] = 1;
    inputs.push_back(std::move(condition));
    for (Tensor& t : carried) inputs.push_back(std::move(t));
    for (size_t c = carriedEnd; c < operands.size(); ++c) inputs.push_back(*operands[c]);
    auto outputs = runBody(0, std::move(inputs));
    if (!outputs) return outputs.takeError();
    if (outputs->size() != 1 + static_cast<size_t>(numCarried) + numScans)
      return Error("the body of 'loop' returned " + std::to_string(outputs->size()) + " values, expected " +
                       std::to_string(1 + numCarried + numScans) + " (the condition, " + std::to_string(numCarried) +
                       " carried and " + std::to_string(numScans) + " scan values)",
                   loc);
    auto next = readCondition((*outputs)[0], "the condition the body of 'loop' returned", loc);
    if (!next) return next.takeError();
    running = *next;
    carried.clear();
    for (int64_t c = 0; c < numCarried; ++c) carried.push_back(std::move((*outputs)[1 + c]));
    for (size_t s = 0; s < numScans; ++s) scans[s].push_back(std::move((*outputs)[1 + numCarried + s]));
  }

  std::vector<Tensor> results = std::move(carried);
  for (size_t s = 0; s < numScans; ++s) {
    auto stacked = stack(scans[s], resultTypes[numCarried + s], s, loc);
    if (!stacked) return stacked.takeError();
    results.push_back(std::move(*stacked));
  }
  return results;
}

}  // namespace kiln
