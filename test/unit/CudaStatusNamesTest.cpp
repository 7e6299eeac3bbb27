// The cuBLAS and cuDNN status-name tables (runtime/cuda/CublasLtAbi.h
// cublasStatusName, CudnnAbi.h cudnnStatusName): the one copy of each that
// Kiln's error messages and the emulated GPU's cublasLtGetStatusName and
// cudnnGetErrorString share. Every code the headers define has its own
// name, spelled as NVIDIA's headers spell the constant; an unknown code has
// none (nullptr), so that each caller says "unknown" in its own way.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/CublasLtAbi.h"
#include "runtime/cuda/CudnnAbi.h"

namespace kiln::cuda {
namespace {

TEST(CudaStatusNamesTest, EveryCublasStatusHasItsName) {
  using namespace cublaslt;
  const std::vector<std::pair<cublasStatus_t, std::string>> codes{
      {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS"},
      {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED"},
      {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED"},
      {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE"},
      {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH"},
      {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR"},
      {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED"},
      {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR"},
      {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED"},
      {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR"}};
  for (const auto& [code, name] : codes) {
    ASSERT_NE(cublasStatusName(code), nullptr) << "code " << code;
    EXPECT_EQ(cublasStatusName(code), name) << "code " << code;
  }
  EXPECT_EQ(cublasStatusName(2), nullptr);
  EXPECT_EQ(cublasStatusName(-1), nullptr);
  static_assert(cublasStatusName(CUBLAS_STATUS_NOT_SUPPORTED) != nullptr, "usable in constant expressions");
}

TEST(CudaStatusNamesTest, EveryCudnnStatusHasItsName) {
  using namespace cudnn;
  // The two BAD_PARAM sub-codes are the ones the CUDA runtime's own copy of
  // this table lacked (its messages said "cuDNN status 2002").
  const std::vector<std::pair<cudnnStatus_t, std::string>> codes{
      {CUDNN_STATUS_SUCCESS, "CUDNN_STATUS_SUCCESS"},
      {CUDNN_STATUS_NOT_INITIALIZED, "CUDNN_STATUS_NOT_INITIALIZED"},
      {CUDNN_STATUS_BAD_PARAM, "CUDNN_STATUS_BAD_PARAM"},
      {CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"},
      {CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"},
      {CUDNN_STATUS_NOT_SUPPORTED, "CUDNN_STATUS_NOT_SUPPORTED"},
      {CUDNN_STATUS_INTERNAL_ERROR, "CUDNN_STATUS_INTERNAL_ERROR"},
      {CUDNN_STATUS_EXECUTION_FAILED, "CUDNN_STATUS_EXECUTION_FAILED"}};
  std::set<std::string> seen;
  for (const auto& [code, name] : codes) {
    ASSERT_NE(cudnnStatusName(code), nullptr) << "code " << code;
    EXPECT_EQ(cudnnStatusName(code), name) << "code " << code;
    EXPECT_TRUE(seen.insert(name).second) << name << " twice";
  }
  EXPECT_EQ(cudnnStatusName(2001), nullptr);
  EXPECT_EQ(cudnnStatusName(-1), nullptr);
}

}  // namespace
}  // namespace kiln::cuda
