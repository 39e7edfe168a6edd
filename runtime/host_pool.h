// PinnedHostPool: a caching pool of page-locked host buffers for offloaded
// tensors. Pinned allocations are slow (cudaMallocHost maps and locks pages),
// so freed buffers are kept by size and reused. A buffer handed back while a
// copy may still read it is reused only once an event behind that copy has
// completed. A byte cap bounds what the pool holds; past it, cached buffers
// are released before an allocation fails.
//
// Buffers waiting on copies are kept per stream in the order they were handed
// back: a stream's work completes in order, so reclaiming stops at a stream's
// first copy still running, and an allocation queries one event per stream
// with copies running, not every buffer handed back since. Rather than pin
// a new buffer while more than kMaxWaiting wait on copies, the pool waits
// for the oldest: on a GPU long done (or the copies are that far behind),
// and on a simulated device, whose clock moves only when the host waits, the
// only way a program that never synchronizes it (remat.torch's bookkeeping
// runtime) gets buffers back.
#ifndef REMAT_RUNTIME_HOST_POOL_H_
#define REMAT_RUNTIME_HOST_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "device/device.h"

namespace remat {

class PinnedHostPool {
 public:
  // `device` must outlive the pool. `capacity` caps the bytes held (in use
  // and cached together).
  PinnedHostPool(Device* device, std::size_t capacity);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  // A buffer of at least `bytes` (rounded up to 512). ResourceExhausted when
  // the cap cannot hold it even after releasing the cache.
  absl::StatusOr<void*> Allocate(std::size_t bytes);
  // Returns a buffer; it is reused only after the work enqueued on `stream`
  // so far (a copy reading or writing it) has completed.
  absl::Status FreeAfter(void* ptr, Stream stream);

  std::size_t in_use_bytes() const { return in_use_bytes_; }
  std::size_t held_bytes() const { return held_bytes_; }
  std::size_t peak_in_use_bytes() const { return peak_in_use_bytes_; }
  std::size_t capacity() const { return capacity_; }
  // Buffers handed back whose copies may still run.
  std::size_t waiting() const { return waiting_; }

  static constexpr std::size_t kMaxWaiting = 256;

 private:
  struct Pending {
    void* ptr;
    std::size_t bytes;
    Event event;
    std::uint64_t order;  // handed back after every lower one
  };

  // The smallest cached buffer that fits `size` wasting at most half, or end.
  std::multimap<std::size_t, void*>::iterator CachedFit(std::size_t size);
  // Waits for the copy behind the buffer handed back longest ago and caches
  // it; false when none waits or the wait failed (logged).
  bool WaitForOldest();

  void ReclaimCompleted(bool wait);
  void ReleaseCache();
  void FreeHostOrLog(void* ptr);

  Device* const device_;
  const std::size_t capacity_;
  std::multimap<std::size_t, void*> cached_;                  // ready buffers by size
  absl::flat_hash_map<void*, std::size_t> sizes_;             // every buffer we hold
  // Freed, copy maybe in flight: per stream handle, oldest first.
  absl::flat_hash_map<std::uintptr_t, std::deque<Pending>> pending_;
  std::size_t waiting_ = 0;                                   // buffers in pending_
  std::uint64_t next_order_ = 0;
  std::vector<Event> spare_events_;
  std::size_t in_use_bytes_ = 0;
  std::size_t held_bytes_ = 0;
  std::size_t peak_in_use_bytes_ = 0;
};

}  // namespace remat

#endif  // REMAT_RUNTIME_HOST_POOL_H_
