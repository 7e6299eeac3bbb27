// The disk kernel cache (codegen/KernelCache.h) and the CPU executor using
// it: entries round-trip; a truncated, corrupted or foreign entry is a miss
// with a notice and is removed; an unusable folder gives one notice and no
// error; the least recently used entries go when the cache outgrows its
// bound; a second executor on the same model takes every module from the
// cache and computes the same results; a damaged entry is rebuilt. Trust:
// Kiln creates folders 0700 and entries 0600 whatever the umask; a folder
// its group or others can write is not used (one notice), nor is one of
// another user; an entry its group can write or of another user is a miss
// with a notice and is rebuilt 0600. Giving files to another user needs
// root (as CI runs the tests); elsewhere that test is skipped.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codegen/cpu/CpuExecutable.h"
#include "codegen/KernelCache.h"
#include "codegen/llvm/CpuJit.h"
#include "ir/Parser.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using codegen::CompileReport;
using codegen::contentHash;
using codegen::CpuExecutor;
using codegen::KernelCache;

/// A fresh folder under the test's temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ =
        fs::temp_directory_path() / ("kiln-cache-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

const std::string kKey = contentHash("some module");

/// The permission bits of `path`.
unsigned modeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

/// Whether `text` contains `part`, for EXPECT_TRUE with a readable failure.
testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

TEST(KernelCacheTest, ContentHashIsBlake3Hex) {
  // BLAKE3 of the empty input, from the BLAKE3 reference test vectors.
  EXPECT_EQ(contentHash(""), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
  EXPECT_NE(contentHash("a"), contentHash("b"));
}

TEST(KernelCacheTest, StoresAndFindsEntries) {
  TempDir dir;
  KernelCache cache(dir.str() + "/nested/kiln");  // created on the first store
  EXPECT_FALSE(cache.lookup(kKey));
  cache.store(kKey, std::string("\x7f"
                                "ELF object\0bytes",
                                17));
  auto found = cache.lookup(kKey);
  ASSERT_TRUE(found);
  EXPECT_EQ(*found, std::string("\x7f"
                                "ELF object\0bytes",
                                17));
  EXPECT_TRUE(cache.takeNotices().empty());
}

TEST(KernelCacheTest, DamagedEntriesAreMissesWithANotice) {
  TempDir dir;
  KernelCache cache(dir.str());
  const std::string object(1000, 'x');
  struct Damage {
    const char* what;
    std::string (*apply)(std::string);
  };
  const Damage damages[] = {
      {"truncated", [](std::string e) { return e.substr(0, e.size() - 10); }},
      {"checksum mismatch",
       [](std::string e) {
         e[e.size() / 2] ^= 1;
         return e;
       }},
      {"not a Kiln cache entry",
       [](std::string e) {
         e[0] = 'X';
         return e;
       }},
      {"truncated header", [](std::string e) { return e.substr(0, 20); }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    cache.store(kKey, object);
    const std::string path = cache.entryPath(kKey);
    writeFile(path, d.apply(readFile(path)));
    EXPECT_FALSE(cache.lookup(kKey));
    auto notices = cache.takeNotices();
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_NE(notices[0].find("is damaged"), std::string::npos) << notices[0];
    EXPECT_NE(notices[0].find("rebuilt"), std::string::npos) << notices[0];
    EXPECT_FALSE(fs::exists(path));  // removed, so the rebuilt entry replaces it
  }
}

TEST(KernelCacheTest, UnusableFolderIsOneNotice) {
  TempDir dir;
  fs::create_directories(dir.str());
  writeFile(dir.str() + "/file", "");
  KernelCache cache(dir.str() + "/file/kiln");  // a path under a regular file
  cache.store(kKey, "object");
  cache.store(contentHash("other"), "object");
  EXPECT_FALSE(cache.lookup(kKey));
  auto notices = cache.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("not usable"), std::string::npos) << notices[0];
}

TEST(KernelCacheTest, DisabledCacheDoesNothing) {
  KernelCache cache("");
  EXPECT_FALSE(cache.enabled());
  cache.store(kKey, "object");
  EXPECT_FALSE(cache.lookup(kKey));
  EXPECT_TRUE(cache.takeNotices().empty());
}

TEST(KernelCacheTest, FoldersAre0700AndEntries0600WhateverTheUmask) {
  TempDir dir;
  const mode_t saved = ::umask(0);  // would give 0777 folders and 0666 files
  KernelCache cache(dir.str() + "/nested/kiln");
  cache.store(kKey, "object");
  ::umask(saved);
  EXPECT_EQ(modeOf(dir.str()), 0700u);
  EXPECT_EQ(modeOf(dir.str() + "/nested"), 0700u);
  EXPECT_EQ(modeOf(dir.str() + "/nested/kiln"), 0700u);
  EXPECT_EQ(modeOf(cache.entryPath(kKey)), 0600u);
  // Written through a temporary file renamed into place: nothing else is left.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.str() + "/nested/kiln")) files.push_back(e.path().filename());
  EXPECT_EQ(files, std::vector<std::string>{kKey + ".kobj"});
  EXPECT_EQ(cache.lookup(kKey), std::optional<std::string>("object"));
  EXPECT_TRUE(cache.takeNotices().empty());
}

TEST(KernelCacheTest, FolderOthersCanWriteIsNotUsed) {
  const std::pair<fs::perms, std::string> cases[] = {
      {fs::perms::all, "writable by its group and others, mode 0777"},
      {fs::perms::owner_all | fs::perms::group_all, "writable by its group, mode 0770"},
      {fs::perms::owner_all | fs::perms::others_write | fs::perms::others_exec, "writable by others, mode 0703"},
  };
  for (const auto& [perms, why] : cases) {
    SCOPED_TRACE(why);
    TempDir dir;
    {
      KernelCache cache(dir.str());  // an entry stored while the folder was private
      cache.store(kKey, "object");
      ASSERT_TRUE(cache.lookup(kKey));
    }
    fs::permissions(dir.str(), perms);
    KernelCache cache(dir.str());
    EXPECT_FALSE(cache.lookup(kKey));  // not read from the shared folder,
    const std::string other = contentHash("other");
    cache.store(other, "object");  // nor written to it
    EXPECT_FALSE(fs::exists(cache.entryPath(other)));
    EXPECT_FALSE(cache.lookup(other));
    const std::vector<std::string> notices = cache.takeNotices();
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_TRUE(contains(notices[0], "the kernel cache '" + dir.str() + "' is not trusted (" + why +
                                         "): Kiln runs the machine code in it, which others could have put there, so "
                                         "it compiles without it; make it private (chmod go-w '" +
                                         dir.str() + "') or use another folder"));
  }
}

TEST(KernelCacheTest, EntryItsGroupCanWriteIsAMissAndIsRebuilt) {
  TempDir dir;
  KernelCache cache(dir.str());
  cache.store(kKey, "object");
  const std::string path = cache.entryPath(kKey);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::group_write | fs::perms::others_read);
  EXPECT_FALSE(cache.lookup(kKey));
  const std::vector<std::string> notices = cache.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0],
            "kernel cache entry '" + path + "' is not trusted (writable by its group, mode 0664); it is rebuilt");
  EXPECT_FALSE(fs::exists(path));  // removed, so the rebuilt entry replaces it
  cache.store(kKey, "object");
  EXPECT_EQ(modeOf(path), 0600u);
  EXPECT_EQ(cache.lookup(kKey), std::optional<std::string>("object"));
  EXPECT_TRUE(cache.takeNotices().empty());
}

TEST(KernelCacheTest, FolderAndEntryOfAnotherUserAreNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a file to another user (uid 65534) needs root; CI runs tests as root";
  const std::string me = std::to_string(::geteuid());
  TempDir dir;
  KernelCache cache(dir.str());
  cache.store(kKey, "object");
  const std::string path = cache.entryPath(kKey);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(cache.lookup(kKey));
  std::vector<std::string> notices = cache.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0], "kernel cache entry '" + path + "' is not trusted (owned by uid 65534, not by uid " + me +
                            ", which runs Kiln); it is rebuilt");
  EXPECT_FALSE(fs::exists(path));

  cache.store(kKey, "object");
  ASSERT_EQ(::chown(dir.str().c_str(), 65534, 65534), 0);
  KernelCache theirs(dir.str());
  EXPECT_FALSE(theirs.lookup(kKey));
  const std::string other = contentHash("other");
  theirs.store(other, "object");
  EXPECT_FALSE(fs::exists(theirs.entryPath(other)));
  notices = theirs.takeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(contains(notices[0], "the kernel cache '" + dir.str() +
                                       "' is not trusted (owned by uid 65534, not by uid " + me +
                                       ", which runs Kiln)"));
  EXPECT_TRUE(contains(notices[0], "use a folder of your own (--cache-dir DIR) or --no-cache"));
}

TEST(KernelCacheTest, LeastRecentlyUsedEntriesGoWhenOverTheBound) {
  TempDir dir;
  // Entries of 1,000 bytes plus a 56-byte header; the bound holds three.
  KernelCache cache(dir.str(), 3500);
  const std::string object(1000, 'o');
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(contentHash("module " + std::to_string(i)));
    cache.store(keys.back(), object);
    // Distinct, increasing times, whatever the file system's resolution.
    fs::last_write_time(cache.entryPath(keys.back()), fs::file_time_type::clock::now() - std::chrono::hours(10 - i));
  }
  EXPECT_TRUE(cache.lookup(keys[0]));  // a hit makes entry 0 the most recent
  keys.push_back(contentHash("module 3"));
  cache.store(keys.back(), object);  // four entries: over the bound
  // Trimmed to at most 2625 bytes: the two least recently used (1 and 2) go.
  EXPECT_TRUE(fs::exists(cache.entryPath(keys[0])));
  EXPECT_FALSE(fs::exists(cache.entryPath(keys[1])));
  EXPECT_FALSE(fs::exists(cache.entryPath(keys[2])));
  EXPECT_TRUE(fs::exists(cache.entryPath(keys[3])));
  EXPECT_TRUE(cache.takeNotices().empty());
}

constexpr const char* kModel = R"(func @f(%x: f32[4,16], %w: f32[16,8]) -> f32[4,8] {
  %m = matmul(%x, %w) : f32[4,8]
  %e = exp(%m) : f32[4,8]
  %t = tanh(%e) : f32[4,8]
  return %t
}
)";

std::vector<Tensor> modelInputs() {
  Tensor x(DType::F32, {4, 16}), w(DType::F32, {16, 8});
  for (int64_t i = 0; i < x.numElements(); ++i) x.setDouble(i, 0.01 * (i % 13) - 0.05);
  for (int64_t i = 0; i < w.numElements(); ++i) w.setDouble(i, 0.02 * (i % 7) - 0.06);
  return {x, w};
}

/// Runs kModel with a cache in `dir`; returns its output and the report.
/// Compiled at -O2, so the model is several kernels (and LLVM modules).
std::pair<Tensor, CompileReport> runCached(const std::string& dir, std::vector<std::string>* notices = nullptr) {
  auto m = parseModule(kModel, "test.kir");
  EXPECT_TRUE(m.ok());
  CompileReport report;
  auto executor = CpuExecutor::create(*(*m)->functions().front(),
                                      {.threads = 2, .optLevel = 2, .cacheDir = dir, .report = &report});
  EXPECT_TRUE(executor.ok());
  auto out = (*executor)->run(modelInputs());
  EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.error().str());
  if (notices) *notices = (*executor)->takeNotices();
  return {out.ok() ? (*out)[0] : Tensor(), report};
}

TEST(KernelCacheTest, SecondCompileTakesEveryModuleFromTheCache) {
  TempDir dir;
  auto [first, cold] = runCached(dir.str());
  EXPECT_EQ(cold.kernels, 3);
  EXPECT_EQ(cold.cacheHits, 0);
  EXPECT_GT(cold.optimize, 0);
  auto [second, warm] = runCached(dir.str());
  EXPECT_EQ(warm.cacheHits, warm.modules);
  EXPECT_EQ(warm.optimize, 0);
  EXPECT_EQ(warm.codegen, 0);
  ASSERT_EQ(first.numElements(), second.numElements());
  for (int64_t i = 0; i < first.numElements(); ++i) EXPECT_EQ(first.getDouble(i), second.getDouble(i));
}

TEST(KernelCacheTest, CorruptEntryIsRebuilt) {
  TempDir dir;
  auto [want, cold] = runCached(dir.str());
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir.str())) entries.push_back(e.path());
  ASSERT_EQ(entries.size(), static_cast<size_t>(cold.modules));
  std::string bytes = readFile(entries[0].string());
  bytes[bytes.size() - 3] ^= 0x40;
  writeFile(entries[0].string(), bytes);

  std::vector<std::string> notices;
  auto [got, rebuilt] = runCached(dir.str(), &notices);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("checksum mismatch"), std::string::npos) << notices[0];
  EXPECT_EQ(rebuilt.cacheHits, rebuilt.modules - 1);
  for (int64_t i = 0; i < want.numElements(); ++i) EXPECT_EQ(got.getDouble(i), want.getDouble(i));
  // The rebuilt entry is whole again.
  auto [again, warm] = runCached(dir.str());
  EXPECT_EQ(warm.cacheHits, warm.modules);
}

}  // namespace
}  // namespace kiln
