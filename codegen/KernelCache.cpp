// The kernel cache of KernelCache.h. An entry file `<key>.kobj` is
//
//   "KILNOBJ\0"  u32 format version  u32 zero  u64 payload size
//   32-byte BLAKE3 hash of the payload  payload
//
// with integers little-endian. Lookup checks all of it before returning
// the payload, so a truncated file, a flipped byte or a foreign file is a
// miss with a notice, never bad code handed to the linker. Before that, the
// folder and the entry must pass the trust rules of KernelCache.h, checked
// with fstat on the open folder and file (POSIX *at calls relative to the
// folder's descriptor), so that what was checked is what is read.
#include "codegen/KernelCache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "runtime/Blake3.h"

namespace kiln::codegen {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '\0'};
constexpr uint32_t kEntryVersion = 1;
constexpr size_t kHashBytes = 32;
constexpr size_t kHeaderBytes = sizeof kMagic + 4 + 4 + 8 + kHashBytes;
/// Entries larger than this are not objects Kiln wrote.
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 31;

std::array<uint8_t, kHashBytes> hashBytes(std::string_view data) { return blake3(data); }

void putLE(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t getLE(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return v;
}

bool isKey(const std::string& key) {
  return key.size() == 2 * kHashBytes && key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string modeString(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

/// Why a file or folder that fstat described as `st` may hold code someone
/// other than the effective user wrote; empty when it may not.
std::string untrusted(const struct stat& st) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me)
    return "owned by uid " + std::to_string(st.st_uid) + ", not by uid " + std::to_string(me) + ", which runs Kiln";
  const bool group = st.st_mode & S_IWGRP, others = st.st_mode & S_IWOTH;
  if (group || others)
    return std::string("writable by ") +
           (group && others ? "its group and others"
            : group         ? "its group"
                            : "others") +
           ", mode " + modeString(st.st_mode);
  return "";
}

/// Creates `dir` and each missing parent with mode 0700; empty, or why not.
std::string createFolders(const std::string& dir) {
  std::filesystem::path partial;
  for (const std::filesystem::path& part : std::filesystem::path(dir)) {
    partial /= part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
      return "cannot create '" + partial.string() + "': " + std::strerror(errno);
  }
  return "";
}

/// Reads all of `fd`; false on a read error.
bool readAll(int fd, std::string& out) {
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    out.append(buffer, static_cast<size_t>(n));
  }
}

/// Writes all of `data` to `fd`; false on a write error.
bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

/// The bytes of entry `name` of the open folder `dir` when it may be
/// trusted; otherwise nullopt with `problem` saying why (empty for a miss).
std::optional<std::string> readEntry(int dir, const std::string& name, std::string& problem) {
  // O_NONBLOCK: a FIFO planted under an entry's name must not block open().
  const int fd = ::openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) problem = std::string("cannot be read (") + std::strerror(errno) + ")";
    return std::nullopt;  // ENOENT: a miss
  }
  struct stat st;
  std::string bytes;
  if (::fstat(fd, &st) != 0)
    problem = std::string("cannot be read (") + std::strerror(errno) + ")";
  else if (!S_ISREG(st.st_mode))
    problem = "is not a regular file";
  else if (std::string why = untrusted(st); !why.empty())
    problem = "is not trusted (" + why + ")";
  else if (!readAll(fd, bytes))
    problem = std::string("cannot be read (") + std::strerror(errno) + ")";
  else
    // A read counts as a use for trim(); where that fails the old time stays.
    ::futimens(fd, nullptr);
  ::close(fd);
  if (!problem.empty()) return std::nullopt;
  return bytes;
}

}  // namespace


KernelCache::KernelCache(std::string dir, uint64_t maxBytes) : dir_(std::move(dir)), maxBytes_(maxBytes) {}

KernelCache::~KernelCache() {
  if (folderFd_ >= 0) ::close(folderFd_);
}

std::string KernelCache::entryPath(const std::string& key) const {
  return (std::filesystem::path(dir_) / (key + ".kobj")).string();
}

void KernelCache::notice(std::string message) { notices_.push_back(std::move(message)); }

void KernelCache::noticeUnusable(const std::string& why) {
  if (warnedUnusable_) return;
  warnedUnusable_ = true;
  notice("the kernel cache '" + dir_ + "' is not usable (" + why + "); compiling without it");
}

std::vector<std::string> KernelCache::takeNotices() {
  std::lock_guard lock(mutex_);
  return std::exchange(notices_, {});
}

int KernelCache::folder(bool create) {
  std::lock_guard lock(mutex_);
  if (folderFd_ >= 0 || warnedUnusable_) return folderFd_;
  if (create) {
    if (std::string why = createFolders(dir_); !why.empty()) {
      noticeUnusable(why);
      return -1;
    }
  }
  const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT && !create) return -1;  // a miss; the first store creates it
    noticeUnusable(std::strerror(errno));
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    noticeUnusable(std::strerror(errno));
    ::close(fd);
    return -1;
  }
  if (std::string why = untrusted(st); !why.empty()) {
    ::close(fd);
    warnedUnusable_ = true;
    const std::string advice = st.st_uid != ::geteuid()
                                   ? "use a folder of your own (--cache-dir DIR) or --no-cache"
                                   : "make it private (chmod go-w '" + dir_ + "') or use another folder";
    notice("the kernel cache '" + dir_ + "' is not trusted (" + why +
           "): Kiln runs the machine code in it, which others could have put there, so it compiles without it; " +
           advice);
    return -1;
  }
  folderFd_ = fd;
  return fd;
}

std::optional<std::string> KernelCache::lookup(const std::string& key) {
  if (!enabled() || !isKey(key)) return std::nullopt;
  const int dir = folder(/*create=*/false);
  if (dir < 0) return std::nullopt;
  const std::string name = key + ".kobj";
  std::string problem;
  std::optional<std::string> entry = readEntry(dir, name, problem);
  if (entry) {
    const std::string& bytes = *entry;
    if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
      problem = bytes.size() < kHeaderBytes ? "truncated header" : "not a Kiln cache entry";
    } else if (getLE(bytes, 8, 4) != kEntryVersion) {
      problem = "entry format " + std::to_string(getLE(bytes, 8, 4)) + ", expected " + std::to_string(kEntryVersion);
    } else if (const uint64_t size = getLE(bytes, 16, 8);
               size > kMaxEntryBytes || size != bytes.size() - kHeaderBytes) {
      problem = "size " + std::to_string(bytes.size() - kHeaderBytes) + " bytes, header says " + std::to_string(size);
    } else {
      std::string_view payload(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
      const auto hash = hashBytes(payload);
      if (std::memcmp(hash.data(), bytes.data() + 24, kHashBytes) == 0) return std::string(payload);
      problem = "checksum mismatch";
    }
    problem = "is damaged (" + problem + ")";
  } else if (problem.empty()) {
    return std::nullopt;  // a miss
  }
  std::lock_guard lock(mutex_);
  notice("kernel cache entry '" + entryPath(key) + "' " + problem + "; it is rebuilt");
  ::unlinkat(dir, name.c_str(), 0);
  return std::nullopt;
}

void KernelCache::store(const std::string& key, std::string_view object) {
  if (!enabled() || !isKey(key)) return;
  const int dir = folder(/*create=*/true);
  if (dir < 0) return;
  std::string entry(kMagic, sizeof kMagic);
  putLE(entry, kEntryVersion, 4);
  putLE(entry, 0, 4);
  putLE(entry, object.size(), 8);
  const auto hash = hashBytes(object);
  entry.append(reinterpret_cast<const char*>(hash.data()), hash.size());
  entry.append(object);

  // A name no other writer uses: process id and a counter. O_EXCL with
  // mode 0600: a new file of this user's that no one else may write.
  static std::atomic<uint64_t> counter{0};
  const std::string name = key + ".kobj";
  const std::string temp = name + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::openat(dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  if (ok) {
    ok = writeAll(fd, entry);
    ok = ::close(fd) == 0 && ok;
  }
  if (ok) ok = ::renameat(dir, temp.c_str(), dir, name.c_str()) == 0;
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::unlinkat(dir, temp.c_str(), 0);
    std::lock_guard lock(mutex_);
    noticeUnusable((fd >= 0 ? "cannot write an entry: " : "cannot create an entry: ") + why);
    return;
  }
  trim();
}

void KernelCache::trim() {
  if (!enabled()) return;
  const int dir = folder(/*create=*/false);
  if (dir < 0) return;
  // A descriptor of its own for the listing: readdir moves a position that
  // a dup() would share with other threads.
  const int listFd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (listFd < 0) return;
  DIR* listing = ::fdopendir(listFd);
  if (!listing) {
    ::close(listFd);
    return;
  }
  struct Entry {
    timespec time;
    uint64_t size;
    std::string name;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  while (const dirent* d = ::readdir(listing)) {
    const std::string name = d->d_name;
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".kobj") != 0) continue;
    struct stat st;
    // Removed by another process meanwhile, or not a file: not counted.
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({st.st_mtim, static_cast<uint64_t>(st.st_size), name});
    total += static_cast<uint64_t>(st.st_size);
  }
  ::closedir(listing);
  if (total <= maxBytes_) return;
  // Oldest first; entries other processes remove at the same time are fine.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.time.tv_sec != b.time.tv_sec ? a.time.tv_sec < b.time.tv_sec : a.time.tv_nsec < b.time.tv_nsec;
  });
  for (const Entry& e : entries) {
    if (total <= maxBytes_ / 4 * 3) break;
    if (::unlinkat(dir, e.name.c_str(), 0) == 0) total -= e.size;
  }
}
}  // namespace kiln::codegen
