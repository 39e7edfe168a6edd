#include "runtime/stack.h"

#include <utility>

#include "base/status_macros.h"

namespace remat {

Stack& Stack::operator=(Stack&& other) noexcept {
  if (this != &other) {
    runtime.reset();
    allocator.reset();
    device.reset();
    device = std::move(other.device);
    allocator = std::move(other.allocator);
    runtime = std::move(other.runtime);
  }
  return *this;
}

absl::StatusOr<Stack> MakeStack(std::unique_ptr<Device> device, const AllocatorOptions& allocator,
                                std::optional<RuntimeOptions> runtime) {
  if (device == nullptr) return absl::InvalidArgumentError("a stack needs a device");
  Stack stack;
  stack.device = std::move(device);
  REMAT_ASSIGN_OR_RETURN(stack.allocator, CachingAllocator::Create(stack.device.get(), allocator));
  if (runtime.has_value()) {
    REMAT_ASSIGN_OR_RETURN(stack.runtime,
                           Runtime::Create(stack.allocator.get(), *std::move(runtime)));
  }
  return stack;
}

absl::StatusOr<Stack> MakeStack(const DeviceSpec& device, const AllocatorOptions& allocator,
                                std::optional<RuntimeOptions> runtime) {
  REMAT_ASSIGN_OR_RETURN(std::unique_ptr<Device> made, MakeDevice(device));
  return MakeStack(std::move(made), allocator, std::move(runtime));
}

void ForOneThread(SimDeviceOptions* device, AllocatorOptions* allocator,
                  RuntimeOptions* runtime) {
  device->thread_safe = false;
  allocator->thread_safe = false;
  if (runtime != nullptr) runtime->thread_safe = false;
}

}  // namespace remat
