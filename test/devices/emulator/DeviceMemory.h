// The emulated GPU's global memory: allocations at device addresses of the
// emulator's own (from 0x7e0000000000, never host addresses, so a host that
// dereferences a device pointer crashes), each backed by host memory and
// found through an ordered map, so that every kernel access and every copy
// is checked against the live allocations. Addresses are handed out in
// increasing order with a guard gap between allocations and are not reused
// until the range wraps, so a stale pointer to freed memory faults instead
// of reaching a newer allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kiln::emulator {

struct Allocation {
  uint64_t base = 0;
  uint64_t bytes = 0;
  uint8_t* host = nullptr;
};

class DeviceMemory {
 public:
  static constexpr uint64_t kFirstAddress = 0x7e0000000000ull;
  static constexpr uint64_t kLastAddress = 0x7f0000000000ull;  // exclusive
  static constexpr uint64_t kAlignment = 256;
  static constexpr uint64_t kGuardGap = 1ull << 20;

  explicit DeviceMemory(uint64_t limit) : limit_(limit) {}
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  /// A new zeroed allocation of `bytes` (at least 1), or 0 when it would
  /// exceed the limit or the host has no memory for it.
  uint64_t allocate(uint64_t bytes);
  /// Frees the allocation that starts at `address`; false when none does.
  bool free(uint64_t address);
  /// The allocation holding [address, address + bytes), or null.
  const Allocation* find(uint64_t address, uint64_t bytes) const;
  /// The host address of [address, address + bytes), or null.
  uint8_t* translate(uint64_t address, uint64_t bytes) const {
    const Allocation* a = find(address, bytes);
    return a ? a->host + (address - a->base) : nullptr;
  }
  /// "0x7e0000100000 (4096 bytes), 16 bytes past its end": the allocation
  /// nearest to `address`, for fault messages.
  std::string nearest(uint64_t address) const;

  uint64_t used() const { return used_; }
  uint64_t limit() const { return limit_; }

 private:
  uint64_t limit_;
  uint64_t used_ = 0;
  uint64_t next_ = kFirstAddress;
  std::map<uint64_t, Allocation> allocations_;  // by base address
};

/// "0x7e0000000100".
std::string hexAddress(uint64_t address);

}  // namespace kiln::emulator
