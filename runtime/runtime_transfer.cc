// Runtime's copies and blocks: offload to pinned host memory, restore and
// prefetch back, drop, and handing device blocks back to the allocator in
// stream order. Every copy is ordered by events (events_), never by a
// host-wide sync; the host link model (link_) counts what each one carries.
#include "base/log.h"
#include "base/status_macros.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace remat {

absl::Status Runtime::PrefetchStorage(Storage* s, Stream stream) {
  SettleCopies(s);
  if (s->state != TensorState::kOnHost && s->state != TensorState::kOffloading) {
    return absl::OkStatus();  // resident, on its way, or dropped: nothing to copy
  }
  REMAT_ASSIGN_OR_RETURN(void* const ptr, AllocateDevice(s->bytes, stream, s->serial));
  // The copy stream writes the block only after `stream`'s earlier work on it,
  // and (same stream) after the offload's copy out.
  // On any failure the block goes back, and the tensor stays on the host.
  absl::StatusOr<Event> done = events_.Take();
  absl::Status st = done.ok() ? events_.WaitOn(copy_stream_, stream) : done.status();
  if (st.ok()) {
    st = device_->CopyAsync(ptr, s->host, s->bytes, CopyKind::kHostToDevice, copy_stream_);
  }
  if (st.ok()) st = device_->RecordEvent(*done, copy_stream_);
  if (!st.ok()) {
    if (done.ok()) events_.Give(*done);
    (void)allocator_->FreeOnStream(ptr, stream);
    return st;
  }
  if (s->copy_in_flight) events_.Give(s->copy_event);
  s->copy_event = *done;
  s->copy_in_flight = true;
  (void)host_pool_.FreeAfter(s->host, copy_stream_);
  s->host = nullptr;
  SetResident(s, ptr);
  SetState(s, TensorState::kPrefetching);
  s->used_streams.assign({stream, copy_stream_});
  stats_.restored_bytes += s->bytes;
  link_.Queue(s->bytes, device_->NowNs());
  ++stats_.prefetches;
  return absl::OkStatus();
}

absl::Status Runtime::Restore(Storage* s, Stream stream) {
  SettleCopies(s);
  if (s->state == TensorState::kPrefetching) {
    REMAT_RETURN_IF_ERROR(device_->StreamWaitEvent(stream, s->copy_event));
    events_.Give(s->copy_event);
    s->copy_in_flight = false;
    SetState(s, TensorState::kResident);
    return absl::OkStatus();
  }
  // On host (or still being copied out: the copy in on `stream` then waits
  // for the copy out).
  REMAT_ASSIGN_OR_RETURN(void* const ptr, AllocateDevice(s->bytes, stream, s->serial));
  if (s->copy_in_flight) {
    if (absl::Status st = device_->StreamWaitEvent(stream, s->copy_event); !st.ok()) {
      (void)allocator_->FreeOnStream(ptr, stream);
      return st;
    }
    events_.Give(s->copy_event);
    s->copy_in_flight = false;
  }
  if (absl::Status st =
          device_->CopyAsync(ptr, s->host, s->bytes, CopyKind::kHostToDevice, stream);
      !st.ok()) {
    (void)allocator_->FreeOnStream(ptr, stream);
    return st;
  }
  (void)host_pool_.FreeAfter(s->host, stream);
  s->host = nullptr;
  SetResident(s, ptr);
  s->used_streams.push_back(stream);
  stats_.restored_bytes += s->bytes;
  link_.Queue(s->bytes, device_->NowNs());
  return absl::OkStatus();
}

void Runtime::SettleCopies(Storage* s) {
  if (!s->copy_in_flight || s->state != TensorState::kOffloading) return;
  absl::StatusOr<bool> done = device_->QueryEvent(s->copy_event);
  if (done.ok() && *done) {
    s->copy_in_flight = false;
    events_.Give(s->copy_event);
    SetState(s, TensorState::kOnHost);
  }
}

void Runtime::HandBack(Storage* s, Stream to) {
  for (Stream used : s->used_streams) (void)events_.WaitOn(to, used);
  absl::Status freed = allocator_->FreeOnStream(s->device, to);
  if (!freed.ok()) REMAT_LOG(kError, "runtime: giving back a block: %s", freed.ToString());
  LeaveDevice(s);
}

bool Runtime::DropStorage(Storage* s, Stream to) {
  HandBack(s, to);
  SetState(s, TensorState::kDropped);
  return true;
}

bool Runtime::OffloadStorage(Storage* s, Stream to) {
  absl::StatusOr<void*> host = host_pool_.Allocate(s->bytes);
  if (!host.ok()) return false;
  // Copy out on the copy stream, behind every use of the block.
  for (Stream used : s->used_streams) (void)events_.WaitOn(copy_stream_, used);
  absl::StatusOr<Event> done = events_.Take();
  absl::Status st = done.ok() ? device_->CopyAsync(*host, s->device, s->bytes,
                                                   CopyKind::kDeviceToHost, copy_stream_)
                              : done.status();
  if (st.ok()) st = device_->RecordEvent(*done, copy_stream_);
  if (!st.ok()) {
    REMAT_LOG(kWarning, "runtime: offload failed, trying another eviction: %s", st.ToString());
    if (done.ok()) events_.Give(*done);
    (void)host_pool_.FreeAfter(*host, copy_stream_);
    return false;
  }
  // The block goes back on `to`, which waits for the copy out: stream-ordered,
  // the host never blocks.
  s->used_streams.assign({copy_stream_});
  HandBack(s, to);
  s->host = *host;
  s->copy_event = *done;
  s->copy_in_flight = true;
  SetState(s, TensorState::kOffloading);
  stats_.offloaded_bytes += s->bytes;
  link_.Queue(s->bytes, device_->NowNs());
  ++stats_.offloads;
  return true;
}

}  // namespace remat
