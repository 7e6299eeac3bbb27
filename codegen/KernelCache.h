// The disk cache of compiled kernels (docs/codegen.md section 5). An entry
// is the object code of one kernel module, stored under a key that the
// compiler derives from everything the code depends on (the module's LLVM
// IR text, target triple, CPU name and features, compiler version; see
// codegen/llvm/CpuJit.cpp), so a key never names two different objects and
// entries need no invalidation. Each entry file carries a magic, its
// payload's size and a BLAKE3 checksum of the payload: a truncated or
// corrupt entry is detected on lookup, reported as a notice, and rebuilt by
// the caller. Entries are written to a temporary file and renamed, so
// concurrent processes sharing the folder see whole entries or none.
//
// The cache is an optimization only: a folder that is missing and cannot be
// created, or that is read-only, gives one notice and compiling goes on
// without it. Notices are collected, not printed, so the tool decides
// where they go. The cache is safe to use from several threads.
//
// Trust: entries are machine code that Kiln links and runs, and checksums
// only guard against damage, so the cache is used only where no one but
// the user running Kiln (the effective user) can have put code. The folder
// must be owned by that user and writable by neither its group nor others;
// otherwise it is not used at all (one notice). Kiln creates the folder,
// and any missing parents, 0700. An existing parent is not checked (it may
// well be /tmp): no one else can add files to a folder that passes the
// check, and the folder is opened once and checked as opened, so every
// entry is read and written relative to that open folder even if its path
// is renamed or replaced later. Each entry must in turn be a regular file
// owned by that user and not writable by group or others, checked on the
// opened file; one that is not is a miss with a notice, and is removed and
// rebuilt. Kiln writes entries 0600.
//
// Size: after a store, when the entries take more than `maxBytes`, the
// least recently used ones (by modification time, which a hit refreshes)
// are removed until they take at most three quarters of it.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/Blake3.h"

namespace kiln::codegen {

/// The BLAKE3 hash of `data` as 64 lowercase hex digits (runtime/Blake3.h).
using kiln::contentHash;

class KernelCache {
 public:
  /// A cache in `dir`; an empty `dir` disables it (every lookup misses,
  /// stores do nothing).
  explicit KernelCache(std::string dir, uint64_t maxBytes = kDefaultMaxBytes);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  /// The default size bound of the entries: 1 GiB.
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{1} << 30;

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  /// The object stored under `key` (64 hex digits), or nullopt when there
  /// is none, or the entry is damaged or not trusted (a notice says which;
  /// the entry is removed so that the rebuilt object replaces it).
  std::optional<std::string> lookup(const std::string& key);
  /// Stores `object` under `key`, atomically. Failure to write is a notice
  /// (once per cache), never an error.
  void store(const std::string& key, std::string_view object);

  /// Removes the least recently used entries while they take more than
  /// the bound (see above); store() calls it.
  void trim();

  /// The notices since the last call (a damaged or untrusted entry, an
  /// unusable or untrusted folder).
  std::vector<std::string> takeNotices();

  /// The file an entry lives in, for tests that damage entries.
  std::string entryPath(const std::string& key) const;

 private:
  void notice(std::string message);
  void noticeUnusable(const std::string& why);
  /// The folder, opened and checked (creating it first when `create`); -1
  /// when it does not exist yet (and not `create`) or is not usable.
  int folder(bool create);

  std::string dir_;
  uint64_t maxBytes_;
  std::mutex mutex_;
  std::vector<std::string> notices_;
  bool warnedUnusable_ = false;
  int folderFd_ = -1;  // the open, checked folder
};

}  // namespace kiln::codegen
