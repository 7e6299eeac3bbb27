// Helpers shared by the unit tests of the ONNX importer (OnnxImporterTest,
// OnnxNNOpsTest, OnnxSignalOpsTest, OnnxVisionOpsTest): building a
// ModelProto by hand (graph inputs and outputs, nodes, attributes,
// initializers), importing it with constant folding on the interpreter, and
// running what it became. Each helper reports problems as GoogleTest
// failures in the calling test, as TestSupport.h's do.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "onnx.pb.h"
#include "runtime/Interpreter.h"
#include "runtime/Tensor.h"

namespace kiln::test {

/// An empty model of graph "g" importing the default domain at `opset`.
onnx::ModelProto makeModel(int64_t opset);

/// Adds a tensor ValueInfo to `list`; a dim of -1 (any negative) is
/// unknown, a dim given in `params` (by position) is symbolic.
void addValueInfo(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name, int elemType,
                  std::vector<int64_t> dims, std::map<size_t, std::string> params = {});

/// A graph input (addValueInfo's dims and params).
void addInput(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims,
              int elemType = onnx::TensorProto::FLOAT, std::map<size_t, std::string> params = {});

/// A graph output of `elemType` and no shape.
void addOutput(onnx::ModelProto& m, const std::string& name, int elemType = onnx::TensorProto::FLOAT);

/// A node of the graph named `name` (none by default).
onnx::NodeProto* addNode(onnx::ModelProto& m, const std::string& op, std::vector<std::string> inputs,
                         std::vector<std::string> outputs, const std::string& name = "");

/// Attributes of node `n`.
void setInt(onnx::NodeProto* n, const std::string& name, int64_t v);
void setInts(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v);
void setFloat(onnx::NodeProto* n, const std::string& name, float v);
void setFloats(onnx::NodeProto* n, const std::string& name, std::vector<float> v);
void setString(onnx::NodeProto* n, const std::string& name, const std::string& v);
void setStrings(onnx::NodeProto* n, const std::string& name, std::vector<std::string> v);

/// An f32 tensor (its values in float_data, or with `raw` in raw_data).
onnx::TensorProto floatTensor(const std::string& name, std::vector<int64_t> dims, std::vector<float> values,
                              bool raw = false);
/// An i64 tensor (int64_data).
onnx::TensorProto int64Tensor(const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> values);

/// An f32 initializer of the graph (floatTensor).
void addInitializer(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims, std::vector<float> values);
/// An integer initializer of `type` (INT64 in int64_data; INT32 and BOOL in
/// int32_data).
void addIntInitializer(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims,
                       std::vector<int64_t> values, int type = onnx::TensorProto::INT64);

/// The evaluator the importer folds constants with.
const InterpreterEvaluator& onnxTestEvaluator();

/// `m` serialized and imported as "test.onnx" (external data under
/// `baseDir`), folding constants unless `fold` is false.
Expected<std::unique_ptr<Module>> importModel(const onnx::ModelProto& m, const std::string& baseDir = "",
                                              bool fold = true);

/// Runs the imported function on `inputs` (interpreter) and returns its
/// results; a failure fails the test and gives none.
std::vector<Tensor> run(const Module& module, std::vector<Tensor> inputs);

/// `m` imported and run on `inputs` (importModel, run); a failure fails the
/// test and gives no results.
std::vector<Tensor> runModel(const onnx::ModelProto& m, std::vector<Tensor> inputs);

/// The error of an import expected to fail (a success fails the test).
std::string errorOf(const Expected<std::unique_ptr<Module>>& r);
/// The error of importing `m`, expected to fail.
std::string errorOf(const onnx::ModelProto& m);

/// How many ops of `kind` `f` has (top level).
size_t countOps(const Function& f, OpKind kind);

/// `got` against `want`, element by element within `tol`.
void expectNear(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-5);

}  // namespace kiln::test
