// The kernel cache of KernelCache.h. An entry file `<key>.kobj` is
//
//   "KILNOBJ\0"  u32 format version  u32 zero  u64 payload size
//   32-byte BLAKE3 hash of the payload  payload
//
// with integers little-endian. Lookup checks all of it before returning
// the payload, so a truncated file, a flipped byte or a foreign file is a
// miss with a notice, never bad code handed to the linker.
#include "codegen/KernelCache.h"

#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/BLAKE3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::codegen {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '\0'};
constexpr uint32_t kEntryVersion = 1;
constexpr size_t kHashBytes = 32;
constexpr size_t kHeaderBytes = sizeof kMagic + 4 + 4 + 8 + kHashBytes;
/// Entries larger than this are not objects Kiln wrote.
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 31;

std::array<uint8_t, kHashBytes> hashBytes(std::string_view data) {
  llvm::BLAKE3 hasher;
  hasher.update(llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  return hasher.final();
}

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

}  // namespace

std::string contentHash(std::string_view data) { return llvm::toHex(hashBytes(data), /*LowerCase=*/true); }

KernelCache::KernelCache(std::string dir, uint64_t maxBytes) : dir_(std::move(dir)), maxBytes_(maxBytes) {}

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

std::optional<std::string> KernelCache::lookup(const std::string& key) {
  if (!enabled() || !isKey(key)) return std::nullopt;
  const std::string path = entryPath(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;  // a miss
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = std::move(buffer).str();
  std::string problem;
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    problem = bytes.size() < kHeaderBytes ? "truncated header" : "not a Kiln cache entry";
  } else if (getLE(bytes, 8, 4) != kEntryVersion) {
    problem = "entry format " + std::to_string(getLE(bytes, 8, 4)) + ", expected " + std::to_string(kEntryVersion);
  } else if (const uint64_t size = getLE(bytes, 16, 8); size > kMaxEntryBytes || size != bytes.size() - kHeaderBytes) {
    problem = "size " + std::to_string(bytes.size() - kHeaderBytes) + " bytes, header says " + std::to_string(size);
  } else {
    std::string_view payload(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
    const auto hash = hashBytes(payload);
    if (std::memcmp(hash.data(), bytes.data() + 24, kHashBytes) != 0) {
      problem = "checksum mismatch";
    } else {
      // A hit counts as a use for trim(); a read-only folder keeps the old time.
      std::error_code ec;
      std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), ec);
      return std::string(payload);
    }
  }
  std::lock_guard lock(mutex_);
  notice("kernel cache entry '" + path + "' is damaged (" + problem + "); it is rebuilt");
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return std::nullopt;
}

void KernelCache::store(const std::string& key, std::string_view object) {
  if (!enabled() || !isKey(key)) return;
  {
    std::lock_guard lock(mutex_);
    if (warnedUnusable_) return;
    if (!dirReady_) {
      std::error_code ec;
      std::filesystem::create_directories(dir_, ec);
      if (!std::filesystem::is_directory(dir_, ec)) {
        noticeUnusable(ec ? ec.message() : "cannot create the folder");
        return;
      }
      dirReady_ = true;
    }
  }
  std::string entry(kMagic, sizeof kMagic);
  putLE(entry, kEntryVersion, 4);
  putLE(entry, 0, 4);
  putLE(entry, object.size(), 8);
  const auto hash = hashBytes(object);
  entry.append(reinterpret_cast<const char*>(hash.data()), hash.size());
  entry.append(object);

  // A name no other writer uses: process id and a counter.
  static std::atomic<uint64_t> counter{0};
  const std::string path = entryPath(key);
  const std::string temp = path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(counter++);
  bool ok = false;
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (out) {
      out.write(entry.data(), static_cast<std::streamsize>(entry.size()));
      out.close();
      ok = !out.fail();
    }
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(temp, path, ec);
  if (!ok || ec) {
    std::filesystem::remove(temp, ec);
    std::lock_guard lock(mutex_);
    noticeUnusable(ok ? "cannot rename an entry into place" : "cannot write an entry");
    return;
  }
  trim();
}

void KernelCache::trim() {
  if (!enabled()) return;
  struct Entry {
    std::filesystem::file_time_type time;
    uint64_t size;
    std::filesystem::path path;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir_, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    if (it->path().extension() != ".kobj") continue;
    std::error_code entryError;
    const uint64_t size = it->file_size(entryError);
    const auto time = it->last_write_time(entryError);
    if (entryError) continue;  // removed by another process meanwhile
    entries.push_back({time, size, it->path()});
    total += size;
  }
  if (total <= maxBytes_) return;
  // Oldest first; entries other processes remove at the same time are fine.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= maxBytes_ / 4 * 3) break;
    std::error_code removeError;
    if (std::filesystem::remove(e.path, removeError)) total -= e.size;
  }
}

}  // namespace kiln::codegen
