// Loads PTX files into Kiln's emulated GPU (test/devices/emulator) and
// reports the first one it refuses, with the emulator's message: the check
// that the emulator implements every instruction and directive NVRTC emits
// for a model's kernels (ctest CudaEmulator-load-<model>).
//
//   kiln-emulator-load DRIVER FILE.ptx...
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kiln-emulator-load DRIVER FILE.ptx...\n");
    return 2;
  }
  void* driver = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!driver) {
    std::fprintf(stderr, "kiln-emulator-load: %s\n", dlerror());
    return 1;
  }
  using Init = int (*)(unsigned);
  using Retain = int (*)(void**, int);
  using SetCurrent = int (*)(void*);
  using Load = int (*)(void**, const void*);
  using Unload = int (*)(void*);
  using LastFault = const char* (*)();
  auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  auto retain = reinterpret_cast<Retain>(dlsym(driver, "cuDevicePrimaryCtxRetain"));
  auto setCurrent = reinterpret_cast<SetCurrent>(dlsym(driver, "cuCtxSetCurrent"));
  auto load = reinterpret_cast<Load>(dlsym(driver, "cuModuleLoadData"));
  auto unload = reinterpret_cast<Unload>(dlsym(driver, "cuModuleUnload"));
  auto lastFault = reinterpret_cast<LastFault>(dlsym(driver, "kilnEmulatorLastFault"));
  if (!init || !retain || !setCurrent || !load || !unload || !lastFault) {
    std::fprintf(stderr, "kiln-emulator-load: %s is not Kiln's emulated GPU\n", argv[1]);
    return 1;
  }
  void* context = nullptr;
  if (init(0) != 0 || retain(&context, 0) != 0 || setCurrent(context) != 0) {
    std::fprintf(stderr, "kiln-emulator-load: no context\n");
    return 1;
  }
  for (int i = 2; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    if (!file) {
      std::fprintf(stderr, "kiln-emulator-load: cannot read %s\n", argv[i]);
      return 1;
    }
    std::stringstream text;
    text << file.rdbuf();
    void* module = nullptr;
    const int result = load(&module, text.str().c_str());
    if (result != 0) {
      std::fprintf(stderr, "%s: error %d: %s\n", argv[i], result, lastFault());
      return 1;
    }
    unload(module);
    std::printf("%s: loaded\n", argv[i]);
  }
  return 0;
}
