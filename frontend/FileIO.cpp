// Bounded whole-file reads and atomic writes (temporary file in the target's
// folder, fsync, rename). The temporary file is created with mode 0666 so
// the process umask applies as it would to a plain open(); mkstemp's 0600
// would leave model files unreadable to other users.
#include "frontend/FileIO.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

namespace kiln {

namespace {

std::string errnoText() { return std::strerror(errno); }

/// Writes all of `data` to `fd`, retrying short writes and EINTR.
bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

/// Creates a temporary file next to `path` holding `contents`, flushed to
/// disk, and returns its name.
Expected<std::string> writeTemporary(const std::string& path, std::string_view contents) {
  std::filesystem::path target(path);
  if (target.filename().empty()) return Error("cannot write '" + path + "': not a file name");
  std::filesystem::path dir = target.parent_path();
  std::random_device random;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string tmpName = "." + target.filename().string() + ".tmp-" + std::to_string(random());
    std::string tmp = (dir.empty() ? std::filesystem::path(tmpName) : dir / tmpName).string();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return Error("cannot write '" + path + "': " + errnoText());
    }
    bool ok = writeAll(fd, contents) && ::fsync(fd) == 0;
    std::string why = ok ? std::string() : errnoText();
    if (::close(fd) != 0 && ok) {
      ok = false;
      why = errnoText();
    }
    if (!ok) {
      ::unlink(tmp.c_str());
      return Error("cannot write '" + path + "': " + why);
    }
    return tmp;
  }
  return Error("cannot write '" + path + "': no free temporary file name");
}

/// Makes finished renames in `dir` durable; a failure here loses nothing
/// that was not already at risk, so it is not reported.
void syncDirectory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

Status writeFilesAtomically(const std::vector<FileContents>& files) {
  std::vector<std::string> temporaries;
  auto removeTemporaries = [&] {
    for (const std::string& tmp : temporaries) ::unlink(tmp.c_str());
  };
  for (const FileContents& file : files) {
    auto tmp = writeTemporary(file.path, file.contents);
    if (!tmp) {
      removeTemporaries();
      return tmp.takeError();
    }
    temporaries.push_back(std::move(*tmp));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(temporaries[i].c_str(), files[i].path.c_str()) != 0) {
      std::string why = errnoText();
      for (size_t j = i; j < temporaries.size(); ++j) ::unlink(temporaries[j].c_str());
      return Error("cannot write '" + files[i].path + "': " + why);
    }
    syncDirectory(std::filesystem::path(files[i].path).parent_path());
  }
  return Status::success();
}

Status writeFileAtomically(const std::string& path, std::string_view contents) {
  return writeFilesAtomically({FileContents{path, contents}});
}

Expected<std::string> readFileBounded(const std::string& path, int64_t maxBytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error("cannot open '" + path + "': " + errnoText());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string why = errnoText();
    ::close(fd);
    return Error("cannot read '" + path + "': " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error("cannot read '" + path + "': not a regular file");
  }
  if (st.st_size > maxBytes) {
    ::close(fd);
    return Error("'" + path + "' is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                 std::to_string(maxBytes));
  }
  // Sized from fstat, but read until EOF so a file that changes while being
  // read is still bounded by maxBytes rather than trusted.
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t used = 0;
  while (true) {
    if (used == data.size()) {
      if (static_cast<int64_t>(data.size()) >= maxBytes) {
        char probe;
        ssize_t extra = ::read(fd, &probe, 1);
        ::close(fd);
        if (extra > 0) return Error("'" + path + "' is more than the limit of " + std::to_string(maxBytes) + " bytes");
        data.resize(used);
        return data;
      }
      data.resize(std::min<size_t>(static_cast<size_t>(maxBytes), std::max<size_t>(4096, data.size() * 2)));
    }
    ssize_t n = ::read(fd, data.data() + used, data.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string why = errnoText();
      ::close(fd);
      return Error("cannot read '" + path + "': " + why);
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(used);
  return data;
}

}  // namespace kiln
