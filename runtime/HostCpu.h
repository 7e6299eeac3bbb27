// Which instruction-set features this CPU has, read with CPUID, named as
// LLVM names them ("avx2", "avx512f", ...): what the runtime checks before
// it runs machine code compiled elsewhere, since it links no LLVM to ask.
// Features that need the operating system's support (AVX's and AVX-512's
// registers, saved by XSAVE) count only when the OS enables them, as LLVM
// counts them.
#pragma once

#include <set>
#include <string>
#include <string_view>

namespace kiln {

/// The features of this CPU among those hostCpuFeatureNames() lists.
std::set<std::string> hostCpuFeatures();
/// Every feature this file knows how to detect.
const std::set<std::string>& hostCpuFeatureNames();

/// The features `required` (LLVM's "+a,-b,+c" form) asks for that `host`
/// lacks, comma-separated, or "" when it has them all. A feature required
/// "-" or unknown to hostCpuFeatureNames() is not checked.
std::string missingCpuFeatures(std::string_view required, const std::set<std::string>& host);

}  // namespace kiln
