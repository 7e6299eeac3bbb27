// Kiln's choice of libgomp's wait policy (GNU OpenMP, which oneDNN runs
// on), made when the process starts, before libgomp reads it.
//
// Why: libgomp's idle threads spin for GOMP_SPINCOUNT iterations of a
// pause loop before they sleep, 300000 by default (8-15 ms on an AMD EPYC,
// whose pause takes 26-50 ns), after every parallel region. When other
// programs keep every core busy, a spinning thread loses its core, and the
// next region (the next oneDNN call) waits until the OS gives it one back:
// it is not woken, as a sleeping thread would be. MobileNetV2 at batch 1 on
// 2 cores with two busy loops took 118 times its quiet time (issue 28).
// With a short spin (kBusySpinCount), a thread that has waited some tens of
// microseconds sleeps and is woken, and scheduled, when the next region
// starts. On a quiet machine that costs a wake-up wherever oneDNN's calls
// come further apart than the spin (about 80 us on the VMs Kiln is
// developed on: MobileNetV2 took 10 ms against 6 ms with the long spin), so
// the long spin stays where the cores are free.
//
// How: libgomp reads its environment once, in its constructor, and has no
// call that changes the policy afterwards; it also keeps no count of the
// cores other programs use. This library's constructor counts the other
// runnable tasks (procs_running in /proc/stat, less this one; the median of
// three samples 2 ms apart) and sets GOMP_SPINCOUNT to kBusySpinCount when
// they fill every core this process may run on, else to libgomp's own
// default, unless the user has set OMP_WAIT_POLICY or GOMP_SPINCOUNT
// (theirs is then used as it is). The choice holds for the process's life.
// It runs before libgomp's constructor because the loader initializes the
// libraries an executable needs from the last listed, each after the
// libraries it needs: executables link it after oneDNN
// (runtime/CMakeLists.txt), and test/lit/tools/openmp-wait-policy.test
// checks that libgomp sees the value. It is a library of its own because an
// executable's own constructors run after its libraries'. The Python
// package makes the same choice before it loads its extension
// (python/kiln/__init__.py).
#include "runtime/openmp/OpenMpWaitPolicy.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

/// libgomp's spin when the other programs leave a core free: its own
/// default.
constexpr long kQuietSpinCount = 300000;
/// Its spin when they fill every core: about 26-50 us on an AMD EPYC, less
/// on CPUs with a shorter pause. Keep python/kiln/__init__.py's copies the
/// same.
constexpr long kBusySpinCount = 1000;

char description[200] = "";

/// Runnable tasks on the machine now (procs_running), or -1.
int runningTasks() {
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return -1;
  char line[256];
  int running = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "procs_running ", 14) == 0) running = std::atoi(line + 14);
  std::fclose(f);
  return running;
}

int usableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

[[gnu::constructor]] void chooseOpenMpWaitPolicy() {
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name)) {
      std::snprintf(description, sizeof description, "%s=%s, from the environment", name, value);
      return;
    }
  }
  int samples[3];
  for (int& s : samples) {
    s = runningTasks() - 1;  // this process's thread is running
    const timespec pause{0, 2000000};
    if (&s != &samples[2]) nanosleep(&pause, nullptr);
  }
  std::sort(samples, samples + 3);
  const int others = samples[1], cpus = usableCpus();
  const long spin = kiln_openmp_spin_count_for(others, cpus);
  char value[32];
  std::snprintf(value, sizeof value, "%ld", spin);
  setenv("GOMP_SPINCOUNT", value, 0);
  std::snprintf(description, sizeof description,
                "GOMP_SPINCOUNT=%ld, Kiln's choice: %d other runnable task%s on %d core%s when it started", spin,
                others, others == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s");
}

}  // namespace

extern "C" long kiln_openmp_spin_count_for(int otherRunnable, int cpus) {
  return otherRunnable >= cpus ? kBusySpinCount : kQuietSpinCount;
}

extern "C" const char* kiln_openmp_wait_policy() { return description; }
