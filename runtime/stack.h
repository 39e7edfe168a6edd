// Stack: a device, a caching allocator over it and, where asked, a runtime
// over that: what every door and every replay builds, built one way.
//
//   Stack s = MakeStack(DeviceSpec{...}, {.budget = 12 * kGiB}, RuntimeOptions{...}).value();
//   s.runtime->Create(...);
//
// Members are destroyed in reverse order of their making (the runtime, then
// the allocator, then the device), as each needs the next to outlive it.
#ifndef REMAT_RUNTIME_STACK_H_
#define REMAT_RUNTIME_STACK_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "device/device.h"
#include "device/device_spec.h"
#include "runtime/runtime.h"

namespace remat {

struct Stack {
  Stack() = default;
  Stack(Stack&&) = default;
  // Lets go of its own members in order before taking the other's.
  Stack& operator=(Stack&& other) noexcept;
  ~Stack() = default;  // members go in reverse order of declaration

  std::unique_ptr<Device> device;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<Runtime> runtime;  // null unless asked for
};

// Over a device of the caller's making (a SimDevice the caller keeps a typed
// pointer to, say). `runtime`: none when empty.
absl::StatusOr<Stack> MakeStack(std::unique_ptr<Device> device, const AllocatorOptions& allocator,
                                std::optional<RuntimeOptions> runtime = std::nullopt);
absl::StatusOr<Stack> MakeStack(const DeviceSpec& device, const AllocatorOptions& allocator,
                                std::optional<RuntimeOptions> runtime = std::nullopt);

// For a stack that one thread makes and uses alone (the simulator's
// replays): sets every part's options to go without locks. `runtime` may be
// null (a stack without one).
void ForOneThread(SimDeviceOptions* device, AllocatorOptions* allocator,
                  RuntimeOptions* runtime = nullptr);

}  // namespace remat

#endif  // REMAT_RUNTIME_STACK_H_
