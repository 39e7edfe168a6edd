// Runtime's copies and blocks: offload to pinned host memory, restore and
// prefetch back (with the next uses learned from the step before that plan it), drop, and handing device blocks back to the allocator in
// stream order. Every copy is ordered by events (events_), never by a
// host-wide sync; the host link model (link_) counts what each one carries.
//
// Errors: calls that return a Status pass device errors on, leaving the
// tensor where it was. Eviction and collection cannot (the pressure handler
// answers with a bool, and collection runs from a Guard's destructor); there
// each failure is handled where it happens, as the comments say.
#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "runtime/runtime.h"
#include "runtime/runtime_internal.h"

namespace remat {

// A use the program made (not a closure's): where the step before says the
// tensor's next use comes.
void Runtime::LearnUse(Storage* s, bool created) {
  if (created) {
    if (step_uses_.size() >= UINT32_MAX) return;  // a step this long learns no more
    s->step_index = static_cast<std::uint32_t>(step_uses_.size());
    s->step_epoch = step_epoch_;
    step_uses_.emplace_back();
  } else if (s->step_epoch != step_epoch_) {
    return;  // made in an earlier step
  }
  // Uses are placed by their order in the step (the clock may not move
  // between two: a framework's backward creates nothing), and a gap of uses
  // is read as time at the step before's pace.
  // The step starts with its first use (not at the EndStep before it: a
  // device's clock may count from boot, and a program may idle between steps).
  if (step_use_count_ == 0) step_start_ns_ = Clock();
  std::vector<std::int64_t>& uses = step_uses_[s->step_index];
  uses.push_back(step_use_count_++);
  if (s->step_index >= last_step_uses_.size()) return;  // the step before made fewer
  // The j-th use now is the j-th then: the next comes as many uses after it.
  const std::vector<std::int64_t>& then = last_step_uses_[s->step_index];
  const std::size_t j = uses.size() - 1;
  if (j + 1 < then.size()) {
    const std::int64_t gap = then[j + 1] - then[j];
    const std::int64_t ahead_ns = gap > INT64_MAX / ns_per_use_ ? INT64_MAX : gap * ns_per_use_;
    s->next_use_at = AddTimes(Clock(), ahead_ns);
  } else {
    s->next_use_at = kNeverUsedAgain;
  }
  s->next_use_recomputed_ns = stats_.recompute_ns;
  s->next_use_learned = true;
  ++stats_.learned_next_uses;
}

std::int64_t Runtime::PrefetchLeadNs(const Storage* s) const {
  // Started `lead` before the use, a copy in that waits on no other copy
  // lands in time, with time to spare where the lead is above 1 (the margin
  // covers a hint that comes early, and a copy the model thinks quicker than
  // it is). Started earlier, the block only holds memory the budget is short
  // of: with a fast link and a fixed window, prefetches made room for
  // themselves by evicting what the next prefetch then had to bring back,
  // and copies, not compute, set the pace.
  const double lead = std::min(prefetch_lead_ * static_cast<double>(link_.OneWayNs(s->bytes)),
                               static_cast<double>(prefetch_window_ns_));
  return lead >= 0x1p62 ? std::int64_t{1} << 62 : static_cast<std::int64_t>(lead);
}

void Runtime::PlanPrefetch(Storage* s) {
  if (prefetch_window_ns_ == 0 || s->next_use_at < 0 || s->next_use_at == kNeverUsedAgain) return;
  if (s->state != TensorState::kOnHost && s->state != TensorState::kOffloading) return;
  if (s->planned_prefetch_at == s->next_use_at) return;  // already planned for then
  // Brought back and evicted again before its use: the budget had no room
  // for it that long. Planned again, the prefetch would take room from what
  // then evicts it once more (a 100-layer chain at 0.4 of its reserved peak
  // made 1,400 such round trips and stalled on the link for 8x its compute).
  if (s->prefetch_evicted) return;
  s->planned_prefetch_at = s->next_use_at;
  planned_.push_back({s->next_use_at, s->next_use_at - PrefetchLeadNs(s), s, s->serial});
  std::push_heap(planned_.begin(), planned_.end(), PlannedPrefetch::Later);
}

void Runtime::PrefetchDue(Stream stream) {
  if (prefetch_blocked_at_ == handbacks_) return;  // no memory came back since it found no room
  // A copy started now lands after the copies in queued before it: an entry
  // is due that much before its own start, but never while its use is
  // further off than the window (the soonest start waits, and those behind
  // it, for a later look).
  const std::int64_t now = Clock();
  const std::int64_t horizon =
      now + std::min(link_.BacklogNs(runtime_internal::HostLink::kIn, now), prefetch_window_ns_);
  while (!planned_.empty() && planned_.front().start_ns <= horizon &&
         planned_.front().at_ns - now <= prefetch_window_ns_) {
    std::pop_heap(planned_.begin(), planned_.end(), PlannedPrefetch::Later);
    const PlannedPrefetch p = planned_.back();
    planned_.pop_back();
    Storage* s = p.storage;
    if (s->serial != p.serial) continue;  // stale: collected (the object reused)
    if (s->planned_prefetch_at == p.at_ns) s->planned_prefetch_at = -1;  // its entry is out
    if (s->next_use_at != p.at_ns || s->pins > 0 || s->prefetch_evicted ||
        (s->state != TensorState::kOnHost && s->state != TensorState::kOffloading)) {
      continue;  // stale: hinted again, already back, or evicted from a prefetch before
    }
    absl::Status st;
    {
      // While it makes room, only what is used after it may go.
      prefetch_for_ns_ = p.at_ns;
      absl::Cleanup unlimit = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { prefetch_for_ns_ = -1; };
      st = PrefetchStorage(s, stream);
    }
    if (!st.ok()) {
      // No room now (or the device failed): the tensor stays on the host and
      // comes back on access, or at a later look.
      s->planned_prefetch_at = p.at_ns;
      planned_.push_back(p);
      std::push_heap(planned_.begin(), planned_.end(), PlannedPrefetch::Later);
      prefetch_blocked_at_ = handbacks_;
      break;
    }
  }
}

absl::Status Runtime::PrefetchStorage(Storage* s, Stream stream) {
  SettleCopies(s);
  if (s->state != TensorState::kOnHost && s->state != TensorState::kOffloading) {
    return absl::OkStatus();  // resident, on its way, or dropped: nothing to copy
  }
  const bool kept = s->kept != nullptr;
  REMAT_ASSIGN_OR_RETURN(void* const ptr, BlockToRestore(s, stream));
  // The prefetch stream writes the block only after `stream`'s earlier work
  // on it, and after the offload's copy out if that is still running (it
  // runs on the other engine's stream); the host buffer goes back to the pool
  // behind the copy in. On any failure the block goes back, and the tensor
  // stays on the host.
  absl::StatusOr<Event> done = events_.Take();
  absl::Status st = done.ok() ? events_.WaitOn(prefetch_stream_, stream) : done.status();
  if (st.ok() && s->copy_in_flight) st = device_->StreamWaitEvent(prefetch_stream_, s->copy_event);
  bool copying = false;
  if (st.ok()) {
    st = device_->CopyAsync(ptr, s->host, s->bytes, CopyKind::kHostToDevice, prefetch_stream_);
    copying = st.ok();
  }
  if (st.ok()) st = device_->RecordEvent(*done, prefetch_stream_);
  if (st.ok()) st = host_pool_.FreeAfter(s->host, prefetch_stream_);
  if (!st.ok()) {
    if (done.ok()) events_.Give(*done);
    if (copying) {
      // The copy in may still write the block, and `stream` is not ordered
      // after it: the host waits for it. If it cannot, the block is kept
      // from the allocator (a leak on a failing device, never a race).
      if (absl::Status synced = device_->SynchronizeStream(prefetch_stream_); !synced.ok()) {
        REMAT_LOG(kError, "runtime: a failed prefetch's block is kept: %s", synced.ToString());
        return st;
      }
    }
    UndoRestoreBlock(s, ptr, kept, stream);
    return st;
  }
  if (s->copy_in_flight) events_.Give(s->copy_event);
  s->copy_event = *done;
  s->copy_in_flight = true;
  s->host = nullptr;
  SetResident(s, ptr, &prefetch_stream_);
  SetState(s, TensorState::kPrefetching);
  s->used_streams.assign({stream, prefetch_stream_});
  stats_.restored_bytes += s->bytes;
  link_.Queue(runtime_internal::HostLink::kIn, s->bytes, Clock());
  ++stats_.prefetches;
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kRestored, .stream = prefetch_stream_, .prefetch = true});
  }
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
  // for the copy out). On any failure the block goes back behind what was
  // enqueued on `stream`, and the tensor stays on the host, with the copy
  // out's event (if any) still to wait for.
  const bool kept = s->kept != nullptr;
  REMAT_ASSIGN_OR_RETURN(void* const ptr, BlockToRestore(s, stream));
  absl::Status st =
      s->copy_in_flight ? device_->StreamWaitEvent(stream, s->copy_event) : absl::OkStatus();
  if (st.ok()) st = device_->CopyAsync(ptr, s->host, s->bytes, CopyKind::kHostToDevice, stream);
  if (st.ok()) st = host_pool_.FreeAfter(s->host, stream);
  if (!st.ok()) {
    UndoRestoreBlock(s, ptr, kept, stream);
    return st;
  }
  if (s->copy_in_flight) {
    events_.Give(s->copy_event);
    s->copy_in_flight = false;
  }
  s->host = nullptr;
  SetResident(s, ptr, &stream);
  s->used_streams.push_back(stream);
  stats_.restored_bytes += s->bytes;
  link_.Queue(runtime_internal::HostLink::kIn, s->bytes, Clock());
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kRestored, .stream = stream});
  }
  return absl::OkStatus();
}

void Runtime::SettleCopies(Storage* s) {
  if (!s->copy_in_flight || s->state != TensorState::kOffloading) return;
  // A query that fails counts as "not yet": whoever needs the bytes waits on
  // the event instead (Restore, or a prefetch on the same copy stream).
  absl::StatusOr<bool> done = device_->QueryEvent(s->copy_event);
  if (done.ok() && *done) {
    s->copy_in_flight = false;
    events_.Give(s->copy_event);
    SetState(s, TensorState::kOnHost);
  }
}

void Runtime::HandBack(Storage* s, Stream to) {
  ++handbacks_;
  // A wait that cannot be enqueued is made good here (HandBack's callers
  // cannot fail): the host waits for that stream's work instead, the same
  // order at a higher price. If even that fails, the block is kept from the
  // allocator: a leak on a failing device rather than a block reused while
  // a stream still uses it.
  bool ordered = true;
  for (Stream used : s->used_streams) {
    absl::Status waited = events_.WaitOn(to, used);
    if (waited.ok()) continue;
    absl::Status synced = device_->SynchronizeStream(used);
    if (!synced.ok()) {
      REMAT_LOG(kError, "runtime: cannot order a block after its uses (%s; %s): keeping it",
                waited.ToString(), synced.ToString());
      ordered = false;
    }
  }
  if (ordered) {
    absl::Status freed = allocator_->FreeOnStream(s->device, to);
    if (!freed.ok()) REMAT_LOG(kError, "runtime: giving back a block: %s", freed.ToString());
  }
  LeaveDevice(s);
}

void Runtime::ReturnHostBuffer(void* host, Stream after) {
  // Called where nothing can fail with an error (collection, a given-up
  // offload). Without the event the pool records on `after`, nothing tells
  // when the copies touching the buffer end: it stays counted in use and is
  // never handed out again (a leak, never a race).
  if (absl::Status st = host_pool_.FreeAfter(host, after); !st.ok()) {
    REMAT_LOG(kError, "runtime: a host buffer stays out of the pool: %s", st.ToString());
  }
}

bool Runtime::KeepAddress(Storage* s) {
  if (!options_.keep_addresses) return false;
  // The pages go once the allocator next needs memory, after a device
  // synchronize: the copy out enqueued above finishes first.
  absl::StatusOr<std::size_t> gone = allocator_->Unback(s->device);
  if (!gone.ok() || *gone == 0) return false;
  ++handbacks_;
  ++stats_.kept_addresses;
  s->kept = s->device;
  s->kept_bytes = *gone;
  LeaveDevice(s);
  return true;
}

absl::StatusOr<void*> Runtime::BlockToRestore(Storage* s, Stream stream) {
  if (s->kept == nullptr) {
    absl::StatusOr<void*> ptr = AllocateDevice(s->bytes, stream, s->serial);
    if (ptr.ok() && options_.keep_addresses) ++stats_.moved_restores;
    return ptr;
  }
  REMAT_RETURN_IF_ERROR(MakeLiveRoom(s->bytes, stream));
  if (absl::Status st = allocator_->Reback(s->kept, stream); !st.ok()) {
    if (StepLimitReached()) return StepLimitError();
    return absl::Status(st.code(), absl::StrCat(DescribePressure(s->bytes, /*live=*/false), "; allocator: ",
                                                st.message()));
  }
  void* const ptr = s->kept;
  s->kept = nullptr;
  return ptr;
}

void Runtime::UndoRestoreBlock(Storage* s, void* ptr, bool kept, Stream stream) {
  if (!kept) {
    FreeBlockOnError(ptr, stream);
    return;
  }
  // Nothing was enqueued on the block that it must keep: give the pages up again.
  if (absl::StatusOr<std::size_t> gone = allocator_->Unback(ptr); !gone.ok()) {
    REMAT_LOG(kError, "runtime: a kept block stays backed after a failed restore: %s",
              gone.status().ToString());
  }
  s->kept = ptr;
}

void Runtime::FreeBlockOnError(void* ptr, Stream stream) {
  // The caller returns the error that brought it here; a block the
  // allocator will not take back either is logged (and stays allocated).
  if (absl::Status st = allocator_->FreeOnStream(ptr, stream); !st.ok()) {
    REMAT_LOG(kError, "runtime: giving back a block after an error: %s", st.ToString());
  }
}

bool Runtime::DropStorage(Storage* s, Stream to, bool pressure) {
  if (s->ahead != nullptr) ReleaseAheadCopy(s);
  HandBack(s, to);
  SetState(s, TensorState::kDropped);
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kDropped, .pressure = pressure});
  }
  return true;
}

bool Runtime::OffloadStorage(Storage* s, Stream to) {
  if (s->ahead != nullptr) return OffloadCopiedAhead(s, to);
  absl::StatusOr<void*> host = host_pool_.Allocate(s->bytes);
  if (!host.ok() && ahead_bytes_ > 0) {
    // Copies made ahead must not cost an offload pressure asks for: they go
    // (they can be made again), and the pool waits for them if it must.
    for (Storage* other : storages_.all()) {
      if (other->ahead != nullptr) ReleaseAheadCopy(other);
    }
    host = host_pool_.Allocate(s->bytes);
  }
  if (!host.ok()) return false;
  // On any failure the offload is given up (the pressure handler answers
  // with a bool): the caller drops the tensor instead or tries another.
  absl::StatusOr<Event> done = CopyOut(s, *host);
  if (!done.ok()) {
    REMAT_LOG(kWarning, "runtime: offload failed, trying another eviction: %s",
              done.status().ToString());
    return false;
  }
  // The block goes back on `to`, which waits for the copy out: stream-ordered,
  // the host never blocks.
  s->used_streams.assign({copy_stream_});
  if (!KeepAddress(s)) HandBack(s, to);
  FinishOffload(s, *host, *done, /*ahead=*/false);
  return true;
}

absl::StatusOr<Event> Runtime::CopyOut(Storage* s, void* host) {
  absl::Status st;
  for (Stream used : s->used_streams) {
    st = events_.WaitOn(copy_stream_, used);
    if (!st.ok()) break;
  }
  absl::StatusOr<Event> done = st.ok() ? events_.Take() : absl::StatusOr<Event>(st);
  if (st.ok()) st = done.status();
  if (st.ok()) {
    st = device_->CopyAsync(host, s->device, s->bytes, CopyKind::kDeviceToHost, copy_stream_);
  }
  if (st.ok()) st = device_->RecordEvent(*done, copy_stream_);
  if (!st.ok()) {
    if (done.ok()) events_.Give(*done);
    ReturnHostBuffer(host, copy_stream_);
    return st;
  }
  QueueCopyOut(s->bytes);
  return *done;
}

void Runtime::QueueCopyOut(std::size_t bytes) {
  link_.Queue(runtime_internal::HostLink::kOut, bytes, Clock());
}

void Runtime::FinishOffload(Storage* s, void* host, Event copy, bool ahead) {
  s->host = host;
  s->copy_event = copy;
  s->copy_in_flight = true;
  SetState(s, TensorState::kOffloading);
  stats_.offloaded_bytes += s->bytes;
  ++stats_.offloads;
  PlanPrefetch(s);
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kOffloaded,
             .stream = copy_stream_,
             .pressure = true,
             .ahead = ahead});
  }
}

bool Runtime::OffloadCopiedAhead(Storage* s, Stream to) {
  // The bytes are on the host (or on their way): no copy out now.
  void* const host = s->ahead;
  const Event copy = s->ahead_event;
  s->ahead = nullptr;
  ahead_bytes_ -= s->bytes;
  // A kept address gives its pages up only after a device synchronize
  // (KeepAddress), behind the copy and every use. Any other block goes back
  // on `to` behind that copy and the uses since; a wait that cannot be
  // enqueued orders `to` behind the whole copy stream instead.
  if (!KeepAddress(s)) {
    if (!device_->StreamWaitEvent(to, copy).ok() &&
        std::find(s->used_streams.begin(), s->used_streams.end(), copy_stream_) ==
            s->used_streams.end()) {
      s->used_streams.push_back(copy_stream_);
    }
    HandBack(s, to);
  }
  ++stats_.ahead_offloads;
  FinishOffload(s, host, copy, /*ahead=*/true);
  return true;
}

void Runtime::CopyAhead() {
  // Not while the link is still busy with the copies out queued before.
  if (link_.BacklogNs(runtime_internal::HostLink::kOut, Clock()) > 0) return;
  ++stats_.ahead_asks;
  const auto choose_start = std::chrono::steady_clock::now();
  GatherCandidates();
  policies::PressureContext ctx;
  FillContext(ctx, std::max<std::size_t>(last_pressure_bytes_, 1), kDefaultStream);
  MemoryMap map;
  if (policy_->needs().memory_map) {
    map = allocator_->GetMemoryMap();
    ctx.memory_map = &map;
  }
  // What the next pressure event would evict, if it came now: the first
  // tensor of it the policy would offload and that can be copied now.
  const policies::Plan plan = scratch_.empty() ? policies::Plan{} : policy_->Choose(ctx);
  stats_.ahead_choose_wall_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - choose_start)
                                     .count();
  for (const policies::PlanStep& step : plan) {
    if (step.id >= scratch_storages_.size() || step.action != policies::EvictAction::kOffload) {
      continue;
    }
    Storage* s = scratch_storages_[step.id];
    if (s->ahead == nullptr && WorthCopyingAhead(*s) && StartCopyAhead(s)) return;
  }
  ahead_declined_at_ = stats_.pressure_events;  // not again before the next pressure event
}

bool Runtime::WorthCopyingAhead(const Storage& s) const {
  if (!runtime_internal::CanCopyAhead(s)) return false;
  // Not what is never used again (a drop frees it for nothing), nor what is
  // used again before the next pressure event is likely to come: it would be
  // used, or freed, before anything evicts it.
  if (s.next_use_at < 0) return true;
  return s.next_use_at != kNeverUsedAgain && s.next_use_at >= AddTimes(Clock(), pressure_gap_ns_);
}

bool Runtime::StartCopyAhead(Storage* s) {
  // Room for this copy and another as large: a copy made ahead must not
  // leave the offloads pressure asks for without host memory.
  if (s->bytes > host_pool_.capacity() / 2 ||
      host_pool_.in_use_bytes() > host_pool_.capacity() - 2 * s->bytes) {
    return false;
  }
  absl::StatusOr<void*> host = host_pool_.Allocate(s->bytes);
  if (!host.ok()) return false;
  absl::StatusOr<Event> done = CopyOut(s, *host);
  if (!done.ok()) {
    REMAT_LOG(kWarning, "runtime: a copy ahead failed: %s", done.status().ToString());
    return false;
  }
  s->ahead = *host;
  s->ahead_event = *done;
  ahead_bytes_ += s->bytes;
  ++stats_.copies_ahead;
  stats_.copied_ahead_bytes += s->bytes;
  if (options_.observer != nullptr) {
    Tell(s, {.kind = TensorEvent::Kind::kCopiedAhead, .stream = copy_stream_});
  }
  return true;
}

void Runtime::ReleaseAheadCopy(Storage* s) {
  // Behind the copy, which may still be reading the block.
  ReturnHostBuffer(s->ahead, copy_stream_);
  events_.Give(s->ahead_event);
  s->ahead = nullptr;
  ahead_bytes_ -= s->bytes;
  ++stats_.ahead_copies_unused;
}

}  // namespace remat
