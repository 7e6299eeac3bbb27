# The emulated GPU's cuDNN (Cudnn.cpp): <build>/cuda-emulator/libcudnn.so.9,
# beside the emulator's libcuda.so.1, where Kiln looks for the math
# libraries when the driver is the emulator (runtime/cuda/CudaLibraries.h,
# mathLibraryOptions). Included from this folder's CMakeLists.txt. Like the
# emulator's cuBLASLt (cublaslt.cmake) it links the emulator's libcuda.so.1
# for kilnEmulatorEnqueue and friends (EmulatorHooks.h).
add_library(kiln-cuda-emulator-cudnn SHARED ${CMAKE_CURRENT_LIST_DIR}/Cudnn.cpp)
# Only the cudnn* entry points are exported (KILN_CUDNN_EXPORT).
set_target_properties(kiln-cuda-emulator-cudnn PROPERTIES
                      OUTPUT_NAME cudnn SOVERSION 9
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emulator
                      BUILD_RPATH "\$ORIGIN"
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_options(kiln-cuda-emulator-cudnn PRIVATE -Wl,--no-undefined)
target_link_libraries(kiln-cuda-emulator-cudnn PRIVATE kiln-cuda-emulator)
