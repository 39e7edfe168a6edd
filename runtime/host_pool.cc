#include "runtime/host_pool.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/units.h"

namespace remat {
namespace {

std::size_t RoundUp512(std::size_t n) { return (n + 511) / 512 * 512; }

}  // namespace

PinnedHostPool::PinnedHostPool(Device* device, std::size_t capacity)
    : device_(device), capacity_(capacity) {}

PinnedHostPool::~PinnedHostPool() {
  ReclaimCompleted(/*wait=*/true);
  // A destructor returns nothing: failures are logged.
  for (auto& [size, ptr] : cached_) FreeHostOrLog(ptr);
  for (Event e : spare_events_) {
    if (absl::Status s = device_->DestroyEvent(e); !s.ok()) {
      REMAT_LOG(kWarning, "pinned host pool: destroying an event: %s", s.ToString());
    }
  }
}

void PinnedHostPool::FreeHostOrLog(void* ptr) {
  // The buffer is not the pool's any more either way (no copy uses a cached
  // one): a failure is logged, and the driver keeps what it would not free.
  if (absl::Status s = device_->FreeHost(ptr); !s.ok()) {
    REMAT_LOG(kWarning, "pinned host pool: freeing a buffer: %s", s.ToString());
  }
}

absl::StatusOr<void*> PinnedHostPool::Allocate(std::size_t bytes) {
  const std::size_t size = RoundUp512(std::max<std::size_t>(bytes, 1));
  for (int attempt = 0; attempt < 2; ++attempt) {
    ReclaimCompleted(/*wait=*/attempt > 0);
    auto it = CachedFit(size);
    // Rather than pin another buffer while many wait on copies, the oldest
    // is waited for (on a GPU long done, or the copies are that far behind;
    // a simulated device's clock moves only so, when nothing synchronizes).
    while (it == cached_.end() && waiting_ > kMaxWaiting && WaitForOldest()) {
      it = CachedFit(size);
    }
    if (it != cached_.end()) {
      void* ptr = it->second;
      in_use_bytes_ += it->first;
      cached_.erase(it);
      peak_in_use_bytes_ = std::max(peak_in_use_bytes_, in_use_bytes_);
      return ptr;
    }
    if (held_bytes_ + size > capacity_) {
      ReleaseCache();
      if (held_bytes_ + size > capacity_) continue;
    }
    absl::StatusOr<void*> ptr = device_->AllocateHost(size);
    if (!ptr.ok()) return ptr.status();
    sizes_.emplace(*ptr, size);
    held_bytes_ += size;
    in_use_bytes_ += size;
    peak_in_use_bytes_ = std::max(peak_in_use_bytes_, in_use_bytes_);
    return *ptr;
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "pinned host pool exhausted: %s requested, %s in use of a %s cap", FormatBytes(size),
      FormatBytes(in_use_bytes_), FormatBytes(capacity_)));
}

std::multimap<std::size_t, void*>::iterator PinnedHostPool::CachedFit(std::size_t size) {
  // The smallest cached buffer that fits, if it wastes at most half.
  auto it = cached_.lower_bound(size);
  return it != cached_.end() && it->first <= 2 * size ? it : cached_.end();
}

bool PinnedHostPool::WaitForOldest() {
  auto oldest = pending_.end();
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (oldest == pending_.end() || it->second.front().order < oldest->second.front().order) {
      oldest = it;
    }
  }
  if (oldest == pending_.end()) return false;
  const Pending p = oldest->second.front();
  if (absl::Status s = device_->SynchronizeEvent(p.event); !s.ok()) {
    REMAT_LOG(kWarning, "pinned host pool: waiting for a copy: %s", s.ToString());
    return false;
  }
  cached_.emplace(p.bytes, p.ptr);
  spare_events_.push_back(p.event);
  oldest->second.pop_front();
  --waiting_;
  if (oldest->second.empty()) pending_.erase(oldest);
  return true;
}

absl::Status PinnedHostPool::FreeAfter(void* ptr, Stream stream) {
  auto it = sizes_.find(ptr);
  if (it == sizes_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PinnedHostPool::FreeAfter(%p): not a buffer of this pool", ptr));
  }
  Event event;
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else {
    absl::StatusOr<Event> created = device_->CreateEvent();
    if (!created.ok()) return created.status();
    event = *created;
  }
  if (absl::Status s = device_->RecordEvent(event, stream); !s.ok()) {
    spare_events_.push_back(event);
    return s;
  }
  in_use_bytes_ -= it->second;
  pending_[stream.handle].push_back(Pending{ptr, it->second, event, next_order_++});
  ++waiting_;
  return absl::OkStatus();
}

void PinnedHostPool::ReclaimCompleted(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    std::deque<Pending>& queue = it->second;
    while (!queue.empty()) {
      const Pending& p = queue.front();
      bool done;
      if (wait) {
        done = device_->SynchronizeEvent(p.event).ok();
      } else {
        absl::StatusOr<bool> q = device_->QueryEvent(p.event);
        done = q.ok() && *q;
      }
      if (!done) break;  // the stream's later copies end no sooner
      cached_.emplace(p.bytes, p.ptr);
      spare_events_.push_back(p.event);
      queue.pop_front();
      --waiting_;
    }
    // (absl's erase-while-iterating: `it` moves on first.)
    if (queue.empty()) {
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
}

void PinnedHostPool::ReleaseCache() {
  for (auto& [size, ptr] : cached_) {
    FreeHostOrLog(ptr);
    sizes_.erase(ptr);
    held_bytes_ -= size;
  }
  cached_.clear();
}

}  // namespace remat
