// Kiln's choice of OpenMP wait policy (OpenMpWaitPolicy.cpp): how long
// libgomp's idle threads spin before they sleep, chosen when the process
// starts from how busy the cores are.
#pragma once

extern "C" {

/// What sets libgomp's wait policy in this process, for a user: Kiln's
/// choice ("GOMP_SPINCOUNT=<n>, Kiln's choice: <k> other runnable tasks on
/// <c> cores when it started") or the environment's ("OMP_WAIT_POLICY=
/// passive, from the environment").
const char* kiln_openmp_wait_policy();

/// The spin count Kiln chooses when `otherRunnable` tasks of other
/// programs are runnable on `cpus` cores: short once they fill every core,
/// libgomp's own default otherwise.
long kiln_openmp_spin_count_for(int otherRunnable, int cpus);

}
