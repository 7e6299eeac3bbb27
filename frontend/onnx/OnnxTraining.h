// What `kiln train` needs from ONNX beyond import and export. Training
// updates a model's weights, so it must see them as the initializers they
// are: the importer turns an initializer that is not a graph input into a
// constant, and constant folding may then rewrite it (Gemm's transB folds
// W into a new, unnamed constant W^T), after which neither its name nor its
// layout is the initializer's. Declaring the float initializers as graph
// inputs first makes each one an argument with its initializer as default,
// named and shaped as in the file. Writing the trained model back copies the
// original file and replaces only those initializers' values, so the graph,
// names, shapes, opsets and metadata stay as PyTorch exported them, with
// one change: torch.onnx.export stores parameters of equal value once and
// recreates the others with Identity nodes (a fresh model's norms, the
// copied layers of an nn.TransformerEncoder); each such Identity of a float
// initializer becomes an initializer of its own, named like its output,
// since training gives the two separate PyTorch tensors separate values.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "ir/IR.h"

namespace kiln {

/// The serialized model `bytes` (named `what` in errors) with every Identity
/// of a float initializer replaced by a copy of it (see above) and every
/// float (f32, f64) initializer of rank >= 1 that is not yet a graph input
/// declared as one, with the initializer's type.
Expected<std::string> declareFloatInitializersAsInputs(std::string_view bytes, std::string_view what);

/// Writes the ONNX model at `path` to `outPath` (atomically), its shared
/// initializers untied as declareFloatInitializersAsInputs does, with the
/// initializers named in `values` holding those values instead (as raw
/// data; external data of a replaced initializer is inlined). Each value's
/// dtype and shape must be the initializer's; an unknown name or a
/// mismatch is an error naming it, and nothing is written.
Status writeOnnxWithInitializers(const std::string& path, const std::map<std::string, DenseTensor>& values,
                                 const std::string& outPath);

}  // namespace kiln
