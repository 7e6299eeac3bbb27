// Placeholder so that the importer links until the NN converters land; the
// engineer writing NNOps.cpp replaces this body.
#include "frontend/onnx/OnnxOps.h"

namespace kiln::onnx_import {

std::span<const OpConverter> nnConverters() { return {}; }

}  // namespace kiln::onnx_import
