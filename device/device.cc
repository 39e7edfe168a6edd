#include "device/device.h"

#include "absl/strings/str_cat.h"

namespace remat {
namespace {

absl::Status NoVirtualMemory(const Device& device, const char* op) {
  return absl::UnimplementedError(
      absl::StrCat(device.Describe(), " has no virtual memory (", op, ")"));
}

}  // namespace

absl::StatusOr<void*> Device::ReserveAddressRange(std::size_t) {
  return NoVirtualMemory(*this, "ReserveAddressRange");
}
absl::Status Device::ReleaseAddressRange(void*) {
  return NoVirtualMemory(*this, "ReleaseAddressRange");
}
absl::StatusOr<PhysicalChunk> Device::CreateChunk(std::size_t) {
  return NoVirtualMemory(*this, "CreateChunk");
}
absl::Status Device::ReleaseChunk(PhysicalChunk) { return NoVirtualMemory(*this, "ReleaseChunk"); }
absl::Status Device::Map(void*, PhysicalChunk) { return NoVirtualMemory(*this, "Map"); }
absl::Status Device::SetAccess(void*, std::size_t) { return NoVirtualMemory(*this, "SetAccess"); }
absl::Status Device::Unmap(void*, std::size_t) { return NoVirtualMemory(*this, "Unmap"); }

}  // namespace remat
