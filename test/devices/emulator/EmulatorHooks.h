// Hooks of Kiln's emulated GPU (libcuda.so.1 in <build>/cuda-emulator) for
// the emulator's own math libraries (its cuBLASLt, in the same folder, links
// against the emulator's libcuda.so.1): host work that runs in stream order
// like a kernel, and the translation of device addresses to the host memory
// behind them. No NVIDIA driver has these entry points; they exist only in
// the emulator.
//
// A work item enqueued with kilnEmulatorEnqueue runs on the thread that
// synchronizes, when every earlier command of its stream has finished (and
// is recorded, not run, while the stream is being captured into a CUDA
// graph: each launch of the graph runs it again). Inside it, device memory
// is reached through kilnEmulatorTranslate; a range that is not inside one
// live allocation gives nullptr, and the work should then call
// kilnEmulatorFault and return, which fails the stream with
// CUDA_ERROR_ILLEGAL_ADDRESS as a kernel's stray access would.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_EMULATOR_EXPORT __attribute__((visibility("default")))

/// Enqueues `fn(user)` on `stream` (a CUstream; null is the legacy default
/// stream). `destroy(user)`, when not null, is called once the work item is
/// released: after it ran, or, for a captured item, when its graph is
/// destroyed. Returns a CUresult (0 on success; the context's sticky error
/// if a fault has broken it).
KILN_EMULATOR_EXPORT int kilnEmulatorEnqueue(void* stream, void (*fn)(void* user), void* user,
                                             void (*destroy)(void* user));

/// The host address of device bytes [devicePtr, devicePtr + bytes), which
/// must lie inside one live allocation; nullptr otherwise.
KILN_EMULATOR_EXPORT void* kilnEmulatorTranslate(unsigned long long devicePtr, unsigned long long bytes);

/// Fails the work item now running with CUDA_ERROR_ILLEGAL_ADDRESS;
/// `message` says what went wrong (kept for kilnEmulatorLastFault, and
/// printed with $KILN_EMULATOR_VERBOSE). Called outside a work item it only
/// records the message and breaks the context.
KILN_EMULATOR_EXPORT void kilnEmulatorFault(const char* message);

/// "Kiln CUDA emulator 1 (PTX interpreter)": Kiln's test that the driver it
/// opened is the emulator.
KILN_EMULATOR_EXPORT const char* kilnEmulatorDescription(void);

/// The last fault or load error the emulator recorded (an illegal or
/// misaligned address, naming the kernel, the instruction, the address and
/// the nearest allocation; an unknown PTX instruction), or "" when none.
KILN_EMULATOR_EXPORT const char* kilnEmulatorLastFault(void);

#ifdef __cplusplus
}
#endif
