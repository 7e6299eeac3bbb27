// Kiln's default OpenMP wait policy (OpenMpWaitPolicy.cpp): how long
// libgomp's idle threads spin before they sleep.
#pragma once

extern "C" {

/// What sets libgomp's wait policy in this process, for a user: Kiln's
/// default ("GOMP_SPINCOUNT=<n>, Kiln's default") or the environment's
/// ("OMP_WAIT_POLICY=passive, from the environment").
const char* kiln_openmp_wait_policy();

}
