// kiln._kiln: the extension module of the `kiln` Python package
// (python/README.md). It holds what needs C++: models compiled and run
// through a Session (driver/Session.h) or loaded from a `.kc` file
// (runtime/Kiln.h), the trainer (training/Trainer.h) fed batches from
// Python, and the device report. The pure-Python package (python/kiln/)
// adds torch interop, kiln.compile, the state_dict mapping and the API's
// documentation.
//
// Rules kept here:
//  - The GIL is released while Kiln compiles or computes. A model or
//    trainer serializes its own calls with a mutex (its compiled programs
//    run in one memory arena), so two threads calling one model get correct
//    results, one after the other.
//  - Inputs are copied once into Kiln's tensors (a C-contiguous array is
//    read directly). Outputs are handed to NumPy without a copy: each array
//    owns the tensor a run returned, which no later run reuses.
//  - Every Kiln error becomes a Python exception (kiln.Error and its
//    subclasses) with the message `kiln` prints for it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "driver/Session.h"
#include "frontend/Model.h"
#include "frontend/onnx/OnnxImporter.h"
#include "ir/Verifier.h"
#include "passes/PassManager.h"
#include "runtime/InputCheck.h"
#include "runtime/KcFile.h"
#include "runtime/Kiln.h"
#include "runtime/cuda/CudaProgram.h"
#include "runtime/cuda/CudaProgramLoader.h"
#include "runtime/cuda/DeviceReport.h"
#include "training/Trainer.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

// The exception classes, made in PYBIND11_MODULE: kiln.Error and its
// subclasses (python/kiln/__init__.py re-exports them).
PyObject* gError = nullptr;              // any Kiln error
PyObject* gInputError = nullptr;         // wrong, missing or unknown inputs (also a ValueError)
PyObject* gDeviceError = nullptr;        // the device asked for is not usable
PyObject* gUnsupportedError = nullptr;   // ops or models Kiln cannot compile
PyObject* gModelError = nullptr;         // a model file that does not load

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

/// The text `kiln` prints after "error: ": with the file location when the
/// error has one.
std::string describe(const Error& e) { return e.location().isUnknown() ? e.message() : e.str(); }

bool isUnsupported(const Error& e) { return e.message().find("unsupported ONNX op") != std::string::npos; }

/// Raises `e` as `type`, or, by default, as kiln.UnsupportedError when it
/// lists unsupported ops and kiln.Error otherwise.
[[noreturn]] void raiseError(const Error& e, PyObject* type = nullptr) {
  const std::string text = describe(e);
  if (!type) type = isUnsupported(e) ? gUnsupportedError : gError;
  raise(type, text);
}

// --- NumPy arrays and Kiln tensors -----------------------------------------

/// A NumPy dtype's kind ('f', 'i', ...), item size and byte order ('<', '>',
/// '=', '|'), read through its Python attributes rather than pybind11's
/// accessors: pybind11 before 2.12 reads them from the C struct of NumPy 1,
/// whose layout NumPy 2 changed, so an extension built with Debian's
/// pybind11 2.10 would see every float32 array of NumPy 2 as some other
/// dtype (and size its bytes wrongly).
struct NumpyDtypeFacts {
  char kind = 0;
  int64_t itemsize = 0;
  char byteorder = '=';
  std::string name;
};

NumpyDtypeFacts factsOf(const py::dtype& d) {
  NumpyDtypeFacts facts;
  const std::string kind = py::cast<std::string>(d.attr("kind"));
  const std::string order = py::cast<std::string>(d.attr("byteorder"));
  facts.kind = kind.empty() ? 0 : kind[0];
  facts.byteorder = order.empty() ? '=' : order[0];
  facts.itemsize = py::cast<int64_t>(d.attr("itemsize"));
  facts.name = py::cast<std::string>(d.attr("name"));
  return facts;
}

std::optional<DType> dtypeOfNumpy(const NumpyDtypeFacts& d) {
  const char kind = d.kind;
  const int64_t size = d.itemsize;
  if (kind == 'f') {
    if (size == 8) return DType::F64;
    if (size == 4) return DType::F32;
    if (size == 2) return DType::F16;
  } else if (kind == 'i') {
    if (size == 8) return DType::I64;
    if (size == 4) return DType::I32;
    if (size == 2) return DType::I16;
    if (size == 1) return DType::I8;
  } else if (kind == 'u') {
    if (size == 8) return DType::U64;
    if (size == 4) return DType::U32;
    if (size == 2) return DType::U16;
    if (size == 1) return DType::U8;
  } else if (kind == 'b' && size == 1) {
    return DType::Bool;
  }
  return std::nullopt;
}

/// The NumPy dtype of `t`, or nullopt for bfloat16, which NumPy lacks.
std::optional<py::dtype> numpyDtype(DType t) {
  if (t == DType::BF16) return std::nullopt;
  return py::dtype(std::string(numpyName(t)));
}

/// A Kiln tensor holding a copy of `array` (`what` names it in errors).
Tensor tensorOf(const py::array& array, const std::string& what) {
  const NumpyDtypeFacts dtype = factsOf(array.dtype());
  const std::optional<DType> dt = dtypeOfNumpy(dtype);
  if (!dt)
    raise(gInputError, what + " is a NumPy array of dtype " + dtype.name +
                           ", which Kiln does not take (float64, float32, float16, int64, int32, int16, int8, "
                           "uint64, uint32, uint16, uint8 and bool are taken)");
  if (dtype.byteorder == '>')
    raise(gInputError, what + " is big-endian (" + dtype.name + "); convert it with .astype(numpy." +
                           std::string(numpyName(*dt)) + ")");
  // A C-contiguous array is read as it is; any other is copied into one first.
  const py::array dense = py::array::ensure(array, py::array::c_style);
  if (!dense) throw py::error_already_set();
  std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
  // The byte count from NumPy itself (pybind11's nbytes() multiplies by its
  // own reading of the item size; see NumpyDtypeFacts).
  const auto bytes = py::cast<size_t>(dense.attr("nbytes"));
  // Kiln's copy of the array: memory that runs out is a kiln.Error naming
  // the input, as in the runtime, not a MemoryError.
  try {
    return Tensor::fromBytes(*dt, shape, std::string_view(static_cast<const char*>(dense.data()), bytes));
  } catch (const std::bad_alloc&) {
    raise(gError, allocationError(bytes, "a copy of " + what, TensorType{*dt, staticShape(shape)}).message());
  }
}

/// `t` as a NumPy array that owns it: no copy.
py::array arrayOf(Tensor t, const std::string& what) {
  const std::optional<py::dtype> dtype = numpyDtype(t.dtype());
  if (!dtype) raise(gError, what + " is bfloat16, which NumPy has no dtype for");
  auto* owned = new Tensor(std::move(t));
  py::capsule base(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : owned->strides()) strides.push_back(static_cast<py::ssize_t>(s * dtypeSize(owned->dtype())));
  return py::array(*dtype, shape, strides, owned->raw(), base);
}

/// A port as the Python layer takes it: (name, dtype, shape, optional);
/// shape entries are ints, symbol names, or None for an unnamed dynamic dim.
py::tuple portTuple(const std::string& name, const TensorType& type, bool optional) {
  py::list shape;
  for (const Dim& d : type.shape) {
    if (d.isStatic())
      shape.append(d.size);
    else if (d.isSymbolic())
      shape.append(d.symbol);
    else
      shape.append(py::none());
  }
  return py::make_tuple(name, std::string(numpyName(type.dtype)), py::tuple(shape), optional);
}

std::string argumentName(const Function& f, size_t i) {
  const std::string& name = f.argument(i)->name();
  return name.empty() ? "#" + std::to_string(i) : name;
}

std::string resultName(const Function& f, size_t i) {
  const std::string& name = f.resultName(i);
  return name.empty() ? "output_" + std::to_string(i) : name;
}

/// The session for `device`, or the exception `kiln` would exit with.
std::unique_ptr<Session> makeSession(const std::string& device, int threads, const std::string& cacheDir,
                                     bool allowFallback, bool interpret, const std::string& precision = "fp32") {
  SessionOptions options;
  auto parsed = parsePrecision(precision);
  if (!parsed) raise(PyExc_ValueError, "precision='" + precision + "': expected 'fp32', 'tf32', 'bf16' or 'fp16'");
  options.precision = *parsed;
  options.device = device;
  options.interpret = interpret;
  options.allowFallback = allowFallback;
  options.cpu.threads = threads;
  options.cpu.cacheDir = cacheDir;
  auto created = Session::create(options);
  if (auto* error = std::get_if<DeviceError>(&created))
    raise(error->usage ? PyExc_ValueError : gDeviceError, describe(error->error));
  return std::move(std::get<std::unique_ptr<Session>>(created));
}

/// Verifies `module` and infers its shapes, as `kiln run` does before running.
Status inferShapes(Module& module) {
  KILN_TRY(verify(module));
  PassContext ctx;
  ctx.evaluator = &Session::evaluator();
  PassManager pm({}, ctx);
  KILN_TRY(pm.addPipeline("infer-shapes"));
  std::ostringstream log;
  return pm.run(module, log);
}

// --- Models ----------------------------------------------------------------

/// Whether the `.kc` at `path` holds a program compiled for CUDA (its
/// artifact's device), read to send it to the CUDA loader or to explain a
/// refusal; false when it cannot be read (Model::load then says why).
bool isCudaArtifact(const std::string& path) {
  auto bytes = readFileBounded(path, int64_t{1} << 36);
  if (!bytes) return false;
  auto artifact = parseArtifact(*bytes, path);
  return artifact && artifact->device == cuda::kCudaDevice;
}

/// The CUDA device a `.kc` compiled for CUDA loads on for kiln.load's
/// `device`: the runtime's CUDA loader (runtime/cuda/CudaProgramLoader.h)
/// runs it on the first usable GPU, so `cuda`, `auto` and that GPU's
/// `cuda:N` are accepted; the CPU, another GPU or no usable GPU raise
/// DeviceError saying what to give instead.
DeviceChoice cudaDeviceForArtifact(const std::string& path, const std::string& device) {
  if (device == kHostDevice)
    raise(gDeviceError, "'" + path + "' holds a program compiled for CUDA; load it with device=\"cuda\", or load "
                        "the model file itself for the CPU");
  std::string notice;
  auto resolved = resolveDevice(device, &notice);
  if (auto* e = std::get_if<DeviceError>(&resolved)) raise(gDeviceError, "device='" + device + "': " + e->error.message());
  const DeviceChoice& choice = std::get<DeviceChoice>(resolved);
  if (choice.kind != DeviceChoice::Kind::Cuda)
    raise(gDeviceError, "'" + path + "' holds a program compiled for CUDA, and device='" + device +
                            "' found no usable GPU (" + notice + ")");
  auto first = cuda::requireCudaDevice(cuda::LibrarySearchOptions::fromEnvironment(), std::nullopt);
  if (!first) raise(gDeviceError, "device='" + device + "': " + first.error().message());
  if (first->index != choice.cuda.index)
    raise(gDeviceError, "'" + path + "' runs on the first usable GPU, cuda:" + std::to_string(first->index) +
                            ", not cuda:" + std::to_string(choice.cuda.index) +
                            "; choose the GPU with CUDA_VISIBLE_DEVICES, or load the model file itself");
  return choice;
}

/// A model file compiled by Kiln (`kiln.load`): for each set of input
/// shapes it meets, the model specialized to them and compiled once (as
/// `kiln run` specializes, so that ONNX shape computations fold); or a
/// `.kc` file's stored program.
class PyModel {
 public:
  PyModel(std::string path, const std::string& device, int threads, const std::string& cacheDir, bool allowFallback,
          bool interpret, const std::string& precision)
      : path_(std::move(path)) {
    if (path_.ends_with(".kc")) {
      if (interpret) raise(gError, "a .kc file holds compiled code; interpret=True needs the model file itself");
      if (isCudaArtifact(path_)) {
        // Run by the runtime's CUDA loader, as the embedding API runs it.
        kcDevice_ = cudaDeviceForArtifact(path_, device).str();
        if (Status registered = cuda::registerCudaProgramLoader(cuda::LibrarySearchOptions::fromEnvironment());
            !registered)
          raiseError(registered.error(), gDeviceError);
      } else if (device != kHostDevice) {
        raise(gDeviceError, "'" + path_ + "' was compiled for the CPU by kiln compile; load it with device=\"cpu\", "
                                "or load the model file itself for " + device);
      }
      ModelOptions options;
      options.threads = threads;
      Expected<std::unique_ptr<Model>> loaded = Error("");
      {
        py::gil_scoped_release release;
        loaded = Model::load(path_, options);
      }
      if (!loaded) raiseError(loaded.error(), gModelError);
      kc_ = std::move(*loaded);
      for (const Model::Port& p : kc_->inputs()) inputs_.push_back({p.name, p.type, p.optional});
      for (const Model::Port& p : kc_->outputs()) outputs_.push_back({p.name, p.type, false});
      return;
    }
    session_ = makeSession(device, threads, cacheDir, allowFallback, interpret, precision);
    Expected<std::unique_ptr<Module>> loaded = Error("");
    Status inferred;
    {
      py::gil_scoped_release release;
      LoadOptions options;
      options.evaluator = &Session::evaluator();
      loaded = loadModel(path_, options);
      if (loaded && (*loaded)->functions().empty()) loaded = Error(path_ + ": the model holds no function to run");
      if (loaded) inferred = inferShapes(**loaded);
    }
    if (!loaded && isUnsupported(loaded.error())) raiseError(loaded.error(), gUnsupportedError);
    if (!loaded && path_.ends_with(".onnx")) {
      // An ONNX model that imports only specialized to its input shapes (it
      // computes shapes from a dynamic batch): its declared signature.
      // It must import specialized (dynamic dims as 1); otherwise the
      // first error stands.
      auto declared = readOnnxSignature(path_);
      if (!declared) raiseError(loaded.error(), gModelError);
      Status specializes;
      {
        py::gil_scoped_release release;
        std::map<std::string, DenseTensor> example;
        for (const auto& [name, type] : declared->inputs) {
          std::vector<int64_t> dims;
          for (const Dim& d : type.shape) dims.push_back(d.isStatic() ? d.size : 1);
          example[name] = Tensor(type.dtype, dims).toDense();
        }
        LoadOptions options;
        options.evaluator = &Session::evaluator();
        auto specialized = loadModelForInputs(path_, options, example);
        if (!specialized) specializes = specialized.takeError();
      }
      if (!specializes) raiseError(loaded.error(), isUnsupported(loaded.error()) ? gUnsupportedError : gModelError);
      for (auto& [name, type] : declared->inputs) inputs_.push_back({name, type, false});
      for (auto& [name, type] : declared->outputs) outputs_.push_back({name, type, false});
      return;
    }
    if (!loaded) raiseError(loaded.error(), gModelError);
    if (!inferred) raiseError(inferred.error(), gModelError);
    signature_ = std::move(*loaded);
    const Function& f = *signature_->functions().front();
    for (size_t i = 0; i < f.numArguments(); ++i)
      inputs_.push_back({argumentName(f, i), f.argument(i)->type(), f.argumentDefault(i) != nullptr});
    for (size_t i = 0; i < f.resultTypes().size(); ++i) outputs_.push_back({resultName(f, i), f.resultTypes()[i], false});
  }

  py::list inputs() const { return ports(inputs_); }
  py::list outputs() const { return ports(outputs_); }
  std::string device() const { return session_ ? session_->device().str() : kcDevice_; }

  /// Runs on `given` (one entry per input, None for an input left to its
  /// default); returns (outputs, notices).
  py::tuple run(const py::list& given) {
    if (given.size() != inputs_.size())
      raise(gInputError, "expected " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(given.size()));
    std::vector<std::optional<Tensor>> tensors(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (!given[i].is_none()) tensors[i] = tensorOf(py::cast<py::array>(given[i]), "input '" + inputs_[i].name + "'");
    Expected<std::vector<Tensor>> outputs = Error("");
    std::vector<std::string> notices;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      outputs = bindAndRun(tensors, notices);
    }
    if (!outputs) raiseError(outputs.error(), outputKind_);
    py::list arrays;
    for (size_t i = 0; i < outputs->size(); ++i)
      arrays.append(arrayOf(std::move((*outputs)[i]), "output '" + outputs_[i].name + "'"));
    return py::make_tuple(arrays, py::cast(notices));
  }

  /// Writes the program compiled for the last call's shapes (or, before any
  /// call, for the inputs' static shapes) to `path`, a `.kc` file.
  void save(const std::string& path) {
    Status written;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      written = saveLocked(path);
    }
    if (!written) raiseError(written.error());
  }

 private:
  struct PortInfo {
    std::string name;
    TensorType type;
    bool optional = false;
  };
  /// The model specialized to one set of input shapes, compiled.
  struct Specialization {
    std::unique_ptr<Module> module;
    std::unique_ptr<CompiledModel> compiled;
    /// The inputs it takes (those not frozen into it at import), by index
    /// into inputs_.
    std::vector<size_t> arguments;
  };

  static py::list ports(const std::vector<PortInfo>& list) {
    py::list out;
    for (const PortInfo& p : list) out.append(portTuple(p.name, p.type, p.optional));
    return out;
  }

  /// Binds `given` and the defaults to the inputs with `kiln run`'s checks
  /// (all problems at once), then runs. Called with the mutex held.
  Expected<std::vector<Tensor>> bindAndRun(std::vector<std::optional<Tensor>>& given, std::vector<std::string>& notices) {
    outputKind_ = gInputError;
    std::vector<std::string> problems;
    std::vector<Tensor> bound(inputs_.size());
    std::vector<bool> present(inputs_.size(), false);
    SymbolBindings symbols;
    const Function* f = signature_ ? signature_->functions().front().get() : nullptr;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const PortInfo& port = inputs_[i];
      std::string source = "from the call";
      if (given[i]) {
        bound[i] = std::move(*given[i]);
        present[i] = true;
      } else if (port.optional) {
        if (!f) continue;  // a .kc binds its own defaults
        bound[i] = Tensor::fromDense(*f->argumentDefault(i));
        present[i] = true;
        source = "from its default";
      } else {
        problems.push_back("missing input '" + port.name + "' (expects " + port.type.str() + ")");
        continue;
      }
      if (auto problem = checkInput(port.name, port.type, bound[i], source, symbols)) problems.push_back(*problem);
    }
    if (!problems.empty()) {
      std::string message;
      for (const std::string& p : problems) message += (message.empty() ? "" : "\n") + p;
      return Error(message);
    }
    outputKind_ = nullptr;
    if (kc_) {
      std::map<std::string, Tensor> byName;
      for (size_t i = 0; i < inputs_.size(); ++i)
        if (present[i]) byName[inputs_[i].name] = std::move(bound[i]);
      auto out = kc_->run(byName);
      if (!out) return out.takeError();
      std::vector<Tensor> results;
      for (const PortInfo& p : outputs_) results.push_back(std::move(out->at(p.name)));
      return results;
    }
    auto specialization = specialize(bound);
    if (!specialization) return specialization.takeError();
    Specialization& s = **specialization;
    std::vector<Tensor> arguments;
    for (size_t i : s.arguments) arguments.push_back(std::move(bound[i]));
    lastShapes_.clear();
    for (const Tensor& t : arguments) lastShapes_.emplace_back(t.dtype(), t.shape());
    last_ = &s;
    auto out = s.compiled->run(arguments);
    for (std::string& notice : session_->takeNotices()) notices.push_back(std::move(notice));
    return out;
  }

  /// The specialization for `bound`'s shapes, made on first use.
  /// The cache key of `bound`: its types, and the values of the inputs
  /// that the specialization for those types froze at import.
  std::string cacheKey(const std::string& types, const std::vector<Tensor>& bound) const {
    std::string key = types;
    if (auto frozen = frozenKeys_.find(types); frozen != frozenKeys_.end())
      for (size_t i : frozen->second) key.append(reinterpret_cast<const char*>(bound[i].raw()), bound[i].numBytes());
    return key;
  }

  Expected<Specialization*> specialize(const std::vector<Tensor>& bound) {
    std::string types;
    for (const Tensor& t : bound) types += t.type().str() + ";";
    if (auto it = cache_.find(cacheKey(types, bound)); it != cache_.end()) return it->second.get();
    LoadOptions options;
    options.evaluator = &Session::evaluator();
    std::map<std::string, DenseTensor> dense;
    for (size_t i = 0; i < bound.size(); ++i) dense[inputs_[i].name] = bound[i].toDense();
    auto loaded = loadModelForInputs(path_, options, dense);
    if (!loaded) return loaded.takeError();
    auto s = std::make_unique<Specialization>();
    s->module = std::move(loaded->module);
    if (s->module->functions().empty()) return Error(path_ + ": the model holds no function to run");
    KILN_TRY(inferShapes(*s->module));
    const Function& f = *s->module->functions().front();
    std::vector<size_t> frozen;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (std::find(loaded->frozenInputs.begin(), loaded->frozenInputs.end(), inputs_[i].name) !=
          loaded->frozenInputs.end()) {
        frozen.push_back(i);
        continue;
      }
      s->arguments.push_back(i);
    }
    if (s->arguments.size() != f.numArguments())
      return Error(path_ + ": the model specialized to these inputs takes " + std::to_string(f.numArguments()) +
                   " inputs, expected " + std::to_string(s->arguments.size()));
    auto compiled = session_->compile(f);
    if (!compiled) return compiled.takeError();
    s->compiled = std::move(*compiled);
    if (!frozen.empty()) frozenKeys_[types] = frozen;
    auto& slot = cache_[cacheKey(types, bound)];
    slot = std::move(s);
    return slot.get();
  }

  Status saveLocked(const std::string& path) {
    if (kc_) {
      auto bytes = readFileBounded(path_, int64_t{1} << 36);
      if (!bytes) return bytes.takeError();
      return writeFileAtomically(path, *bytes);
    }
    if (!path.ends_with(".kc")) return Error("save() writes a compiled .kc file; '" + path + "' does not end in .kc");
    if (!last_) {
      // Before any call: the inputs' static shapes, when they have them.
      for (const PortInfo& p : inputs_) {
        if (!p.type.isStatic())
          return Error("save() needs the input shapes: input '" + p.name + "' is " + p.type.str() +
                       "; call the model once first (a .kc is compiled for one set of shapes)");
      }
      std::vector<Tensor> zeros;
      for (const PortInfo& p : inputs_) zeros.emplace_back(p.type.dtype, staticDims(p.type.shape));
      std::vector<std::optional<Tensor>> given(zeros.begin(), zeros.end());
      std::vector<std::string> notices;
      auto ran = bindAndRun(given, notices);
      if (!ran) return ran.takeError();
    }
    if (last_->compiled->interpreted())
      return Error("save(): the model runs on the reference interpreter (" +
                   (last_->compiled->unsupportedOps().empty() ? std::string("interpret=True")
                                                              : "the JIT cannot compile " +
                                                                    last_->compiled->unsupportedOps().front()) +
                   "), and a .kc holds compiled code");
    std::vector<Tensor> inputs;
    for (const auto& [dtype, shape] : lastShapes_) inputs.emplace_back(dtype, shape);
    // The program of the model's device: a CUDA model's .kc holds its
    // CUBINs and PTX and runs on CUDA (`kiln run` takes it there).
    Expected<std::string> bytes = Error("save(): the model has no compiled program");
    if (codegen::CudaExecutor* cuda = last_->compiled->cudaExecutor())
      bytes = cuda->artifact(inputs);
    else if (codegen::CpuExecutor* cpu = last_->compiled->executor())
      bytes = cpu->artifact(inputs);
    if (!bytes) return bytes.takeError();
    return writeFileAtomically(path, *bytes);
  }

  std::string path_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Module> signature_;  // the model as declared, for its ports
  std::unique_ptr<Model> kc_;          // a .kc file's program
  std::string kcDevice_ = std::string(kHostDevice);  // where kc_ runs
  std::vector<PortInfo> inputs_, outputs_;
  /// Specializations by cacheKey().
  std::map<std::string, std::unique_ptr<Specialization>> cache_;
  /// Input types whose specializations froze inputs (their indices) at import.
  std::map<std::string, std::vector<size_t>> frozenKeys_;
  Specialization* last_ = nullptr;
  std::vector<std::pair<DType, std::vector<int64_t>>> lastShapes_;
  /// The exception class of the last bindAndRun's error (null: by message).
  PyObject* outputKind_ = nullptr;
  std::mutex mutex_;
};

// --- Training --------------------------------------------------------------

LossKind lossKind(const std::string& name) {
  if (name == "cross_entropy") return LossKind::CrossEntropy;
  if (name == "nll") return LossKind::Nll;
  if (name == "mse") return LossKind::Mse;
  raise(PyExc_ValueError, "loss='" + name + "': expected 'cross_entropy', 'nll' or 'mse'");
}

OptimizerKind optimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::Sgd;
  if (name == "adam") return OptimizerKind::Adam;
  if (name == "adamw") return OptimizerKind::AdamW;
  raise(PyExc_ValueError, "optimizer='" + name + "': expected 'sgd', 'adam' or 'adamw'");
}

/// kiln.Trainer's engine: training::Trainer on batches handed over from
/// Python, one compiled training step per batch size.
class PyTrainer {
 public:
  PyTrainer(const std::string& modelPath, const py::dict& o) {
    const std::string device = py::cast<std::string>(o["device"]);
    session_ = makeSession(device, py::cast<int>(o["threads"]), py::cast<std::string>(o["cache_dir"]),
                           /*allowFallback=*/true, /*interpret=*/false,
                           o.contains("precision") ? py::cast<std::string>(o["precision"]) : std::string("fp32"));
    training::TrainOptions options;
    options.modelPath = modelPath;
    options.batchSize = py::cast<int64_t>(o["batch_size"]);
    options.overlap = false;
    options.classesLast = py::cast<bool>(o["classes_last"]);
    options.zeroInputs = py::cast<std::vector<std::string>>(o["zero_inputs"]);
    // A model that imports only specialized reads its signature with the
    // first batch's shape (kiln.Trainer creates its engine at the first step).
    if (o.contains("first_batch_shape") && !o["first_batch_shape"].is_none())
      options.firstBatchShape = py::cast<std::vector<int64_t>>(o["first_batch_shape"]);
    options.checkNumerics = o.contains("check_numerics") && py::cast<bool>(o["check_numerics"]);
    options.checkNumericsName = "check_numerics=True";
    TrainingStepOptions& step = options.step;
    step.loss.kind = lossKind(py::cast<std::string>(o["loss"]));
    step.loss.reduction = py::cast<std::string>(o["reduction"]);
    step.loss.ignoreIndex = py::cast<int64_t>(o["ignore_index"]);
    step.loss.labelSmoothing = py::cast<double>(o["label_smoothing"]);
    OptimizerConfig& opt = step.optimizer;
    opt.kind = optimizerKind(py::cast<std::string>(o["optimizer"]));
    opt.momentum = py::cast<double>(o["momentum"]);
    opt.dampening = py::cast<double>(o["dampening"]);
    opt.nesterov = py::cast<bool>(o["nesterov"]);
    opt.weightDecay = py::cast<double>(o["weight_decay"]);
    opt.beta1 = py::cast<double>(o["beta1"]);
    opt.beta2 = py::cast<double>(o["beta2"]);
    opt.eps = py::cast<double>(o["eps"]);
    const std::string bn = py::cast<std::string>(o["batch_norm"]);
    if (bn != "train" && bn != "frozen")
      raise(PyExc_ValueError, "batch_norm='" + bn + "': expected 'train' or 'frozen'");
    step.batchNorm.mode = bn == "train" ? BatchNormMode::Train : BatchNormMode::Frozen;
    if (!o["bn_momentum"].is_none()) step.batchNorm.momentum = py::cast<double>(o["bn_momentum"]);
    options.lr = py::cast<double>(o["lr"]);
    options.xKey = "x";
    options.yKey = "y";
    training::TrainCallbacks callbacks;
    callbacks.notice = [this](const std::string& text) { notices_.push_back(text); };
    Expected<std::unique_ptr<training::Trainer>> created = Error("");
    {
      py::gil_scoped_release release;
      created = training::Trainer::create(*session_, options, callbacks);
    }
    if (!created) raiseError(created.error());
    trainer_ = std::move(*created);
  }

  /// One step on (x, y); returns (loss, notices).
  py::tuple step(const py::array& x, const py::array& y, const std::string& source) {
    Tensor xs = tensorOf(x, "x"), ys = tensorOf(y, "y");
    Expected<double> loss = Error("");
    std::vector<std::string> notices;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      loss = trainer_->trainBatch(xs, ys, source);
      notices.swap(notices_);
    }
    if (!loss) raiseError(loss.error(), isInputProblem(loss.error()) ? gInputError : gError);
    return py::make_tuple(*loss, py::cast(notices));
  }

  /// The mean loss and, for class losses, the accuracy on (x, y).
  py::dict evaluate(const py::array& x, const py::array& y, const std::string& source) {
    Tensor xs = tensorOf(x, "x"), ys = tensorOf(y, "y");
    Expected<training::EvalResult> r = Error("");
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      r = trainer_->evaluate(xs, ys, source);
      notices_.clear();
    }
    if (!r) raiseError(r.error(), isInputProblem(r.error()) ? gInputError : gError);
    py::dict out;
    out["loss"] = r->meanLoss();
    out["counted"] = r->counted;
    if (trainer_->options().step.loss.kind != LossKind::Mse) {
      out["accuracy"] = r->accuracy();
      out["correct"] = r->correct;
    }
    return out;
  }

  /// The training state by name (copies): parameters, batch norm running
  /// statistics and optimizer state. `batch` is the batch size of a step
  /// to build when none has run yet.
  py::dict state(int64_t batch) {
    Expected<const training::TrainState*> s = Error("");
    std::vector<std::pair<std::string, Tensor>> copies;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      s = trainer_->currentState(batch);
      if (s)
        for (size_t i = 0; i < (*s)->names.size(); ++i) copies.emplace_back((*s)->names[i], (*s)->values[i]);
    }
    if (!s) raiseError(s.error());
    py::dict out;
    for (auto& [name, value] : copies) out[py::str(name)] = arrayOf(std::move(value), "state '" + name + "'");
    return out;
  }

  /// Replaces state values by name (kiln.Trainer.load_state_dict); an
  /// error changes nothing.
  void setState(const py::dict& values, int64_t batch) {
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, value] : values) {
      const std::string key = py::cast<std::string>(name);
      tensors[key] = tensorOf(py::cast<py::array>(value), "state '" + key + "'");
    }
    Status set;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      set = trainer_->setState(tensors, batch);
    }
    if (!set) raiseError(set.error(), gInputError);
  }

  std::vector<std::string> parameters() const { return trainer_->signature().params; }
  py::tuple input() const {
    const auto& sig = trainer_->signature();
    return portTuple(sig.inputName, sig.input, false);
  }
  int64_t steps() const { return trainer_->batchesTrained(); }
  void setLearningRate(double lr) {
    std::lock_guard<std::mutex> lock(mutex_);
    trainer_->setLearningRate(lr);
  }

 private:
  /// Errors about the arrays handed over name them as x and y of the call.
  static bool isInputProblem(const Error& e) { return e.message().rfind("kiln.Trainer.", 0) == 0; }

  std::unique_ptr<Session> session_;  // before trainer_, which refers to it
  std::unique_ptr<training::Trainer> trainer_;
  std::vector<std::string> notices_;
  std::mutex mutex_;
};

/// Raises kiln.DeviceError when `device` is not usable, as a session on it
/// would; returns the device chosen ("cpu", "cuda:0 (NAME)").
std::string checkDevice(const std::string& device) {
  std::string notice;
  std::variant<DeviceChoice, DeviceError> chosen = DeviceChoice{};
  {
    py::gil_scoped_release release;
    chosen = resolveDevice(device, &notice);
  }
  if (auto* error = std::get_if<DeviceError>(&chosen))
    raise(error->usage ? PyExc_ValueError : gDeviceError, describe(error->error));
  return std::get<DeviceChoice>(chosen).str();
}

std::string devicesJson() {
  py::gil_scoped_release release;
  const cuda::LibrarySearchOptions options = cuda::LibrarySearchOptions::fromEnvironment();
  return cuda::devicesJson(cuda::probeCuda(options), cuda::probeLibraries(options));
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln::python;
  m.doc() = "Kiln's extension module; use the kiln package, which wraps it.";
  gError = PyErr_NewExceptionWithDoc("kiln.Error", "An error Kiln reports: the message kiln prints for it.",
                                     PyExc_RuntimeError, nullptr);
  py::tuple inputBases = py::make_tuple(py::handle(gError), py::handle(PyExc_ValueError));
  gInputError = PyErr_NewExceptionWithDoc("kiln.InputError",
                                          "Inputs that do not fit the model: a wrong dtype or shape, a missing or "
                                          "unknown input.",
                                          inputBases.ptr(), nullptr);
  gDeviceError = PyErr_NewExceptionWithDoc("kiln.DeviceError",
                                           "The device asked for is not usable (no driver, no GPU, driver too old); "
                                           "Kiln never falls back to the CPU.",
                                           gError, nullptr);
  gUnsupportedError = PyErr_NewExceptionWithDoc("kiln.UnsupportedError",
                                                "The model uses ops Kiln cannot import or compile; the message lists "
                                                "them all.",
                                                gError, nullptr);
  gModelError = PyErr_NewExceptionWithDoc("kiln.ModelError", "A model file that does not load: missing, malformed or "
                                          "not a model Kiln reads.", gError, nullptr);
  m.attr("Error") = py::handle(gError);
  m.attr("InputError") = py::handle(gInputError);
  m.attr("DeviceError") = py::handle(gDeviceError);
  m.attr("UnsupportedError") = py::handle(gUnsupportedError);
  m.attr("ModelError") = py::handle(gModelError);

  py::class_<PyModel>(m, "Model")
      .def(py::init<std::string, const std::string&, int, const std::string&, bool, bool, const std::string&>(),
           py::arg("path"), py::arg("device"), py::arg("threads"), py::arg("cache_dir"), py::arg("allow_fallback"),
           py::arg("interpret"), py::arg("precision") = "fp32")
      .def_property_readonly("inputs", &PyModel::inputs)
      .def_property_readonly("outputs", &PyModel::outputs)
      .def_property_readonly("device", &PyModel::device)
      .def("run", &PyModel::run)
      .def("save", &PyModel::save);

  py::class_<PyTrainer>(m, "Trainer")
      .def(py::init<const std::string&, const py::dict&>())
      .def("step", &PyTrainer::step)
      .def("evaluate", &PyTrainer::evaluate)
      .def("state", &PyTrainer::state)
      .def("set_state", &PyTrainer::setState)
      .def_property_readonly("parameters", &PyTrainer::parameters)
      .def_property_readonly("input", &PyTrainer::input)
      .def_property_readonly("steps", &PyTrainer::steps)
      .def("set_lr", &PyTrainer::setLearningRate);

  m.def("devices_json", &devicesJson, "What `kiln devices --json` prints.");
  m.def("check_device", &checkDevice, py::arg("device"),
        "Raises kiln.DeviceError unless `device` is usable; returns the device chosen.");
}
