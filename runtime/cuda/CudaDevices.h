// Is CUDA usable here, and on which devices? `probeCuda` answers what
// `kiln devices` prints and what `--device cuda[:N]` requires: it loads the
// driver (CudaLibraries.h), calls cuInit, compares the CUDA version the
// driver supports with the one Kiln needs, and for each device reads its
// name, compute capability, multiprocessor count and memory, and retains
// its primary context (as the CUDA runtime does on first use) to learn that
// the device can really be used and how much memory is free.
//
// Every way of failing has its own CudaProblem and a message that says what
// happened and what to do; `requireCudaDevice` turns the same report into
// the error that `--device cuda` fails with, so that the two never disagree
// and nothing silently falls back to the CPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/Support.h"
#include "runtime/cuda/CudaLibraries.h"

namespace kiln::cuda {

/// Why CUDA (or one device) is not usable.
enum class CudaProblem {
  None,               // usable
  NoDriver,           // libcuda.so.1 could not be loaded (or lacks an entry point)
  DriverError,        // cuInit failed otherwise: stub library, driver/kernel mismatch, ...
  DriverTooOld,       // CUDA_ERROR_INSUFFICIENT_DRIVER, or the driver's CUDA version < the required one
  NoDevice,           // CUDA_ERROR_NO_DEVICE, or zero devices
  DeviceUnavailable,  // busy, prohibited or exclusive-process mode held elsewhere
  OutOfMemory,        // context creation ran out of device memory
};

/// "no-driver", "driver-too-old", ...: the stable name in `--json` output.
const char* cudaProblemName(CudaProblem problem);

/// One device as the driver describes it.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int computeMajor = 0;
  int computeMinor = 0;
  int multiprocessors = 0;
  int computeMode = 0;
  uint64_t totalBytes = 0;
  std::optional<uint64_t> freeBytes;  // known when a context could be created
  CudaProblem problem = CudaProblem::None;
  std::string message;  // why it is not usable and what to do; empty when usable

  bool usable() const { return problem == CudaProblem::None; }
};

/// The whole answer.
struct CudaReport {
  CudaProblem problem = CudaProblem::None;  // None when at least one device is usable
  std::string message;                      // the reason and what to do; empty when usable
  std::string driverPath;                   // empty when no driver was loaded
  std::string driverRelease;                // "580.65.06" (from the library's file name), or "unknown"
  int driverCudaVersion = 0;                // cuDriverGetVersion: the newest CUDA the driver supports
  /// Kiln's emulated GPU describes itself here (test/devices/emulator/);
  /// empty for an NVIDIA driver.
  std::string emulated;
  std::vector<CudaDeviceInfo> devices;

  bool usable() const { return problem == CudaProblem::None; }
  /// The usable devices' indices.
  std::vector<int> usableDevices() const;
};

/// Probes the driver and devices. With `onlyDevice`, only that device's
/// context is created (the others are still counted and described).
CudaReport probeCuda(const LibrarySearchOptions& options, std::optional<int> onlyDevice = std::nullopt);

/// The device `--device cuda[:N]` names (`index` empty for plain `cuda`:
/// the first usable device), or the error saying precisely why it cannot
/// be used: the report's reason, a device index out of range (naming how
/// many devices exist), or that device's own problem.
Expected<CudaDeviceInfo> requireCudaDevice(const LibrarySearchOptions& options, std::optional<int> index);

/// "79.65 GiB" for a byte count.
std::string formatBytes(uint64_t bytes);

}  // namespace kiln::cuda
