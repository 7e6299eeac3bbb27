# The emulated GPU's cuBLASLt (CublasLt.cpp): <build>/cuda-emulator/libcublasLt.so.13,
# beside the emulator's libcuda.so.1, where Kiln looks for the math
# libraries when the driver is the emulator (runtime/cuda/CudaLibraries.h,
# mathLibraryOptions). Included at the end of this folder's CMakeLists.txt.
# It links the emulator's libcuda.so.1 for kilnEmulatorEnqueue and friends
# (EmulatorHooks.h); the RPATH $ORIGIN finds that one, not NVIDIA's.
add_library(kiln-cuda-emulator-cublaslt SHARED ${CMAKE_CURRENT_LIST_DIR}/CublasLt.cpp)
# Only the cublasLt* entry points are exported (KILN_CUBLASLT_EXPORT).
set_target_properties(kiln-cuda-emulator-cublaslt PROPERTIES
                      OUTPUT_NAME cublasLt SOVERSION 13
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emulator
                      BUILD_RPATH "\$ORIGIN"
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_options(kiln-cuda-emulator-cublaslt PRIVATE -Wl,--no-undefined)
target_link_libraries(kiln-cuda-emulator-cublaslt PRIVATE kiln-cuda-emulator)
