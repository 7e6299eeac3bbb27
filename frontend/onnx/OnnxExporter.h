// ONNX export: the first function of a Module as an ONNX ModelProto (opset
// 17, IR version 8), for `kiln convert IN -o OUT.onnx` and for training,
// which writes trained models back as ONNX with their initializer names
// kept. Arguments become graph inputs (an argument with a default is also an
// initializer of the same name), results graph outputs named by
// Function::resultName, constants initializers, and each Kiln op the ONNX
// node or nodes with the same semantics; an op without an ONNX equivalent is
// an error naming it. docs/onnx.md lists the mapping.
#pragma once

#include <string>

#include "ir/IR.h"

namespace kiln {

/// The serialized ModelProto of `module`'s first function.
Expected<std::string> exportOnnx(const Module& module);

/// Exports `module` and writes it to `path` atomically (a temporary file in
/// the same folder, then a rename): on error nothing is left behind.
Status writeOnnxModel(const Module& module, const std::string& path);

}  // namespace kiln
