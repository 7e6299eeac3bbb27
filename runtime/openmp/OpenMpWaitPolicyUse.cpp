// Compiled into every executable that links kiln_runtime
// (runtime/CMakeLists.txt). The policy library does its work in its
// constructor and nothing calls it, so the linker's --as-needed (Debian's
// GCC passes it by default) would leave it out of the executable; this
// reference keeps it in.
#include "runtime/openmp/OpenMpWaitPolicy.h"

[[gnu::used]] static const char* (*const kilnOpenMpWaitPolicyReference)() = &kiln_openmp_wait_policy;
