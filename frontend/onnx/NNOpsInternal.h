// The converters of the NN table that live in their own files: the
// recurrent ops (NNRecurrent.cpp) and resizing (NNResize.cpp). Only
// NNOps.cpp, which lists them in nnConverters(), includes this header.
#pragma once

#include "frontend/onnx/OnnxOps.h"

namespace kiln::onnx_import {

Status convertLSTM(NodeContext &ctx);
Status convertGRU(NodeContext &ctx);
Status convertRNN(NodeContext &ctx);
Status convertResize(NodeContext &ctx);
Status convertUpsample(NodeContext &ctx);

}  // namespace kiln::onnx_import
