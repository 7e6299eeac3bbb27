// kiln-difffuzz: the differential fuzzer across the backends
// (fuzz/difffuzz/README.md). For a time budget it draws small random graphs
// (Generate.h), runs each on the reference interpreter, the CPU JIT and the
// emulated GPU, and compares each backend with the interpreter by the rule
// of docs/ops.md (Check.h). A divergence is shrunk to a minimal case —
// outputs dropped, ops bypassed or replaced by inputs holding the values
// the interpreter gave them, input dims cut — written as a `.kir` file with
// its inputs as `.npy` files, and the command that reproduces it printed.
//
//   kiln-difffuzz [--seconds N] [--seed S] [--backends cpu,cuda] [--out DIR]
//   kiln-difffuzz --replay DIR [--backends ...]
//
// Exit status: 0 when every backend agreed (known issues, listed in
// knownIssues() below, are reported but do not fail), 1 on a divergence,
// 2 on a usage error.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/difffuzz/Case.h"
#include "fuzz/difffuzz/Check.h"
#include "fuzz/difffuzz/Generate.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "runtime/Npy.h"

using namespace kiln;
using namespace kiln::difffuzz;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  double seconds = 60;
  uint64_t seed = 1;
  std::vector<std::string> backends;  // empty: cpu, and cuda when the emulator is there
  std::string cudaDriver;
  double cudaShare = 0.3;
  std::string out = "difffuzz-out";
  std::string replay;
  double shrinkSeconds = 120;
  int threads = 2;
  bool keepGoing = false;
  bool knownIssuesFail = false;
  bool verbose = false;
  long maxCases = 0;
};

void usage(std::ostream& os) {
  os << "usage: kiln-difffuzz [--seconds N] [--seed S] [--backends cpu,cuda] [--cuda-driver PATH]\n"
        "                     [--cuda-share F] [--out DIR] [--shrink-seconds N] [--threads N]\n"
        "                     [--max-cases N] [--keep-going] [--known-issues-fail] [--verbose]\n"
        "       kiln-difffuzz --replay DIR [--backends cpu,cuda] [--cuda-driver PATH]\n";
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// --- Known issues ---------------------------------------------------------
// Divergences already filed and being fixed, so that CI stays green until
// the fix merges. Each is narrow (one op family on one backend, one kind of
// divergence), is still printed with its reproducer when found, and is
// removed once the fix lands (--known-issues-fail counts them as failures).

struct KnownIssue {
  const char* family;
  const char* reason;
  bool (*matches)(const std::string& backend, const Case& c, const Verdict& v);
};

const std::vector<KnownIssue>& knownIssues() {
  // None open: elu, softplus and conv padding were fixed (README.md, "Known
  // issues"; their reproducers are in test/difffuzz/).
  static const std::vector<KnownIssue> issues = {};
  return issues;
}

const KnownIssue* knownIssue(const std::string& backend, const Case& c, const Verdict& v) {
  for (const KnownIssue& k : knownIssues())
    if (k.matches(backend, c, v)) return &k;
  return nullptr;
}

// --- Shrinking ------------------------------------------------------------

/// `c` with node `j` replaced by a new input holding `value`.
Case nodeToInput(const Case& c, size_t j, const Tensor& value) {
  Case out = c;
  const int numInputs = static_cast<int>(c.inputs.size());
  const int old = c.nodeValue(j);
  auto renumber = [&](int v) { return v == old ? numInputs : v >= numInputs ? v + 1 : v; };
  out.inputs.push_back(value);
  for (Node& n : out.nodes)
    for (int& v : n.operands) v = renumber(v);
  for (int& v : out.outputs) v = renumber(v);
  removeDeadNodes(out);
  return out;
}

/// `c` with the uses of node `j` reading value `with` instead.
Case bypass(const Case& c, size_t j, int with) {
  Case out = c;
  const int old = c.nodeValue(j);
  for (Node& n : out.nodes)
    for (int& v : n.operands)
      if (v == old) v = with;
  for (int& v : out.outputs)
    if (v == old) v = with;
  removeDeadNodes(out);
  return out;
}

/// The first `size` entries of `t` along `dim`.
Tensor prefix(const Tensor& t, size_t dim, int64_t size) {
  std::vector<int64_t> shape = t.shape();
  const std::vector<int64_t> oldShape = shape;
  shape[dim] = size;
  Tensor out(t.dtype(), shape);
  const std::vector<int64_t> inStrides = t.strides();
  const size_t bytes = dtypeSize(t.dtype());
  for (int64_t i = 0; i < out.numElements(); ++i) {
    int64_t rest = i, src = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t idx = rest % shape[d];
      rest /= shape[d];
      src += idx * inStrides[d];
    }
    std::memcpy(out.raw() + static_cast<size_t>(i) * bytes, t.raw() + static_cast<size_t>(src) * bytes, bytes);
  }
  return out;
}

std::vector<Case> candidates(const Case& c, const Reference& ref) {
  std::vector<Case> out;
  if (c.outputs.size() > 1)
    for (int v : c.outputs) {
      Case one = c;
      one.outputs = {v};
      removeDeadNodes(one);
      out.push_back(std::move(one));
    }
  auto built = build(c);
  if (built) {
    for (size_t j = c.nodes.size(); j-- > 0;) {
      if (c.nodes[j].kind == OpKind::Constant) continue;
      const TensorType& t = built->ops[j]->result()->type();
      for (int v : c.nodes[j].operands) {
        const TensorType& vt = static_cast<size_t>(v) < c.inputs.size() ? c.inputs[static_cast<size_t>(v)].type()
                                                                         : built->ops[static_cast<size_t>(v) - c.inputs.size()]->result()->type();
        if (vt == t) out.push_back(bypass(c, j, v));
      }
    }
    for (size_t j = 0; j < c.nodes.size(); ++j)
      if (c.nodes[j].kind != OpKind::Constant && ref.nodeValues[j].numElements() > 0)
        out.push_back(nodeToInput(c, j, ref.nodeValues[j]));
  }
  // Input dims: one input's dim, the dims at the same place from the right
  // in every input, every dim of that size in every input.
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::vector<int64_t>& s = c.inputs[i].shape();
    for (size_t d = 0; d < s.size(); ++d) {
      const int64_t n = s[d];
      if (n <= 1) continue;
      const size_t fromRight = s.size() - d;
      for (int64_t size : {int64_t{1}, n / 2, n - 1}) {
        if (size < 1 || size >= n) continue;
        for (int strategy = 0; strategy < 3; ++strategy) {
          Case cut = c;
          for (size_t k = 0; k < c.inputs.size(); ++k) {
            const std::vector<int64_t>& ks = c.inputs[k].shape();
            for (size_t e = 0; e < ks.size(); ++e) {
              const bool take = strategy == 0 ? (k == i && e == d)
                                : strategy == 1 ? (ks.size() - e == fromRight && ks[e] == n)
                                                : ks[e] == n;
              if (take) cut.inputs[k] = prefix(cut.inputs[k], e, size);
            }
          }
          out.push_back(std::move(cut));
        }
      }
    }
  }
  return out;
}

/// The kind of a divergence: its message without the values and the place
/// ("NaN expected", "value differs", "run failed ...").
std::string kindOf(const Verdict& v) {
  std::string m = v.message;
  if (size_t p = m.find(": "); p != std::string::npos && m.rfind("result ", 0) == 0) m = m.substr(p + 2);
  if (size_t p = m.find(':'); p != std::string::npos) m = m.substr(0, p);
  if (size_t p = m.find(" by "); p != std::string::npos) m = m.substr(0, p);
  return m;
}

/// Whether `c` diverges on `backend` the way `like` did.
bool diverges(const Case& c, Backend& backend, const Verdict& like, Verdict* verdict) {
  if (!build(c)) return false;
  auto ref = reference(c);
  if (!ref) return false;
  Verdict v = check(c, *ref, backend);
  if (v.outcome != Outcome::Diverge || kindOf(v) != kindOf(like)) return false;
  *verdict = v;
  return true;
}

Expected<std::string> writeReproducer(const Case& c, const std::string& dir, const std::string& backend,
                                      const std::string& self, const Verdict& v);

/// With --verbose, each shrinking candidate is written to this folder before
/// it runs, so that a backend that crashes on one leaves it behind.
std::string gCandidateDir;

Case shrink(Case c, Backend& backend, Verdict& verdict, double seconds, int* steps) {
  const auto start = Clock::now();
  bool progress = true;
  while (progress && since(start) < seconds) {
    progress = false;
    auto ref = reference(c);
    if (!ref) break;
    for (Case& candidate : candidates(c, *ref)) {
      if (since(start) >= seconds) break;
      Verdict v;
      if (!gCandidateDir.empty())
        (void)writeReproducer(candidate, gCandidateDir, backend.name, "kiln-difffuzz", {Outcome::Diverge, "a shrinking candidate"});
      if (diverges(candidate, backend, verdict, &v)) {
        c = std::move(candidate);
        verdict = v;
        progress = true;
        ++*steps;
        break;
      }
    }
  }
  return c;
}

// --- Reproducers ----------------------------------------------------------

std::string shellQuote(const std::string& s) { return "'" + s + "'"; }

/// Writes `c` as DIR/case.kir and DIR/x<i>.npy; returns the reproducing
/// command.
Expected<std::string> writeReproducer(const Case& c, const std::string& dir, const std::string& backend,
                                      const std::string& self, const Verdict& v) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error("cannot create '" + dir + "': " + ec.message());
  auto built = build(c);
  if (!built) return built.takeError();
  {
    std::ofstream kir(dir + "/case.kir");
    kir << "// kiln-difffuzz reproducer (" << c.pattern << "), backend " << backend << ":\n// " << v.message << "\n";
    print(*built->module, kir);
    if (!kir) return Error("cannot write '" + dir + "/case.kir'");
  }
  std::string inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string path = dir + "/x" + std::to_string(i) + ".npy";
    KILN_TRY(writeNpy(path, c.inputs[i]));
    inputs += " --input x" + std::to_string(i) + "=" + shellQuote(path);
  }
  return self + " --replay " + shellQuote(dir) + " --backends " + backend + "\n    (or compare: kiln run " +
         shellQuote(dir + "/case.kir") + inputs + " --device " + backend + "  vs  --interpret)";
}

Expected<Case> readReproducer(const std::string& dir) {
  std::ifstream in(dir + "/case.kir");
  if (!in) return Error("cannot read '" + dir + "/case.kir' (a directory kiln-difffuzz wrote is expected)");
  std::stringstream text;
  text << in.rdbuf();
  auto module = parseModule(text.str(), dir + "/case.kir");
  if (!module) return module.takeError();
  KILN_TRY(verify(**module));
  if ((*module)->functions().empty()) return Error("'" + dir + "/case.kir' has no function");
  const Function& f = *(*module)->functions().front();
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < f.numArguments(); ++i) {
    auto t = readNpy(dir + "/x" + std::to_string(i) + ".npy");
    if (!t) return t.takeError();
    inputs.push_back(std::move(*t));
  }
  return fromFunction(f, std::move(inputs));
}

// --- Backends -------------------------------------------------------------

Expected<std::vector<Backend>> makeBackends(const Options& o) {
  std::vector<std::string> names = o.backends;
  std::string driver = o.cudaDriver;
  if (driver.empty()) {
    if (const char* env = std::getenv("KILN_CUDA_DRIVER")) driver = env;
#ifdef KILN_CUDA_EMULATOR_DRIVER
    if (driver.empty() && std::filesystem::exists(KILN_CUDA_EMULATOR_DRIVER)) driver = KILN_CUDA_EMULATOR_DRIVER;
#endif
  }
  if (names.empty()) {
    names = {"cpu"};
    if (!driver.empty()) names.push_back("cuda");
  }
  std::vector<Backend> out;
  for (const std::string& name : names) {
    SessionOptions so;
    so.allowFallback = false;
    so.cpu.threads = o.threads;
    if (name == "cpu") {
      so.device = "cpu";
    } else if (name == "cuda") {
      if (driver.empty())
        return Error("--backends cuda needs a CUDA driver: --cuda-driver PATH (the emulator is build/cuda-emulator/libcuda.so.1)");
      // The driver is found through $KILN_CUDA_DRIVER (docs/cuda.md).
      setenv("KILN_CUDA_DRIVER", driver.c_str(), 1);
      so.device = "cuda";
    } else {
      return Error("unknown backend '" + name + "' (expected cpu or cuda)");
    }
    auto session = Session::create(so);
    if (auto* err = std::get_if<DeviceError>(&session))
      return Error("backend " + name + " is not usable: " + err->error.message());
    out.push_back(Backend{name, std::move(std::get<std::unique_ptr<Session>>(session))});
  }
  return out;
}

int replay(const Options& o) {
  auto c = readReproducer(o.replay);
  if (!c) {
    std::cerr << "kiln-difffuzz: " << c.error().str() << "\n";
    return 2;
  }
  auto backends = makeBackends(o);
  if (!backends) {
    std::cerr << "kiln-difffuzz: " << backends.error().str() << "\n";
    return 2;
  }
  auto ref = reference(*c);
  if (!ref) {
    std::cerr << "kiln-difffuzz: the interpreter refuses the case: " << ref.error().str() << "\n";
    return 2;
  }
  int status = 0;
  for (Backend& b : *backends) {
    Verdict v = check(*c, *ref, b);
    const char* what = v.outcome == Outcome::Agree ? "agrees" : v.outcome == Outcome::Skipped ? "skipped" : "DIVERGES";
    std::cout << b.name << ": " << what << (v.message.empty() ? "" : ": " + v.message) << "\n";
    if (v.outcome == Outcome::Diverge) status = 1;
  }
  return status;
}

Expected<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> Expected<std::string> {
      if (i + 1 >= argc) return Error(a + " needs a value");
      return std::string(argv[++i]);
    };
    auto number = [&](double lo) -> Expected<double> {
      auto v = value();
      if (!v) return v.takeError();
      char* end = nullptr;
      const double d = std::strtod(v->c_str(), &end);
      if (v->empty() || *end || !(d >= lo)) return Error(a + " takes a number of at least " + std::to_string(lo) + ", not '" + *v + "'");
      return d;
    };
#define KILN_NUMBER(field, lo, cast)   \
  {                                    \
    auto n = number(lo);               \
    if (!n) return n.takeError();      \
    o.field = static_cast<cast>(*n);   \
    continue;                          \
  }
#define KILN_STRING(field)             \
  {                                    \
    auto s = value();                  \
    if (!s) return s.takeError();      \
    o.field = *s;                      \
    continue;                          \
  }
    if (a == "--seconds") KILN_NUMBER(seconds, 0, double)
    if (a == "--seed") KILN_NUMBER(seed, 0, uint64_t)
    if (a == "--cuda-share") KILN_NUMBER(cudaShare, 0, double)
    if (a == "--shrink-seconds") KILN_NUMBER(shrinkSeconds, 0, double)
    if (a == "--threads") KILN_NUMBER(threads, 1, int)
    if (a == "--max-cases") KILN_NUMBER(maxCases, 0, long)
    if (a == "--cuda-driver") KILN_STRING(cudaDriver)
    if (a == "--out") KILN_STRING(out)
    if (a == "--replay") KILN_STRING(replay)
    if (a == "--backends") {
      auto s = value();
      if (!s) return s.takeError();
      o.backends = split(*s);
      continue;
    }
    if (a == "--keep-going") { o.keepGoing = true; continue; }
    if (a == "--known-issues-fail") { o.knownIssuesFail = true; continue; }
    if (a == "--verbose") { o.verbose = true; continue; }
    if (a == "--help" || a == "-h") { usage(std::cout); std::exit(0); }
    return Error("unknown argument '" + a + "'");
#undef KILN_NUMBER
#undef KILN_STRING
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parse(argc, argv);
  if (!parsed) {
    std::cerr << "kiln-difffuzz: " << parsed.error().message() << "\n";
    usage(std::cerr);
    return 2;
  }
  const Options& o = *parsed;
  if (!o.replay.empty()) return replay(o);
  auto backends = makeBackends(o);
  if (!backends) {
    std::cerr << "kiln-difffuzz: " << backends.error().str() << "\n";
    return 2;
  }
  std::cout << "kiln-difffuzz: seed " << o.seed << ", " << o.seconds << " s, backends";
  for (const Backend& b : *backends) std::cout << " " << b.name;
  std::cout << std::endl;

  if (o.verbose) gCandidateDir = o.out + "/last-candidate";
  const auto start = Clock::now();
  std::mt19937_64 rng(o.seed);
  long graphs = 0, ops = 0, skippedRef = 0, divergences = 0, known = 0;
  std::vector<long> skipped(backends->size(), 0), compared(backends->size(), 0);
  std::set<const KnownIssue*> knownSeen;
  for (long n = 0; since(start) < o.seconds && (o.maxCases == 0 || n < o.maxCases); ++n) {
    const uint64_t caseSeed = rng();
    std::mt19937_64 caseRng(caseSeed);
    Case c = generate(caseRng);
    auto ref = reference(c);
    if (!ref) {
      ++skippedRef;
      continue;
    }
    ++graphs;
    ops += static_cast<long>(numOps(c));
    bool stop = false;
    for (size_t bi = 0; bi < backends->size(); ++bi) {
      Backend& b = (*backends)[bi];
      // The emulated GPU (NVRTC and PTX emulation) is slow: it gets a share
      // of the time, not every case.
      if (b.session->device().kind == DeviceChoice::Kind::Cuda && backends->size() > 1 && b.cases > 0 && b.seconds > o.cudaShare * since(start)) continue;
      Verdict v = check(c, *ref, b);
      if (v.outcome == Outcome::Skipped) {
        ++skipped[bi];
        if (o.verbose) std::cout << "  case " << n << " skipped on " << b.name << ": " << v.message << "\n";
        continue;
      }
      ++compared[bi];
      if (v.outcome == Outcome::Agree) continue;
      const double foundAt = since(start);
      // A known issue seen before is counted without shrinking it again, so
      // that it does not eat the time budget; the first is shrunk briefly.
      const KnownIssue* before = o.knownIssuesFail ? nullptr : knownIssue(b.name, c, v);
      if (before && knownSeen.count(before)) {
        ++known;
        if (o.verbose) std::cout << "  case " << n << " on " << b.name << ": known issue " << before->family << " again\n";
        continue;
      }
      std::cout << "kiln-difffuzz: divergence on " << b.name << " after " << foundAt << " s (case " << n << ", "
                << c.pattern << ", " << numOps(c) << " ops): " << v.message << std::endl;
      int steps = 0;
      Case small = shrink(c, b, v, before ? std::min(o.shrinkSeconds, 10.0) : o.shrinkSeconds, &steps);
      const std::string dir = o.out + "/" + b.name + "-seed" + std::to_string(o.seed) + "-case" + std::to_string(n);
      auto command = writeReproducer(small, dir, b.name, argv[0], v);
      std::cout << "  shrunk in " << steps << " steps to " << numOps(small) << " ops, " << small.inputs.size()
                << " inputs: " << v.message << "\n";
      auto module = build(small);
      if (module) std::cout << print(*module->module);
      if (command)
        std::cout << "  reproduce: " << *command << "\n";
      else
        std::cout << "  (could not write the reproducer: " << command.error().message() << ")\n";
      if (const KnownIssue* k = knownIssue(b.name, small, v); k && !o.knownIssuesFail) {
        std::cout << "  known issue: " << k->family << ": " << k->reason << " (not counted; later ones not shown)\n";
        knownSeen.insert(k);
        ++known;
        continue;
      }
      std::cout << "  a new divergence: counted\n";
      ++divergences;
      if (!o.keepGoing) stop = true;
      break;
    }
    if (stop) break;
  }
  std::cout << "kiln-difffuzz: " << graphs << " graphs, " << ops << " ops in " << since(start) << " s";
  for (size_t bi = 0; bi < backends->size(); ++bi)
    std::cout << "; " << (*backends)[bi].name << ": " << compared[bi] << " compared, " << skipped[bi] << " skipped ("
              << (*backends)[bi].seconds << " s)";
  std::cout << "; " << skippedRef << " refused by the interpreter; " << divergences << " divergences, " << known
            << " known issues" << std::endl;
  return divergences ? 1 : 0;
}
