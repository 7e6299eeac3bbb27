// The emulated GPU's allocations (DeviceMemory.h).
#include "test/devices/emulator/DeviceMemory.h"

#include <cstdio>
#include <cstdlib>

namespace kiln::emulator {

std::string hexAddress(uint64_t address) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

DeviceMemory::~DeviceMemory() {
  for (auto& [base, a] : allocations_) std::free(a.host);
}

uint64_t DeviceMemory::allocate(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > limit_ - used_ || bytes > kLastAddress - kFirstAddress) return 0;
  const uint64_t span = (bytes + kGuardGap + kAlignment - 1) / kAlignment * kAlignment;
  uint64_t base = next_;
  if (base + span > kLastAddress || base + span < base) {
    // Wrap around: the first gap between live allocations that fits.
    base = kFirstAddress;
    for (const auto& [start, a] : allocations_) {
      if (start >= base + span) break;
      base = (a.base + a.bytes + kGuardGap + kAlignment - 1) / kAlignment * kAlignment;
    }
    if (base + span > kLastAddress) return 0;
  }
  auto* host = static_cast<uint8_t*>(std::calloc(bytes, 1));
  if (!host) return 0;
  allocations_[base] = Allocation{base, bytes, host};
  used_ += bytes;
  next_ = base + span;
  return base;
}

bool DeviceMemory::free(uint64_t address) {
  auto it = allocations_.find(address);
  if (it == allocations_.end()) return false;
  used_ -= it->second.bytes;
  std::free(it->second.host);
  allocations_.erase(it);
  return true;
}

const Allocation* DeviceMemory::find(uint64_t address, uint64_t bytes) const {
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (address - a.base >= a.bytes || bytes > a.bytes - (address - a.base)) return nullptr;
  return &a;
}

std::string DeviceMemory::nearest(uint64_t address) const {
  if (allocations_.empty()) return "no live allocations";
  auto after = allocations_.upper_bound(address);
  const Allocation* best = nullptr;
  uint64_t distance = ~0ull;
  if (after != allocations_.end()) {
    best = &after->second;
    distance = after->second.base - address;
  }
  if (after != allocations_.begin()) {
    const Allocation& before = std::prev(after)->second;
    const uint64_t end = before.base + before.bytes;
    const uint64_t d = address >= end ? address - end : 0;
    if (d <= distance) {
      best = &before;
      distance = d;
    }
  }
  std::string text = "nearest allocation " + hexAddress(best->base) + " (" + std::to_string(best->bytes) + " bytes)";
  if (address < best->base)
    return text + ": the address is " + std::to_string(best->base - address) + " bytes before it";
  const uint64_t end = best->base + best->bytes;
  const std::string offset = ": the address is at offset " + std::to_string(address - best->base);
  if (address >= end) return text + offset + ", " + std::to_string(address - end) + " bytes past its end";
  return text + offset + ", and the access runs past its end";
}

}  // namespace kiln::emulator
