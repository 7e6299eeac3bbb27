// Executes one kernel launch of decoded PTX (Ptx.h) on the CPU, on the
// calling thread. Blocks run one after another; within a block each warp
// of 32 threads runs in lockstep: every thread keeps its own program
// counter, and each step executes the instruction at the smallest counter
// among the warp's runnable threads, for every thread at it, in a loop over
// those lanes. That reconverges structured control flow where a GPU does,
// so shuffles and votes see the lanes they would. A warp runs until all its
// threads have exited or wait at a barrier; bar.sync releases when every
// thread of the block that has not exited waits. Kernels without barriers
// run their warps one at a time through one register file.
//
// Every global access is checked against the live allocations and for
// alignment; shared, local and parameter accesses against their sizes. A
// bad access stops the launch with a Fault naming the kernel, the
// instruction, the thread, the address and the nearest allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test/devices/emulator/DeviceMemory.h"
#include "test/devices/emulator/Ptx.h"

namespace kiln::emulator {

/// A kernel ready to launch: its decoded code and the values of its
/// constant slots, with module variables' device addresses filled in.
struct LoadedKernel {
  const Kernel* kernel = nullptr;
  std::vector<uint64_t> constantValues;  // parallel to kernel->constants
};

struct LaunchShape {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t dynamicSharedBytes = 0;
  /// Not 0: run blocks, and warps between barriers, in an order shuffled
  /// with this seed instead of index order (adversarial mode), so a kernel
  /// that reads what another warp or block writes without synchronizing
  /// shows it.
  uint64_t orderSeed = 0;
};

/// Why a launch stopped: a CUresult (700 illegal address, 716 misaligned
/// address, 719 launch failure) and a message.
struct Fault {
  int code = 0;
  std::string message;
};

/// Counts of what the interpreter did, for measurements.
struct InterpreterStats {
  uint64_t launches = 0;
  uint64_t warpInstructions = 0;
  uint64_t laneInstructions = 0;
  double seconds = 0;  // spent in runKernel
};

/// Runs the launch to completion. Returns false, with `fault` filled in,
/// when a thread makes an illegal or misaligned access or traps; the
/// launch's other effects up to that point remain, as on a GPU.
bool runKernel(const LoadedKernel& kernel, const LaunchShape& shape, const uint8_t* params, DeviceMemory& memory,
               Fault& fault, InterpreterStats* stats = nullptr);

}  // namespace kiln::emulator
