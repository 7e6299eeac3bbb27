# The emulated GPU's NCCL (Nccl.cpp): <build>/cuda-emulator/libnccl.so.2,
# beside the emulator's libcuda.so.1, where Kiln looks for NCCL when the
# driver is the emulator (runtime/cuda/CudaLibraries.h, mathLibraryOptions).
# Its collectives move data between processes of one machine through POSIX
# shared memory, in stream order (kilnEmulatorEnqueue, EmulatorHooks.h).
add_library(kiln-cuda-emulator-nccl SHARED ${CMAKE_CURRENT_LIST_DIR}/Nccl.cpp)
# Only the nccl* entry points are exported (KILN_NCCL_EXPORT).
set_target_properties(kiln-cuda-emulator-nccl PROPERTIES
                      OUTPUT_NAME nccl SOVERSION 2
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emulator
                      BUILD_RPATH "\$ORIGIN"
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_options(kiln-cuda-emulator-nccl PRIVATE -Wl,--no-undefined)
target_link_libraries(kiln-cuda-emulator-nccl PRIVATE kiln-cuda-emulator rt)
