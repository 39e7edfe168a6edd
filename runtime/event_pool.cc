#include "runtime/event_pool.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace remat::runtime_internal {

absl::Status EventPool::WaitOn(Stream waiter, Stream producer) {
  if (waiter == producer) return absl::OkStatus();
  REMAT_ASSIGN_OR_RETURN(const Event e, Take());
  absl::Status s = device_->RecordEvent(e, producer);
  if (s.ok()) s = device_->StreamWaitEvent(waiter, e);
  // Spare again either way: a wait captured the recording; a failed record
  // or wait left nothing behind that uses it.
  Give(e);
  return s;
}

void EventPool::DestroyAll() {
  for (Event e : spare_) {
    if (absl::Status s = device_->DestroyEvent(e); !s.ok()) {
      REMAT_LOG(kWarning, "runtime: destroying an event: %s", s.ToString());
    }
  }
  spare_.clear();
}

absl::Status EventPool::CheckInvariants() const {
  std::vector<std::uintptr_t> handles;
  handles.reserve(spare_.size());
  for (Event e : spare_) handles.push_back(e.handle);
  std::sort(handles.begin(), handles.end());
  if (auto twice = std::adjacent_find(handles.begin(), handles.end()); twice != handles.end()) {
    return absl::InternalError(
        absl::StrFormat("event pool: event %#x is spare twice", *twice));
  }
  return absl::OkStatus();
}

}  // namespace remat::runtime_internal
