// kiln-opt: parse Kiln text IR, verify it, run a pass pipeline, print it
// (tools/KilnOpt.h; `kiln-opt --help`).
#include "tools/KilnOpt.h"

int main(int argc, char** argv) { return kiln::kilnOptMain(argc, argv); }
