// Kiln's default wait policy for libgomp (GNU OpenMP, which oneDNN runs
// on), set before libgomp reads it.
//
// Why: libgomp's idle threads spin for GOMP_SPINCOUNT iterations of a
// pause loop before they sleep, 300000 by default (15 ms on an AMD EPYC,
// whose pause takes about 50 ns), after every parallel region. When other
// programs keep every core busy, a spinning thread loses its core, and the
// next region (the next oneDNN call) waits until the OS gives it one back:
// it is not woken, as a sleeping thread would be. MobileNetV2 at batch 1 on
// 2 cores with two busy loops took 118 times its quiet time (issue 28).
// With a short spin, a thread that has waited a few tens of microseconds
// sleeps, and is woken (and scheduled) when the next region starts, while
// on a quiet machine regions that follow each other within that time still
// find it spinning.
//
// How: libgomp reads its environment once, in its constructor, and has no
// call that changes the policy afterwards. This library's constructor sets
// GOMP_SPINCOUNT when the user has set neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT (theirs is then used as it is); it runs first because the
// loader initializes the libraries an executable needs from the last
// listed, each after the libraries it needs: executables link it after
// oneDNN (runtime/CMakeLists.txt), and test/lit/tools/openmp-wait-policy.test
// checks that libgomp sees the value. It is a library of its own because an
// executable's own constructors run after its libraries'. The Python
// package sets the same default before it loads its extension
// (python/kiln/__init__.py).
#include "runtime/openmp/OpenMpWaitPolicy.h"

#include <cstdio>
#include <cstdlib>
#include <initializer_list>

namespace {

/// About 50 us on an AMD EPYC (50 ns a pause), 5-15 us on CPUs with a
/// shorter pause. Keep python/kiln/__init__.py's copy the same.
constexpr const char* kSpinCount = "1000";

char description[160] = "";

[[gnu::constructor]] void setOpenMpWaitPolicy() {
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name)) {
      std::snprintf(description, sizeof description, "%s=%s, from the environment", name, value);
      return;
    }
  }
  setenv("GOMP_SPINCOUNT", kSpinCount, 0);
  std::snprintf(description, sizeof description, "GOMP_SPINCOUNT=%s, Kiln's default", kSpinCount);
}

}  // namespace

extern "C" const char* kiln_openmp_wait_policy() { return description; }
