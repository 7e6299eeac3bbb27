// The ONNX model-building helpers of the unit tests (OnnxTestSupport.h).
#include "test/unit/OnnxTestSupport.h"

#include <gtest/gtest.h>

#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"

namespace kiln::test {

onnx::ModelProto makeModel(int64_t opset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  m.mutable_graph()->set_name("g");
  return m;
}

void addValueInfo(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name, int elemType,
                  std::vector<int64_t> dims, std::map<size_t, std::string> params) {
  auto* v = list->Add();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elemType);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    auto* d = shape->add_dim();
    if (params.count(i))
      d->set_dim_param(params[i]);
    else if (dims[i] >= 0)
      d->set_dim_value(dims[i]);
  }
}

void addInput(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims, int elemType,
              std::map<size_t, std::string> params) {
  addValueInfo(m.mutable_graph()->mutable_input(), name, elemType, std::move(dims), std::move(params));
}

void addOutput(onnx::ModelProto& m, const std::string& name, int elemType) {
  auto* v = m.mutable_graph()->add_output();
  v->set_name(name);
  v->mutable_type()->mutable_tensor_type()->set_elem_type(elemType);
}

onnx::NodeProto* addNode(onnx::ModelProto& m, const std::string& op, std::vector<std::string> inputs,
                         std::vector<std::string> outputs, const std::string& name) {
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (auto& i : inputs) n->add_input(i);
  for (auto& o : outputs) n->add_output(o);
  return n;
}

namespace {

onnx::AttributeProto* addAttribute(onnx::NodeProto* n, const std::string& name, onnx::AttributeProto::AttributeType type) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}

}  // namespace

void setInt(onnx::NodeProto* n, const std::string& name, int64_t v) {
  addAttribute(n, name, onnx::AttributeProto::INT)->set_i(v);
}

void setInts(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = addAttribute(n, name, onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

void setFloat(onnx::NodeProto* n, const std::string& name, float v) {
  addAttribute(n, name, onnx::AttributeProto::FLOAT)->set_f(v);
}

void setFloats(onnx::NodeProto* n, const std::string& name, std::vector<float> v) {
  auto* a = addAttribute(n, name, onnx::AttributeProto::FLOATS);
  for (float x : v) a->add_floats(x);
}

void setString(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  addAttribute(n, name, onnx::AttributeProto::STRING)->set_s(v);
}

void setStrings(onnx::NodeProto* n, const std::string& name, std::vector<std::string> v) {
  auto* a = addAttribute(n, name, onnx::AttributeProto::STRINGS);
  for (auto& x : v) a->add_strings(x);
}

onnx::TensorProto floatTensor(const std::string& name, std::vector<int64_t> dims, std::vector<float> values, bool raw) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  if (raw)
    t.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  else
    for (float v : values) t.add_float_data(v);
  return t;
}

onnx::TensorProto int64Tensor(const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t v : values) t.add_int64_data(v);
  return t;
}

void addInitializer(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims, std::vector<float> values) {
  *m.mutable_graph()->add_initializer() = floatTensor(name, std::move(dims), std::move(values));
}

void addIntInitializer(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> dims,
                       std::vector<int64_t> values, int type) {
  auto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (int64_t d : dims) t->add_dims(d);
  for (int64_t v : values) {
    if (type == onnx::TensorProto::INT32 || type == onnx::TensorProto::BOOL)
      t->add_int32_data(static_cast<int32_t>(v));
    else
      t->add_int64_data(v);
  }
}

const InterpreterEvaluator& onnxTestEvaluator() {
  static const InterpreterEvaluator evaluator;
  return evaluator;
}

Expected<std::unique_ptr<Module>> importModel(const onnx::ModelProto& m, const std::string& baseDir, bool fold) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  LoadOptions options;
  options.evaluator = fold ? &onnxTestEvaluator() : nullptr;
  return importOnnxBytes(bytes, "test.onnx", baseDir, options);
}

std::vector<Tensor> run(const Module& module, std::vector<Tensor> inputs) {
  auto results = interpret(*module.functions().front(), std::move(inputs));
  EXPECT_TRUE(results.ok()) << (results.ok() ? "" : results.error().str());
  return results.ok() ? std::move(*results) : std::vector<Tensor>{};
}

std::vector<Tensor> runModel(const onnx::ModelProto& m, std::vector<Tensor> inputs) {
  auto module = importModel(m);
  EXPECT_TRUE(module.ok()) << (module.ok() ? "" : module.error().str());
  if (!module.ok()) return {};
  return run(**module, std::move(inputs));
}

std::string errorOf(const Expected<std::unique_ptr<Module>>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().str();
}

std::string errorOf(const onnx::ModelProto& m) { return errorOf(importModel(m)); }

size_t countOps(const Function& f, OpKind kind) {
  size_t n = 0;
  for (const auto& op : f.ops()) n += op->kind() == kind;
  return n;
}

void expectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace kiln::test
