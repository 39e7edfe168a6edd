// EventPool: the device events the runtime orders streams with, kept for
// reuse (creating one is a driver call), and the one way the runtime makes a
// stream wait for another's work so far (WaitOn).
//
// An event is either spare (here) or taken: recorded as a storage's copy
// event while that copy is in flight, or being recorded by a caller that
// gives it back. A wait captures the event's work when it is enqueued, so a
// WaitOn's event is spare again at once.
//
// Invariants (CheckInvariants): no event is spare twice. Runtime::
// CheckInvariants adds that no copy event in flight is spare, and that no
// two storages share one.
#ifndef REMAT_RUNTIME_EVENT_POOL_H_
#define REMAT_RUNTIME_EVENT_POOL_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "device/device.h"

namespace remat::runtime_internal {

class EventPool {
 public:
  // `device` must outlive the pool.
  explicit EventPool(Device* device) : device_(device) {}
  ~EventPool() { DestroyAll(); }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A spare event, or a new one.
  absl::StatusOr<Event> Take() {
    if (!spare_.empty()) {
      const Event e = spare_.back();
      spare_.pop_back();
      return e;
    }
    return device_->CreateEvent();
  }
  // `e` is spare again (its last recording may still be pending).
  void Give(Event e) { spare_.push_back(e); }
  // Work enqueued on `waiter` from now on starts only after the work enqueued
  // on `producer` so far.
  absl::Status WaitOn(Stream waiter, Stream producer);
  // Destroys the spare events (failures are logged: nothing can be done).
  void DestroyAll();

  absl::Span<const Event> spare() const { return spare_; }
  absl::Status CheckInvariants() const;

 private:
  Device* const device_;
  std::vector<Event> spare_;
};

}  // namespace remat::runtime_internal

#endif  // REMAT_RUNTIME_EVENT_POOL_H_
