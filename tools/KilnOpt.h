// kiln-opt as a library: the whole tool behind one call, so that a test can
// register a backend of its own (codegen/Backend.h registerBackend) and run
// `kiln-opt --target NAME` in the same process (test/unit/stub-backend/).
#pragma once

namespace kiln {

/// Runs kiln-opt with the command line `argv[0..argc)` (argv[0] is the
/// program's name): 0 on success, 1 when a chunk failed, 2 on a usage
/// error. Output goes to stdout or `-o FILE`, diagnostics and
/// --print-after-all to stderr.
int kilnOptMain(int argc, char** argv);

}  // namespace kiln
