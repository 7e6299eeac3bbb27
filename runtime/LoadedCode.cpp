// LoadedCode (LoadedCode.h). The dynamic loader knows a library by its path
// first: a second dlopen of "/proc/self/fd/N" while an earlier library of
// that path is loaded returns the earlier one. So each memory file stays
// open as long as its library is loaded, which keeps its fd number, and so
// its path, unique. Where /proc is not mounted, dlopen cannot open a memory
// file by path, so the object goes to a private temporary file of a unique
// name instead, removed as soon as it is open.
#include "runtime/LoadedCode.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace kiln {

namespace {

/// Writes all of `bytes` to `fd`.
bool writeAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string dlerrorText() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

/// dlopen of the bytes through a memory file, or nullptr with `why`; `fd`
/// receives the memory file, to be closed after dlclose.
void* openFromMemory(std::string_view bytes, std::string& why, int& fd) {
  fd = memfd_create("kiln-kernels", MFD_CLOEXEC);
  if (fd < 0) {
    why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  void* handle = nullptr;
  if (!writeAll(fd, bytes)) {
    why = std::string("writing the kernels to memory: ") + std::strerror(errno);
  } else if (::access("/proc/self/fd", F_OK) == 0) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) why = dlerrorText();
  } else {
    why = "/proc is not mounted";
  }
  if (!handle) {
    ::close(fd);
    fd = -1;
  }
  return handle;
}

/// dlopen of the bytes through a temporary file, or nullptr with `why`.
void* openFromTemporaryFile(std::string_view bytes, std::string& why) {
  std::string path = (std::filesystem::temp_directory_path() / "kiln-kernels-XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    why += std::string("; a temporary file: ") + std::strerror(errno);
    return nullptr;
  }
  void* handle = nullptr;
  if (writeAll(fd, bytes)) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) why += "; " + dlerrorText();
  } else {
    why += std::string("; writing a temporary file: ") + std::strerror(errno);
  }
  ::close(fd);
  ::unlink(path.c_str());
  return handle;
}

}  // namespace

Expected<std::unique_ptr<LoadedCode>> LoadedCode::load(std::string_view sharedObject,
                                                       const std::vector<std::string>& names) {
  std::unique_ptr<LoadedCode> code(new LoadedCode());
  if (names.empty()) return code;
  if (sharedObject.size() < 4 || sharedObject.substr(0, 4) != "\x7f" "ELF")
    return Error("the kernels' code is not a shared object (ELF)");
  std::string why;
  code->handle_ = openFromMemory(sharedObject, why, code->fd_);
  if (!code->handle_) code->handle_ = openFromTemporaryFile(sharedObject, why);
  if (!code->handle_) return Error("cannot load the kernels' code: " + why);
  for (size_t i = 0; i < names.size(); ++i) {
    void* symbol = dlsym(code->handle_, names[i].c_str());
    if (!symbol) return Error("the kernels' code does not define kernel " + std::to_string(i) + " '" + names[i] + "'");
    code->kernels_.push_back(reinterpret_cast<KernelFn>(symbol));
  }
  return code;
}

LoadedCode::~LoadedCode() {
  if (handle_) dlclose(handle_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
