#include "allocator/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"

namespace remat {
namespace {

// The helpers of the alloc/free fast path are small and called once or twice
// each; inlined, a pair costs ~8% fewer instructions (callgrind).
#define REMAT_HOT_INLINE ABSL_ATTRIBUTE_ALWAYS_INLINE inline

std::size_t RoundUpTo(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Bytes of the whole pages (of `page` bytes) inside [addr, addr + size).
std::size_t WholePageBytes(std::uintptr_t addr, std::size_t size, std::size_t page) {
  const std::uintptr_t lo = RoundUpTo(addr, page);
  const std::uintptr_t hi = (addr + size) / page * page;
  return hi > lo ? hi - lo : 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Sizes

std::size_t CachingAllocator::RoundSize(std::size_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : RoundUpTo(bytes, kMinBlockSize);
}

std::size_t CachingAllocator::RoundRequest(std::size_t bytes) const {
  if (!round_divisions_ || bytes <= kMinBlockSize) return RoundSize(bytes);
  const std::size_t divisions =
      options_.roundup_divisions[static_cast<std::size_t>(std::bit_width(bytes) - 1)];
  if (divisions <= 1 || bytes <= kMinBlockSize * divisions || std::has_single_bit(bytes)) {
    return RoundSize(bytes);
  }
  // A power-of-two step of at least 512 B (bytes > 512 * divisions).
  return RoundUpTo(bytes, std::bit_floor(bytes) / divisions);
}

std::size_t CachingAllocator::SegmentSizeFor(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return RoundUpTo(rounded, kRoundLarge);
}

// ---------------------------------------------------------------------------
// Construction

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(
    Device* device, AllocatorOptions options) {
  if (device == nullptr) return absl::InvalidArgumentError("CachingAllocator needs a device");
  if (options.budget != 0 && options.budget < kSmallBuffer) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget %s is below the smallest segment (%s): nothing could ever be allocated",
        FormatBytes(options.budget), FormatBytes(kSmallBuffer)));
  }
  if (options.budget > device->Capacity()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget %s is larger than the device (%s: %s)", FormatBytes(options.budget),
        device->Describe(), FormatBytes(device->Capacity())));
  }
  if (options.max_split_size <= kSmallSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_split_size must be above %s (the small pool's largest request), not %s",
        FormatBytes(kSmallSize), FormatBytes(options.max_split_size)));
  }
  if (options.event_ring_capacity > kMaxEventRingCapacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "event_ring_capacity %d is above the limit of %d events", options.event_ring_capacity,
        kMaxEventRingCapacity));
  }
  if (options.max_pressure_rounds < 0) {
    return absl::InvalidArgumentError("max_pressure_rounds must be >= 0");
  }
  if (options.max_step_allocations == 0 || options.max_step_allocations > kMaxStepAllocations) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_step_allocations must be 1 to %d, not %d", kMaxStepAllocations,
        options.max_step_allocations));
  }
  for (std::uint8_t d : options.roundup_divisions) {
    if (d > 64 || (d > 1 && !std::has_single_bit(static_cast<unsigned>(d)))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "roundup_divisions must be 0, 1 or a power of two up to 64, not %d", d));
    }
  }
  if (!(options.garbage_collection_threshold >= 0 && options.garbage_collection_threshold < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "garbage_collection_threshold must be in [0, 1), not %g",
        options.garbage_collection_threshold));
  }
  if (options.expandable_segments) {
    const std::size_t page = device->PageSize();
    if (page == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expandable segments need virtual memory, which %s does not have", device->Describe()));
    }
    if (page > kSmallBuffer || kSmallBuffer % page != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "expandable segments need a page that divides %s; %s has %s pages",
          FormatBytes(kSmallBuffer), device->Describe(), FormatBytes(page)));
    }
  }
  return std::unique_ptr<CachingAllocator>(new CachingAllocator(device, options));
}

CachingAllocator::CachingAllocator(Device* device, AllocatorOptions options)
    : device_(device),
      device_capacity_(device->Capacity()),
      options_(options),
      mu_(options.thread_safe),
      page_size_(options.expandable_segments ? device->PageSize() : 0),
      round_divisions_(std::any_of(options.roundup_divisions.begin(),
                                   options.roundup_divisions.end(),
                                   [](std::uint8_t d) { return d > 1; })) {
  MutexLock lock(&mu_);
  budget_ = options.budget == 0 ? device->Capacity() : options.budget;
  max_split_size_ = options.max_split_size;
  large_.large = true;
  for (Pool* pool : {&small_, &large_, &transient_}) {
    pool->sentinel.partition = kSentinelPartition;
    pool->free.insert(&pool->sentinel);
  }
  // Allocated up front so that recording an event is a few stores.
  ring_.resize(options.event_ring_capacity);
}

CachingAllocator::~CachingAllocator() {
  MutexLock lock(&mu_);
  Settle();
  ProcessPendingFrees(/*wait=*/true);
  if (!live_.empty()) {
    REMAT_LOG(kWarning, "CachingAllocator destroyed with %d live allocations (%s); releasing anyway",
              live_.size(), FormatBytes(stats_.allocated_bytes.all().current));
  }
  for (auto& [stream, harvest] : harvest_) {
    if (harvest.in_flight) spare_events_.push_back(harvest.event);
  }
  for (auto& [addr, seg] : segments_) {
    if (seg->expandable) {
      DestroyExpandable(seg);
    } else {
      absl::Status s = device_->ReleaseSegment(reinterpret_cast<void*>(addr));
      if (!s.ok()) REMAT_LOG(kError, "releasing segment: %s", s.ToString());
    }
    delete seg;  // (its blocks belong to block_chunks_)
  }
  for (Event e : spare_events_) (void)device_->DestroyEvent(e);
}

REMAT_HOT_INLINE CachingAllocator::Block* CachingAllocator::NewBlock() {
  if (spare_blocks_.empty()) return NewBlockChunk();
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  b->addr = 0;
  b->size = b->requested = 0;
  b->segment = nullptr;
  b->pool = nullptr;
  b->prev = b->next = nullptr;
  b->stream = kDefaultStream;
  b->allocated = b->pending_free = b->shared = false;
  b->mapped = true;
  b->unbacked_lo = b->unbacked_hi = 0;
  b->unbacked_done = false;
  b->free_seq = 0;
  b->pending_events = 0;
  b->owner = 0;
  b->extra_streams.clear();
  return b;
}

REMAT_HOT_INLINE void CachingAllocator::DeleteBlock(Block* b) { spare_blocks_.push_back(b); }

// Blocks are made in chunks (doubling, up to 1024 at a time) and live as
// long as the allocator: one heap allocation per chunk, not per split.
CachingAllocator::Block* CachingAllocator::NewBlockChunk() {
  const std::size_t n = block_chunks_.empty()
                            ? 16
                            : std::min<std::size_t>(2 * block_chunk_size_, 1024);
  block_chunks_.push_back(std::make_unique<Block[]>(n));
  block_chunk_size_ = n;
  Block* chunk = block_chunks_.back().get();
  spare_blocks_.reserve(spare_blocks_.size() + n - 1);
  for (std::size_t i = n - 1; i > 0; --i) spare_blocks_.push_back(&chunk[i]);
  return &chunk[0];
}

// ---------------------------------------------------------------------------
// Allocation

absl::StatusOr<void*> CachingAllocator::Allocate(std::size_t bytes, Stream stream,
                                                 std::uint64_t owner) {
  if (bytes == 0) return nullptr;
  if (bytes > device_capacity_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot allocate %d bytes (%s): larger than the device (%s, %s)", bytes,
        FormatBytes(bytes), device_->Describe(), FormatBytes(device_capacity_)));
  }
  const std::size_t size = round_divisions_ ? RoundRequest(bytes) : RoundSize(bytes);
  MutexLock lock(&mu_);
  Pool& pool = PlacePoolFor(size);
  if (undone_ != nullptr) {
    // The last call freed the block the call before it allocated: the same
    // request on the same stream gets it back (see Redo).
    if (size == last_alloc_size_ && undone_->stream == stream && undone_->pool == &pool) {
      return reinterpret_cast<void*>(Redo(bytes, stream, owner)->addr);
    }
    Settle();
  }
  if (Block* b = FindFreeBlock(pool, size, stream)) {
    Block* taken = Commit(b, size, bytes, stream, owner);
    if (options_.fast_undo) {
      last_alloc_ = taken;
      last_alloc_size_ = size;
    }
    return reinterpret_cast<void*>(taken->addr);
  }
  last_alloc_ = nullptr;
  absl::StatusOr<Block*> slow = AllocateSlow(pool, size, bytes, stream);
  if (!slow.ok()) return slow.status();
  last_alloc_ = nullptr;  // (others may have called while the lock was released)
  return reinterpret_cast<void*>(Commit(*slow, size, bytes, stream, owner)->addr);
}

REMAT_HOT_INLINE bool CachingAllocator::Fits(const Block* b, std::size_t size) const {
  // Oversize blocks are kept for oversize requests, and an oversize request
  // does not take a block much larger than itself. An expandable segment's
  // free bytes are never stranded (their pages can move), so its blocks
  // split for anyone, as PyTorch's do.
  if (page_size_ != 0) return true;
  if (size < max_split_size_) return b->size < max_split_size_ ||
                                              max_split_size_ == SIZE_MAX;
  return b->size < size + kLargeBuffer;
}

REMAT_HOT_INLINE CachingAllocator::Block* CachingAllocator::FindFreeBlock(Pool& pool,
                                                                         std::size_t size,
                                                                         Stream stream) {
  // The stream's own free blocks (the sentinel sorts after them all, so the
  // search always lands on a block)...
  const std::uintptr_t own = stream.handle + 1;
  Block* best = *pool.free.lower_bound(FreeKey{own, size, 0});
  if (!(best->partition == own && Fits(best, size))) best = nullptr;
  // ...and blocks every stream may use; the better fit wins.
  if (pool.shared_count > 0) {
    Block* shared = *pool.free.lower_bound(FreeKey{0, size, 0});
    if (shared->shared && Fits(shared, size) &&
        (best == nullptr || shared->size < best->size ||
         (shared->size == best->size && shared->addr < best->addr))) {
      best = shared;
    }
  }
  return best;
}

REMAT_HOT_INLINE CachingAllocator::Block* CachingAllocator::Commit(Block* block, std::size_t size,
                                                                  std::size_t requested,
                                                                  Stream stream,
                                                                  std::uint64_t owner) {
  const std::size_t remaining = block->size - size;
  const bool fixed_large = block->segment->large && page_size_ == 0;
  const bool worth_keeping = fixed_large ? remaining > kSmallSize : remaining >= kMinBlockSize;
  last_alloc_split_ = worth_keeping && (page_size_ != 0 || block->size <= max_split_size_);
  if (last_alloc_split_) {
    // The free block stays in the set as the remainder (usually without
    // moving in it); the allocation gets a fresh Block in front of it.
    Block* taken = NewBlock();
    taken->addr = block->addr;
    taken->size = size;
    taken->segment = block->segment;
    taken->pool = block->pool;
    taken->prev = block->prev;
    taken->next = block;
    if (block->prev != nullptr) {
      block->prev->next = taken;
    } else {
      block->segment->first = taken;
    }
    block->prev = taken;
    RekeyFree(block, block->addr + size, remaining, block->stream, block->shared);
    block = taken;
  } else {
    EraseFree(block);
  }
  return HandOut(block, requested, stream, owner);
}

REMAT_HOT_INLINE CachingAllocator::Block* CachingAllocator::HandOut(Block* block,
                                                                   std::size_t requested,
                                                                   Stream stream,
                                                                   std::uint64_t owner) {
  const StatPool sp = StatPoolOf(PoolOf(block));
  block->allocated = true;
  block->shared = false;
  block->generation = ++allocations_made_;
  if (recording_step_) [[unlikely]]
    RecordStepAllocation(block);
  block->requested = requested;
  block->stream = stream;
  block->owner = owner;
  block->extra_streams.clear();
  live_.Insert(block->addr, block);

  stats_.allocation.Increase(sp, 1);
  stats_.allocated_bytes.Increase(sp, static_cast<std::int64_t>(block->size));
  stats_.requested_bytes.Increase(sp, static_cast<std::int64_t>(requested));
  if (pending_stats_.count.current[kAggregatePool] != 0) [[unlikely]] NotePendingPeak(sp);
  RecordTrace(TraceAction::kAlloc, block->addr, block->size, requested, stream);
  return block;
}

// The undo fast path. Allocate remembers the block it took from the free set
// directly (last_alloc_). When the very next call frees that block on its
// stream, and putting it back would only undo the allocation (it merges with
// the rest the allocation split off, or with nothing, and the merged block
// merges with nothing more), the free sets it aside instead (undone_). The
// next call then either asks for the same size on the same stream, and gets
// the block back with no search, no split and no merge (Redo), or puts it
// back first (Settle), as the free would have. Nothing can tell the two
// paths apart:
// * Redo returns what the full path would. The merged block has the key the
//   block the allocation took had (same size and address, now private to
//   the stream), every other free block is as it was then, and best fit
//   depends on keys alone, so the search would find the merged block again
//   and split it the same way.
// * Every other call, every observer (statistics, snapshots, memory maps,
//   error messages) and every return of the lock (after the pressure
//   handler, say) settles first, and so sees the full path's state.
// * Redo counts the statistics the merge and the split would have (the
//   split statistics' peaks pass through the merged block), and gives the
//   rest the merged block's free_seq.
// The allocator's differential test replays random calls with and without
// the fast path and compares every address, statistic and snapshot.

REMAT_HOT_INLINE bool CachingAllocator::UndoesCleanly(const Block* b) const {
  // A free neighbour usually merged with the block the allocation took, but
  // not always: a block shared after its neighbour was freed private stays
  // apart from it, and once taken whole and freed private, it would merge.
  if (CanMerge(b, b->prev)) return false;
  if (!last_alloc_split_) return !CanMerge(b, b->next);
  const Block* rest = b->next;  // what the allocation split off, still free
  return CanMerge(b, rest) && !rest->shared && rest->stream == b->stream &&
         !CanMerge(rest, rest->next);
}

REMAT_HOT_INLINE CachingAllocator::Block* CachingAllocator::Redo(std::size_t requested,
                                                                Stream stream,
                                                                std::uint64_t owner) {
  Block* b = std::exchange(undone_, nullptr);
  // The split statistics as the merge, then the split, would count them
  // (CountResize there and back); the other free-set counters end as they
  // were.
  const Segment* seg = b->segment;
  const StatPool sp = seg->large ? kLargePool : kSmallPool;
  const auto split_bytes = [seg](std::size_t size) -> std::int64_t {
    return size != seg->whole_size ? static_cast<std::int64_t>(size) : 0;
  };
  std::int64_t before = 0;  // the free block's split bytes after the allocation
  std::int64_t merged = split_bytes(b->size);  // and after the free (the merged block)
  if (last_alloc_split_) {
    Block* rest = b->next;
    before = split_bytes(rest->size);
    merged = split_bytes(rest->size + b->size);
    rest->free_seq = b->free_seq;  // the merged block's: the later of the two
  }
  if (merged > before) {
    stats_.inactive_split_bytes.Pass(sp, merged - before);
    if (before == 0) stats_.inactive_split.Pass(sp, 1);
  } else if (merged < before) {
    stats_.inactive_split_bytes.Dip(sp, before - merged);
    if (merged == 0) stats_.inactive_split.Dip(sp, 1);
  }
  last_alloc_ = b;
  ++redone_;
  return HandOut(b, requested, stream, owner);
}

void CachingAllocator::Settle() const {
  if (undone_ == nullptr) [[likely]] return;
  // Logically const: this completes a free exactly as it would have been
  // completed when it was made (the allocator is never created const).
  auto* self = const_cast<CachingAllocator*>(this);
  self->InsertCoalesced(std::exchange(self->undone_, nullptr));
}

void CachingAllocator::EndUndo() {
  Settle();
  last_alloc_ = nullptr;
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::AllocateSlow(Pool& pool,
                                                                        std::size_t size,
                                                                        std::size_t requested,
                                                                        Stream stream) {
  const std::size_t segment_size = SegmentSizeFor(size);
  for (int round = 0;; ++round) {
    // Blocks whose other-stream uses have completed, and blocks other streams freed.
    ProcessPendingFrees(/*wait=*/false);
    HarvestStreams(&stream, /*wait=*/false);
    if (Block* b = FindFreeBlock(pool, size, stream)) return b;
    if (options_.garbage_collection_threshold > 0 &&
        static_cast<double>(stats_.reserved_bytes.all().current) >
            options_.garbage_collection_threshold * static_cast<double>(budget_)) {
      // Give the cache back before growing past the threshold.
      ReleaseCachedSegments();
    }
    if (Block* b = GrowPool(pool, size, stream)) return b;
    if (Block* b = FindInOtherSmallPool(pool, size, stream)) return b;

    // Out of room. Wait for what is in flight, give whole free segments back,
    // and try again: the cache may hold the memory in the wrong shape.
    ++stats_.num_alloc_retries;
    // Everything becomes shared, so neighbours freed on different streams
    // coalesce and whole segments can be released.
    ProcessPendingFrees(/*wait=*/true);
    HarvestStreams(nullptr, /*wait=*/true);
    if (Block* b = FindFreeBlock(pool, size, stream)) return b;
    ReleaseCachedSegments();
    if (Block* b = GrowPool(pool, size, stream)) return b;
    if (Block* b = FindInOtherSmallPool(pool, size, stream)) return b;

    if (reserving_bytes_ > 0) {
      // Another thread is reserving a segment with the lock released
      // (release_lock_on_device_reserve): its bytes may be what does not
      // fit, and its segment may serve us. Let it finish, then look again.
      mu_.Unlock();
      std::this_thread::yield();
      mu_.Lock();
      EndUndo();
      continue;
    }
    // Ask the runtime to evict, and retry while it makes progress. A request
    // larger than the whole budget cannot be helped.
    std::shared_ptr<PressureHandler> handler = pressure_handler_;
    if (handler == nullptr || round >= options_.max_pressure_rounds ||
        std::min(segment_size, RoundUpTo(size, page_size_ != 0 ? page_size_ : kRoundLarge)) >
            budget_) {
      break;
    }
    PressureRequest request{size, stream, budget_,
                            static_cast<std::size_t>(stats_.reserved_bytes.all().current),
                            static_cast<std::size_t>(stats_.allocated_bytes.all().current)};
    ++stats_.num_pressure_calls;
    // Without the lock: the handler frees (and may allocate) through us.
    // Another thread may free memory meanwhile; that is progress too.
    const std::uint64_t epoch = free_epoch_;
    mu_.Unlock();
    const bool progress = (*handler)(request);
    mu_.Lock();
    EndUndo();
    if (!progress && free_epoch_ == epoch) break;
  }
  ++stats_.num_ooms;
  RecordTrace(TraceAction::kOom, 0, size, requested, stream);
  return absl::ResourceExhaustedError(OomMessage(requested, size, stream));
}

CachingAllocator::Block* CachingAllocator::ReserveSegment(Pool& pool, std::size_t size,
                                                          Stream stream) {
  const std::size_t reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  std::size_t segment_size = SegmentSizeFor(size);
  // An oversize segment would be unsplittable and wasted on a small request.
  if (pool.large && size < max_split_size_ && segment_size > max_split_size_) {
    segment_size = RoundUpTo(size, kRoundLarge);
  }
  // Within a tight budget, a large request shrinks its segment to what it needs.
  const std::size_t committed = reserved + reserving_bytes_;
  if (pool.large && committed + segment_size > budget_) segment_size = RoundUpTo(size, kRoundLarge);
  if (committed + segment_size > budget_) return nullptr;
  auto reserve = [&](std::size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!options_.release_lock_on_device_reserve) return device_->ReserveSegment(bytes);
    // Others use the cache meanwhile; the bytes count against the budget.
    reserving_bytes_ += bytes;
    mu_.Unlock();
    absl::StatusOr<void*> got = device_->ReserveSegment(bytes);
    mu_.Lock();
    EndUndo();
    reserving_bytes_ -= bytes;
    ++free_epoch_;  // waiters look again
    return got;
  };
  absl::StatusOr<void*> ptr = reserve(segment_size);
  if (!ptr.ok()) {
    if (pool.large && segment_size > RoundUpTo(size, kRoundLarge)) {
      segment_size = RoundUpTo(size, kRoundLarge);
      ptr = reserve(segment_size);
    }
    if (!ptr.ok()) return nullptr;
  }
  auto* seg = new Segment;
  seg->addr = reinterpret_cast<std::uintptr_t>(*ptr);
  seg->size = segment_size;
  seg->whole_size = segment_size;
  seg->large = pool.large;
  seg->pool = &pool;
  seg->stream = stream;
  Block* b = NewBlock();
  b->addr = seg->addr;
  b->size = segment_size;
  b->segment = seg;
  b->pool = &pool;
  b->stream = stream;
  b->free_seq = next_free_seq_++;
  seg->first = b;
  segments_.emplace(seg->addr, seg);

  const StatPool sp = StatPoolOf(pool);
  stats_.segment.Increase(sp, 1);
  stats_.reserved_bytes.Increase(sp, static_cast<std::int64_t>(segment_size));
  ++stats_.num_device_alloc;
  RecordTrace(TraceAction::kSegmentAlloc, seg->addr, segment_size, segment_size, stream);
  InsertFree(b);
  return b;
}

// ---------------------------------------------------------------------------
// Steps: placement learned from the step before (BeginStep, EndStep)

void CachingAllocator::BeginStep() {
  MutexLock lock(&mu_);
  if (page_size_ < kSmallSize || placement_ == Placement::kRefused) return;
  StartStep();
}

void CachingAllocator::StartStep() {
  recording_step_ = true;
  step_too_long_ = false;
  step_allocations_.clear();
  step_first_generation_ = allocations_made_ + 1;
  step_clock_ = 0;
  step_peak_bytes_ = 0;
  step_peak_at_ = 0;
  step_reserved_peak_ = 0;
  step_ooms_at_start_ = stats_.num_ooms;
}

void CachingAllocator::EndStep() {
  MutexLock lock(&mu_);
  if (page_size_ < kSmallSize) return;
  if (step_too_long_) {
    // Such steps cost the books a step of their size each: none from here.
    placement_ = Placement::kRefused;
    learned_ = {};
  } else if (recording_step_ && !step_allocations_.empty() &&
             stats_.num_ooms == step_ooms_at_start_) {
    JudgeStep();
  }
  EndUndo();
  step_allocations_.clear();
  recording_step_ = false;
  if (placement_ != Placement::kRefused) StartStep();
}

void CachingAllocator::JudgeStep() {
  // What the step says of the next: apart, what it made after its peak or
  // freed at or before it.
  std::vector<Learned> next(step_allocations_.size());
  bool any_apart = false;
  for (std::size_t i = 0; i < step_allocations_.size(); ++i) {
    const StepAllocation& a = step_allocations_[i];
    next[i] = {a.size, a.made > step_peak_at_ || a.freed <= step_peak_at_};
    any_apart = any_apart || next[i].apart();
  }
  switch (placement_) {
    case Placement::kPlain:
      if (!any_apart) return;  // nothing to place apart: the next step is plain too
      plain_step_reserved_ = step_reserved_peak_;
      learned_ = std::move(next);
      placement_ = Placement::kTrying;
      return;
    case Placement::kTrying:
    case Placement::kKept: {
      const bool same =
          next.size() == learned_.size() &&
          std::equal(next.begin(), next.end(), learned_.begin(),
                     [](const Learned& a, const Learned& b) { return a.size == b.size; });
      if (!same) {
        // Another sequence than the one placed by: the trial starts over,
        // from a plain step.
        placement_ = Placement::kPlain;
        learned_.clear();
        return;
      }
      if (step_reserved_peak_ < plain_step_reserved_ && any_apart) {
        placement_ = Placement::kKept;
        learned_ = std::move(next);
      } else {
        placement_ = Placement::kRefused;
        learned_ = {};
      }
      return;
    }
    case Placement::kRefused:
      return;
  }
}

CachingAllocator::Block* CachingAllocator::FindInOtherSmallPool(const Pool& pool, std::size_t size,
                                                                Stream stream) {
  if (&pool == &small_)
    return transient_.free.size() > 1 ? FindFreeBlock(transient_, size, stream) : nullptr;
  if (&pool == &transient_) return FindFreeBlock(small_, size, stream);
  return nullptr;
}

void CachingAllocator::RecordStepAllocation(const Block* block) {
  if (step_allocations_.size() >= options_.max_step_allocations) {
    step_too_long_ = true;
    recording_step_ = false;
    step_allocations_ = {};  // (its memory too)
    return;
  }
  step_allocations_.push_back({block->size, ++step_clock_});
  // (HandOut counts the block's bytes after this.)
  const std::int64_t allocated =
      stats_.allocated_bytes.all().current + static_cast<std::int64_t>(block->size);
  if (allocated > step_peak_bytes_) {
    step_peak_bytes_ = allocated;
    step_peak_at_ = step_clock_;
  }
  // The pages that hold blocks: reserved bytes less the free whole pages
  // cached (which the next growth past the high-water mark gives back
  // first), so that pages a step before left cached do not count. (They
  // grow only to serve an allocation, this one included.)
  step_reserved_peak_ =
      std::max(step_reserved_peak_,
               static_cast<std::size_t>(stats_.reserved_bytes.all().current) - free_page_bytes_);
}

std::size_t CachingAllocator::learned_allocations() const {
  MutexLock lock(&mu_);
  return learned_.size();
}

std::size_t CachingAllocator::learned_transient() const {
  MutexLock lock(&mu_);
  return static_cast<std::size_t>(std::count_if(learned_.begin(), learned_.end(),
                                                [](const Learned& l) { return l.apart(); }));
}

// ---------------------------------------------------------------------------
// Expandable segments

std::pair<CachingAllocator::Block*, std::size_t> CachingAllocator::FindExpansion(Pool& pool,
                                                                                 std::size_t size,
                                                                                 Stream stream) {
  Block* best = nullptr;
  std::size_t best_pages = 0;
  auto usable = [stream](const Block* c) {
    return c != nullptr && !c->allocated && !c->pending_free && c->mapped &&
           (c->shared || c->stream == stream);
  };
  for (Block* u : pool.unmapped) {
    if (u->segment->stream != stream) continue;
    // Free mapped bytes right before it that the stream may use: the new
    // pages extend them. When those and the whole hole are not enough, the
    // free bytes right after it may close the gap (the hole is then mapped
    // whole): partial pages left around a hole are used, not stranded.
    const std::size_t before = usable(u->prev) ? u->prev->size : 0;
    const std::size_t after = usable(u->next) ? u->next->size : 0;
    if (before >= size || before + u->size + after < size) continue;
    const std::size_t pages = before + u->size >= size
                                  ? (size - before + page_size_ - 1) / page_size_
                                  : u->size / page_size_;
    if (best == nullptr || pages < best_pages) {
      best = u;
      best_pages = pages;
    }
  }
  return {best, best_pages};
}

CachingAllocator::Segment* CachingAllocator::NewExpandableSegment(Pool& pool, std::size_t size,
                                                                  Stream stream) {
  // Twice the budget of address space (up to the device's size), so that
  // where blocks lie seldom limits what the budget allows (a stream opens
  // another range when it does), halved while the device has no range that
  // large.
  const std::size_t least = RoundUpTo(size, page_size_);
  std::size_t room = budget_ > device_capacity_ / 2 ? device_capacity_ : 2 * budget_;
  // Small blocks seldom fill much of a device: a quarter of it leaves address
  // space for many streams' ranges (more open when one fills).
  if (!pool.large) room = std::min(room, std::max(device_capacity_ / 4, kSmallBuffer));
  std::size_t bytes = RoundUpTo(std::max(room, size), page_size_);
  absl::StatusOr<void*> ptr = device_->ReserveAddressRange(bytes);
  while (!ptr.ok() && bytes > least) {
    bytes = std::max(least, RoundUpTo(bytes / 2, page_size_));
    ptr = device_->ReserveAddressRange(bytes);
  }
  if (!ptr.ok()) return nullptr;
  auto* seg = new Segment;
  seg->addr = reinterpret_cast<std::uintptr_t>(*ptr);
  seg->size = bytes;
  seg->whole_size = std::numeric_limits<std::size_t>::max();
  seg->large = pool.large;
  seg->pool = &pool;
  seg->expandable = true;
  // Only where a page holds the largest small request (every device so far:
  // 2 MiB); on smaller pages small blocks must span pages.
  seg->page_bounded = !pool.large && page_size_ >= kSmallSize;
  seg->stream = stream;
  seg->pages.assign(bytes / page_size_, PhysicalChunk{});
  Block* u = NewBlock();
  u->addr = seg->addr;
  u->size = bytes;
  u->segment = seg;
  u->pool = &pool;
  u->stream = stream;
  u->mapped = false;
  seg->first = u;
  segments_.emplace(seg->addr, seg);
  pool.unmapped.insert(u);
  stats_.segment.Increase(StatPoolOf(pool), 1);
  return seg;
}

CachingAllocator::Block* CachingAllocator::Expand(Pool& pool, std::size_t size, Stream stream) {
  Block* u = nullptr;
  std::size_t pages = 0;
  // Where to map, in a new range when no range of the stream has the room.
  auto place = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::tie(u, pages) = FindExpansion(pool, size, stream);
    if (u == nullptr && NewExpandableSegment(pool, size, stream) != nullptr) {
      std::tie(u, pages) = FindExpansion(pool, size, stream);
    }
    return u != nullptr;
  };
  if (!place()) return nullptr;
  auto reserved = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  };
  // Past the high-water mark only once the free pages already held are
  // unmapped: the peak then counts the pages of live blocks, not holes.
  if (reserved() + pages * page_size_ > reserved_high_water_ &&
      (free_page_bytes_ > 0 || !unbacking_.empty())) {
    ProcessPendingFrees(/*wait=*/true);
    HarvestStreams(nullptr, /*wait=*/true);
    UnmapFreePages();
    if (Block* b = FindFreeBlock(pool, size, stream)) return b;  // the harvest may have made room
    if (!place()) return nullptr;
  }
  if (reserved() + pages * page_size_ > budget_) return nullptr;
  if (!MapPages(u, pages, stream)) return nullptr;
  reserved_high_water_ = std::max(reserved_high_water_, reserved());
  return FindFreeBlock(pool, size, stream);
}

bool CachingAllocator::MapPages(Block* u, std::size_t pages, Stream stream) {
  Segment* seg = u->segment;
  const std::size_t bytes = pages * page_size_;
  if (!MapRange(seg, u->addr, u->addr + bytes)) return false;
  Pool& pool = PoolOf(u);
  pool.unmapped.erase(u);
  if (bytes < u->size) {
    Block* rest = NewBlock();
    rest->addr = u->addr + bytes;
    rest->size = u->size - bytes;
    rest->segment = seg;
    rest->pool = u->pool;
    rest->stream = seg->stream;
    rest->mapped = false;
    rest->prev = u;
    rest->next = u->next;
    if (u->next != nullptr) u->next->prev = rest;
    u->next = rest;
    pool.unmapped.insert(rest);
  }
  // Fresh pages no work has touched; private to the stream, so that they
  // merge with the stream's free bytes before them.
  u->size = bytes;
  u->mapped = true;
  u->stream = stream;
  u->shared = false;
  u->free_seq = next_free_seq_++;
  ++free_epoch_;
  InsertCoalesced(u);
  return true;
}

bool CachingAllocator::MapRange(Segment* seg, std::uintptr_t lo, std::uintptr_t hi) {
  const std::size_t first = (lo - seg->addr) / page_size_;
  const std::size_t pages = (hi - lo) / page_size_;
  std::vector<PhysicalChunk> made;
  made.reserve(pages);
  bool ok = true;
  for (std::size_t i = 0; i < pages && ok; ++i) {
    absl::StatusOr<PhysicalChunk> chunk = device_->CreateChunk(page_size_);
    if (!chunk.ok()) {
      ok = false;
    } else if (!device_->Map(reinterpret_cast<void*>(lo + i * page_size_), *chunk).ok()) {
      (void)device_->ReleaseChunk(*chunk);
      ok = false;
    } else {
      made.push_back(*chunk);
    }
  }
  if (ok) ok = device_->SetAccess(reinterpret_cast<void*>(lo), hi - lo).ok();
  if (!ok) {
    for (std::size_t i = 0; i < made.size(); ++i) {
      (void)device_->Unmap(reinterpret_cast<void*>(lo + i * page_size_), page_size_);
      (void)device_->ReleaseChunk(made[i]);
    }
    return false;
  }
  for (std::size_t i = 0; i < pages; ++i) seg->pages[first + i] = made[i];
  stats_.reserved_bytes.Increase(seg->large ? kLargePool : kSmallPool,
                                 static_cast<std::int64_t>(hi - lo));
  ++stats_.num_device_alloc;
  RecordTrace(TraceAction::kSegmentMap, lo, hi - lo, hi - lo, seg->stream);
  return true;
}

std::size_t CachingAllocator::UnmapPages(Segment* seg, std::uintptr_t lo, std::uintptr_t hi) {
  std::uintptr_t at = lo;
  while (at < hi) {
    const std::size_t index = (at - seg->addr) / page_size_;
    if (!device_->Unmap(reinterpret_cast<void*>(at), page_size_).ok()) break;
    (void)device_->ReleaseChunk(seg->pages[index]);
    seg->pages[index] = PhysicalChunk{};
    at += page_size_;
  }
  if (at == lo) return 0;
  stats_.reserved_bytes.Decrease(seg->large ? kLargePool : kSmallPool,
                                 static_cast<std::int64_t>(at - lo));
  ++stats_.num_device_free;
  RecordTrace(TraceAction::kSegmentUnmap, lo, at - lo, at - lo, seg->stream);
  return at - lo;
}

absl::StatusOr<std::size_t> CachingAllocator::Unback(void* ptr) {
  MutexLock lock(&mu_);
  EndUndo();
  Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "Unback"));
  if (!b->segment->expandable) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Unback(%p): the block is not in an expandable segment (expandable_segments:True)", ptr));
  }
  if (b->unbacked_hi != 0) {
    return absl::FailedPreconditionError(absl::StrFormat("Unback(%p): unbacked already", ptr));
  }
  const std::uintptr_t lo = RoundUpTo(b->addr, page_size_);
  const std::uintptr_t hi = (b->addr + b->size) / page_size_ * page_size_;
  if (hi <= lo) return 0;
  b->unbacked_lo = lo;
  b->unbacked_hi = hi;
  b->unbacked_done = false;
  unbacking_.push_back(b);
  ++free_epoch_;
  return hi - lo;
}

void CachingAllocator::ForgetUnbacking(Block* block) {
  auto it = std::find(unbacking_.begin(), unbacking_.end(), block);
  if (it != unbacking_.end()) {
    *it = unbacking_.back();
    unbacking_.pop_back();
  }
  block->unbacked_lo = block->unbacked_hi = 0;
  block->unbacked_done = false;
}

absl::Status CachingAllocator::Reback(void* ptr, Stream stream) {
  MutexLock lock(&mu_);
  EndUndo();
  Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "Reback"));
  if (b->unbacked_hi == 0) {
    return absl::FailedPreconditionError(absl::StrFormat("Reback(%p): the block is not unbacked", ptr));
  }
  if (!b->unbacked_done) {  // its pages never went
    ForgetUnbacking(b);
    return absl::OkStatus();
  }
  const std::size_t bytes = b->unbacked_hi - b->unbacked_lo;
  const std::uint64_t generation = b->generation;
  for (int round = 0;; ++round) {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
    if (reserved + bytes <= budget_) {
      if (!MapRange(b->segment, b->unbacked_lo, b->unbacked_hi)) {
        return absl::ResourceExhaustedError(
            absl::StrFormat("Reback(%p): the device has no memory for %s", ptr, FormatBytes(bytes)));
      }
      reserved_high_water_ = std::max(
          reserved_high_water_, static_cast<std::size_t>(stats_.reserved_bytes.all().current));
      b->unbacked_lo = b->unbacked_hi = 0;
      b->unbacked_done = false;
      return absl::OkStatus();
    }
    ProcessPendingFrees(/*wait=*/true);
    HarvestStreams(nullptr, /*wait=*/true);
    if (ReleaseCachedSegments() > 0) continue;
    std::shared_ptr<PressureHandler> handler = pressure_handler_;
    if (handler == nullptr || round >= options_.max_pressure_rounds || bytes > budget_) break;
    PressureRequest request{bytes, stream, budget_, reserved,
                            static_cast<std::size_t>(stats_.allocated_bytes.all().current),
                            /*contiguous=*/false};
    ++stats_.num_pressure_calls;
    const std::uint64_t epoch = free_epoch_;
    mu_.Unlock();
    const bool progress = (*handler)(request);
    mu_.Lock();
    EndUndo();
    // Others ran meanwhile: the block may have been freed (and its Block
    // reused), or backed again by another caller.
    if (live_.Find(reinterpret_cast<std::uintptr_t>(ptr)) != b || b->generation != generation) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Reback(%p): the block was freed while room was being made", ptr));
    }
    if (b->unbacked_hi == 0) return absl::OkStatus();  // backed again meanwhile
    if (!b->unbacked_done) {
      ForgetUnbacking(b);
      return absl::OkStatus();
    }
    if (!progress && free_epoch_ == epoch) break;
  }
  ++stats_.num_ooms;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "Reback(%p): cannot map %s within the budget %s (reserved %s)", ptr, FormatBytes(bytes),
      FormatBytes(budget_), FormatBytes(static_cast<std::size_t>(stats_.reserved_bytes.all().current))));
}

std::pair<CachingAllocator::Block*, CachingAllocator::Block*> CachingAllocator::CarveUnmapped(
    Block* b, std::uintptr_t lo, std::uintptr_t hi) {
  Segment* seg = b->segment;
  const std::uintptr_t end = b->addr + b->size;
  auto piece = [&](std::uintptr_t addr, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Block* p = NewBlock();
    p->addr = addr;
    p->size = size;
    p->segment = seg;
    p->pool = b->pool;
    p->stream = b->stream;
    p->shared = b->shared;
    p->free_seq = b->free_seq;
    return p;
  };
  Block* head = nullptr;
  Block* tail = nullptr;
  if (lo > b->addr) {
    head = piece(b->addr, lo - b->addr);
    head->prev = b->prev;
    head->next = b;
    if (b->prev != nullptr) {
      b->prev->next = head;
    } else {
      seg->first = head;
    }
    b->prev = head;
  }
  if (end > hi) {
    tail = piece(hi, end - hi);
    tail->prev = b;
    tail->next = b->next;
    if (b->next != nullptr) b->next->prev = tail;
    b->next = tail;
  }
  b->addr = lo;
  b->size = hi - lo;
  b->mapped = false;
  b->shared = false;
  b->stream = seg->stream;
  InsertUnmapped(b);
  return {head, tail};
}

void CachingAllocator::ReturnUnbacked(Block* block) {
  const std::uintptr_t lo = block->unbacked_lo;
  const std::uintptr_t hi = block->unbacked_hi;
  block->unbacked_lo = block->unbacked_hi = 0;
  block->unbacked_done = false;
  auto [head, tail] = CarveUnmapped(block, lo, hi);
  if (head != nullptr) InsertCoalesced(head);
  if (tail != nullptr) InsertCoalesced(tail);
}

std::size_t CachingAllocator::UnmapFreePages() {
  if (free_page_bytes_ == 0 && unbacking_.empty()) return 0;
  // Work queued on a stream may still use a block freed (or unbacked) on it.
  if (!device_->Synchronize().ok()) return 0;
  std::size_t released = 0;
  std::vector<Block*> retry;
  for (Block* b : unbacking_) {
    const std::size_t gone = UnmapPages(b->segment, b->unbacked_lo, b->unbacked_hi);
    if (gone == b->unbacked_hi - b->unbacked_lo) {
      b->unbacked_done = true;
      released += gone;
      continue;
    }
    // The device refused part of it: map back what went, and try the whole
    // range again next time (Reback meanwhile finds its pages still there).
    if (gone > 0 && !MapRange(b->segment, b->unbacked_lo, b->unbacked_lo + gone)) {
      REMAT_LOG(kError, "an unbacked block lost pages it cannot map again");
    }
    retry.push_back(b);
  }
  unbacking_ = std::move(retry);
  if (released > 0) ++free_epoch_;
  std::vector<Block*> blocks;
  for (Pool* pool : {&small_, &large_, &transient_}) {
    for (Block* b : pool->free) {
      if (b != &pool->sentinel && b->segment->expandable &&
          WholePageBytes(b->addr, b->size, page_size_) > 0) {
        blocks.push_back(b);
      }
    }
  }
  for (Block* b : blocks) {
    Segment* seg = b->segment;
    const std::uintptr_t lo = RoundUpTo(b->addr, page_size_);
    const std::uintptr_t end = b->addr + b->size;
    const std::uintptr_t hi = lo + UnmapPages(seg, lo, end / page_size_ * page_size_);
    if (hi == lo) continue;
    EraseFree(b);
    // The mapped head and tail stay free blocks; the pages between go.
    auto [head, tail] = CarveUnmapped(b, lo, hi);
    if (head != nullptr) InsertFree(head);
    if (tail != nullptr) InsertFree(tail);
    released += hi - lo;
  }
  return released;
}

void CachingAllocator::InsertUnmapped(Block* b) {
  Pool& pool = PoolOf(b);
  if (b->prev != nullptr && !b->prev->mapped) {
    Block* p = b->prev;  // already in the set, at the same address
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    DeleteBlock(b);
    b = p;
  } else {
    pool.unmapped.insert(b);
  }
  if (b->next != nullptr && !b->next->mapped) {
    Block* n = b->next;
    pool.unmapped.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    DeleteBlock(n);
  }
}

void CachingAllocator::DestroyExpandable(Segment* seg) {
  for (std::size_t i = 0; i < seg->pages.size(); ++i) {
    if (seg->pages[i].handle == 0) continue;
    void* at = reinterpret_cast<void*>(seg->addr + i * page_size_);
    absl::Status s = device_->Unmap(at, page_size_);
    if (s.ok()) s = device_->ReleaseChunk(seg->pages[i]);
    if (!s.ok()) REMAT_LOG(kError, "unmapping an expandable segment's page: %s", s.ToString());
  }
  absl::Status s = device_->ReleaseAddressRange(reinterpret_cast<void*>(seg->addr));
  if (!s.ok()) REMAT_LOG(kError, "releasing an expandable segment's range: %s", s.ToString());
}

// ---------------------------------------------------------------------------
// Free

absl::Status CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  MutexLock lock(&mu_);
  return FreeLocked(ptr, nullptr);
}

absl::Status CachingAllocator::FreeOnStream(void* ptr, Stream stream) {
  if (ptr == nullptr) return absl::OkStatus();
  MutexLock lock(&mu_);
  return FreeLocked(ptr, &stream);
}

// Records an event on each stream other than `stream` that used the block
// (RecordStream), into `out`; on failure puts the events it took back among
// the spares and returns the error, having changed nothing.
absl::Status CachingAllocator::RecordUses(Block* block, const Stream* stream,
                                          std::vector<Event>* out) {
  std::vector<Event>& events = *out;
  for (Stream other : block->extra_streams) {
    if (stream != nullptr && other == *stream) continue;
    absl::StatusOr<Event> event = TakeEvent();
    if (!event.ok()) {
      for (Event e : events) spare_events_.push_back(e);
      return event.status();
    }
    if (!device_->RecordEvent(*event, other).ok()) {
      // The stream is gone (destroyed by its owner): wait for the whole
      // device instead of leaking the block.
      spare_events_.push_back(*event);
      if (absl::Status synced = device_->Synchronize(); !synced.ok()) {
        for (Event e : events) spare_events_.push_back(e);
        return synced;
      }
      continue;
    }
    events.push_back(*event);
  }
  return absl::OkStatus();
}

REMAT_HOT_INLINE absl::Status CachingAllocator::FreeLocked(void* ptr, const Stream* stream) {
  Settle();
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t at = live_.Locate(addr);
  if (at == AddressMap<Block>::kNotFound) {
    return absl::InvalidArgumentError(DescribeBadPointer(ptr, "Free"));
  }
  Block* block = live_.Value(at);
  // Whether this free may undo the last call's allocation (see Redo).
  const bool undoes = block == last_alloc_ && (stream == nullptr || *stream == block->stream) &&
                      block->unbacked_hi == 0;
  last_alloc_ = nullptr;
  std::vector<Event> events;
  // Events first: if one cannot be recorded, nothing has changed.
  if (!block->extra_streams.empty()) [[unlikely]] {
    if (absl::Status s = RecordUses(block, stream, &events); !s.ok()) return s;
  }
  live_.EraseAt(at);  // (RecordUses leaves the map alone)
  const StatPool sp = StatPoolOf(PoolOf(block));
  stats_.allocation.Decrease(sp, 1);
  stats_.allocated_bytes.Decrease(sp, static_cast<std::int64_t>(block->size));
  stats_.requested_bytes.Decrease(sp, static_cast<std::int64_t>(block->requested));
  RecordTrace(TraceAction::kFreeRequested, block->addr, block->size, block->requested,
              block->stream);
  block->allocated = false;
  if (recording_step_ && block->generation >= step_first_generation_) [[unlikely]] {
    const std::uint64_t i = block->generation - step_first_generation_;
    if (i < step_allocations_.size()) step_allocations_[i].freed = ++step_clock_;
  }
  if (stream != nullptr) block->stream = *stream;
  if (events.empty()) {
    if (undoes) {
      ResetFreed(block, block->stream);
      if (UndoesCleanly(block)) {
        undone_ = block;
      } else {
        InsertCoalesced(block);
      }
      return absl::OkStatus();
    }
    ReturnBlock(block, block->stream);
  } else {
    block->pending_free = true;
    CountPending(sp, +1, static_cast<std::int64_t>(block->size));
    block->pending_events = static_cast<int>(events.size());
    pending_frees_.push_back(PendingFree{block, std::move(events)});
  }
  return absl::OkStatus();
}

REMAT_HOT_INLINE void CachingAllocator::ReturnBlock(Block* block, Stream stream) {
  ResetFreed(block, stream);
  if (block->unbacked_hi != 0) [[unlikely]] {
    if (block->unbacked_done) {
      ReturnUnbacked(block);
      return;
    }
    ForgetUnbacking(block);  // its pages are still mapped: an ordinary free
  }
  InsertCoalesced(block);
}

REMAT_HOT_INLINE void CachingAllocator::ResetFreed(Block* block, Stream stream) {
  if (block->pending_free) [[unlikely]] {
    CountPending(StatPoolOf(PoolOf(block)), -1, static_cast<std::int64_t>(block->size));
  }
  RecordTrace(TraceAction::kFreeCompleted, block->addr, block->size, block->requested, stream);
  block->pending_free = false;
  block->pending_events = 0;
  block->requested = 0;
  block->owner = 0;
  block->extra_streams.clear();
  block->stream = stream;
  block->shared = false;
  block->free_seq = next_free_seq_++;
  ++free_epoch_;
}

REMAT_HOT_INLINE bool CachingAllocator::CanMerge(const Block* a, const Block* b) const {
  // `b` is a free neighbour of the inactive block `a`. A shared neighbour may
  // join a private block (the stream owning it may use shared memory); two
  // private blocks merge only on the same stream.
  if (b == nullptr || b->allocated || b->pending_free || !b->mapped) return false;
  // Small blocks never straddle a page of an expandable segment. Coalesced
  // across pages, best fit would carve each new small block from whichever
  // free run fits tightest, wherever its pages lie, and spread a few live
  // blocks over many pages that then cannot be unmapped; bounded by pages, a
  // request prefers a partly used page to an empty one, as with fixed
  // 2 MiB segments, and empty pages go back whole.
  if (a->segment->page_bounded && std::max(a->addr, b->addr) % page_size_ == 0) return false;
  if (a->shared) return b->shared;
  return b->shared || b->stream == a->stream;
}

REMAT_HOT_INLINE void CachingAllocator::InsertCoalesced(Block* x) {
  for (;;) {
    Block* p = CanMerge(x, x->prev) ? x->prev : nullptr;
    Block* n = CanMerge(x, x->next) ? x->next : nullptr;
    if (p == nullptr && n == nullptr) {
      InsertFree(x);
      return;
    }
    // A neighbour already in the set absorbs x (and the other neighbour), so
    // the merge is usually a key change in place rather than a removal and an
    // insertion. The merged block is shared only if x is (CanMerge lets a
    // shared neighbour join a private block, never the reverse).
    Block* keeper = p != nullptr ? p : n;
    Block* absorbed = p != nullptr ? n : nullptr;
    const std::uintptr_t addr = p != nullptr ? p->addr : x->addr;
    const std::size_t size = x->size + (p ? p->size : 0) + (n ? n->size : 0);
    std::uint64_t seq = x->free_seq;
    if (p != nullptr) seq = std::max(seq, p->free_seq);
    if (n != nullptr) seq = std::max(seq, n->free_seq);
    if (absorbed != nullptr) EraseFree(absorbed);
    if (keeper == p) {
      p->next = n != nullptr ? n->next : x->next;
      if (p->next != nullptr) p->next->prev = p;
    } else {
      n->prev = x->prev;
      if (n->prev != nullptr) {
        n->prev->next = n;
      } else {
        n->segment->first = n;
      }
    }
    keeper->free_seq = seq;
    RekeyFree(keeper, addr, size, x->stream, x->shared);
    DeleteBlock(x);
    if (absorbed != nullptr) DeleteBlock(absorbed);
    // A shared neighbour that turned private may now touch a private block
    // of the same stream that it could not merge with before: go again.
    if (!CanMerge(keeper, keeper->prev) && !CanMerge(keeper, keeper->next)) return;
    EraseFree(keeper);
    x = keeper;
  }
}

REMAT_HOT_INLINE void CachingAllocator::CountFree(const Block* b, int sign) {
  Pool& pool = PoolOf(b);
  if (b->shared) pool.shared_count += sign;
  if (b->segment->expandable) {
    const std::size_t pages = WholePageBytes(b->addr, b->size, page_size_);
    free_page_bytes_ = sign > 0 ? free_page_bytes_ + pages : free_page_bytes_ - pages;
  }
  if (b->size == b->segment->whole_size) {
    whole_free_segments_ += sign;
  } else {
    const StatPool sp = StatPoolOf(pool);
    const auto bytes = static_cast<std::int64_t>(b->size);
    if (sign > 0) {
      stats_.inactive_split.Increase(sp, 1);
      stats_.inactive_split_bytes.Increase(sp, bytes);
    } else {
      stats_.inactive_split.Decrease(sp, 1);
      stats_.inactive_split_bytes.Decrease(sp, bytes);
    }
  }
}

REMAT_HOT_INLINE void CachingAllocator::InsertFree(Block* b) {
  b->partition = PartitionOf(b->stream, b->shared);
  b->free_pos = PoolOf(b).free.insert(b).first;
  CountFree(b, +1);
}

REMAT_HOT_INLINE void CachingAllocator::EraseFree(Block* b) {
  PoolOf(b).free.erase(b->free_pos);
  CountFree(b, -1);
}

REMAT_HOT_INLINE void CachingAllocator::RekeyFree(Block* b, std::uintptr_t addr, std::size_t size,
                                                  Stream stream, bool shared) {
  // The set holds pointers and orders them through the blocks, so a block
  // whose new key still sorts between its neighbours can change in place:
  // the tree itself does not change.
  FreeSet& set = PoolOf(b).free;
  const auto it = b->free_pos;
  const FreeKey key{PartitionOf(stream, shared), size, addr};
  // A smaller key can only collide with the predecessor, a larger one with
  // the successor; a key that changes partition moves.
  const FreeKey old_key = KeyOf(b);
  bool in_place;
  if (key.partition != old_key.partition) {
    in_place = false;
  } else if (key < old_key) {
    in_place = it == set.begin() || KeyOf(*std::prev(it)) < key;
  } else {
    auto next = std::next(it);
    in_place = next == set.end() || key < KeyOf(*next);
  }
  // The counters change by the difference, whether or not the block moves
  // in the set: statistics do not depend on the tree's shape.
  if (b->shared != shared) PoolOf(b).shared_count += shared ? 1 : -1;
  if (b->segment->expandable) {
    free_page_bytes_ = free_page_bytes_ - WholePageBytes(b->addr, b->size, page_size_) +
                       WholePageBytes(addr, size, page_size_);
  }
  CountResize(b->segment, b->size, size);
  b->addr = addr;
  b->size = size;
  b->stream = stream;
  b->shared = shared;
  if (!in_place) {
    set.erase(it);
    b->partition = key.partition;
    b->free_pos = set.insert(b).first;
  }
}

REMAT_HOT_INLINE void CachingAllocator::CountResize(const Segment* seg, std::size_t old_size,
                                                    std::size_t new_size) {
  // A free block spanning its whole segment is not split: it counts among
  // the whole free segments instead.
  const std::size_t whole = seg->whole_size;
  const std::int64_t old_split = old_size != whole ? static_cast<std::int64_t>(old_size) : 0;
  const std::int64_t new_split = new_size != whole ? static_cast<std::int64_t>(new_size) : 0;
  if (old_split == new_split) return;
  const StatPool sp = seg->large ? kLargePool : kSmallPool;
  if (old_split == 0) {
    stats_.inactive_split.Increase(sp, 1);
    --whole_free_segments_;
  } else if (new_split == 0) {
    stats_.inactive_split.Decrease(sp, 1);
    ++whole_free_segments_;
  }
  if (new_split > old_split) {
    stats_.inactive_split_bytes.Increase(sp, new_split - old_split);
  } else {
    stats_.inactive_split_bytes.Decrease(sp, old_split - new_split);
  }
}

// ---------------------------------------------------------------------------
// Events and streams

absl::StatusOr<Event> CachingAllocator::TakeEvent() {
  if (!spare_events_.empty()) {
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return device_->CreateEvent();
}

void CachingAllocator::ProcessPendingFrees(bool wait) {
  if (pending_frees_.empty()) return;
  std::vector<PendingFree> still_pending;
  for (PendingFree& pending : pending_frees_) {
    std::vector<Event> left;
    for (Event e : pending.events) {
      bool done = false;
      if (wait) {
        done = device_->SynchronizeEvent(e).ok();
      } else {
        absl::StatusOr<bool> query = device_->QueryEvent(e);
        done = query.ok() && *query;
      }
      if (done) {
        spare_events_.push_back(e);
      } else {
        left.push_back(e);
      }
    }
    if (left.empty()) {
      ReturnBlock(pending.block, pending.block->stream);
    } else {
      pending.block->pending_events = static_cast<int>(left.size());
      still_pending.push_back(PendingFree{pending.block, std::move(left)});
    }
  }
  pending_frees_ = std::move(still_pending);
}

void CachingAllocator::HarvestStreams(const Stream* requester, bool wait) {
  // Streams that hold private free blocks, found by walking the free sets'
  // private sections one stream at a time.
  absl::InlinedVector<Stream, 4> streams;
  for (Pool* pool : {&small_, &large_, &transient_}) {
    // Partition 0 holds the shared blocks; private ones start at 1.
    auto it = pool->free.lower_bound(FreeKey{1, 0, 0});
    while (*it != &pool->sentinel) {
      const Stream s = (*it)->stream;
      if ((requester == nullptr || s != *requester) &&
          std::find(streams.begin(), streams.end(), s) == streams.end()) {
        streams.push_back(s);
      }
      if (s.handle + 2 == 0) break;
      it = pool->free.lower_bound(FreeKey{s.handle + 2, 0, 0});  // the next stream's
    }
  }
  for (Stream s : streams) {
    StreamHarvest& h = harvest_[s];
    // Waiting covers every block freed so far, so an event recorded before
    // the latest frees is followed by a fresh one.
    for (int pass = 0; pass < 2; ++pass) {
      if (!h.in_flight) {
        absl::StatusOr<Event> event = TakeEvent();
        if (!event.ok()) break;
        if (!device_->RecordEvent(*event, s).ok()) {
          spare_events_.push_back(*event);
          // A stream that no longer exists (destroyed by its owner): once the
          // whole device is idle, its blocks are safe for everyone.
          if (wait && device_->Synchronize().ok()) ShareBlocksOf(s, next_free_seq_);
          break;
        }
        h.in_flight = true;
        h.event = *event;
        h.free_seq_at_record = next_free_seq_;
      }
      bool done = false;
      if (wait) {
        done = device_->SynchronizeEvent(h.event).ok();
      } else {
        absl::StatusOr<bool> query = device_->QueryEvent(h.event);
        done = query.ok() && *query;
      }
      if (!done) break;
      h.in_flight = false;
      spare_events_.push_back(h.event);
      const bool covered_all = h.free_seq_at_record == next_free_seq_;
      ShareBlocksOf(s, h.free_seq_at_record);
      if (!wait || covered_all) break;
    }
  }
}

void CachingAllocator::ShareBlocksOf(Stream stream, std::uint64_t before_seq) {
  for (Pool* pool : {&small_, &large_, &transient_}) {
    std::vector<Block*> moving;
    const std::uintptr_t partition = PartitionOf(stream, /*shared=*/false);
    for (auto it = pool->free.lower_bound(FreeKey{partition, 0, 0}); (*it)->partition == partition;
         ++it) {
      if ((*it)->free_seq < before_seq) moving.push_back(*it);
    }
    // One at a time: a block just shared merges only with shared neighbours,
    // so a block still waiting its turn is never absorbed before it is moved.
    for (Block* b : moving) {
      EraseFree(b);
      b->shared = true;
      InsertCoalesced(b);
    }
  }
}

std::size_t CachingAllocator::ReleaseCachedSegments() {
  std::size_t released = page_size_ != 0 ? UnmapFreePages() : 0;
  // A pressure event comes with every allocation that does not fit: skip the
  // walk over every segment when none can be released.
  for (auto it = segments_.begin(); whole_free_segments_ > 0 && it != segments_.end();) {
    Segment* seg = it->second;
    Block* b = seg->first;
    // An expandable segment gives its pages back by unmapping (above) and
    // keeps its range; its first block may be an unmapped one, outside the
    // free set.
    if (seg->expandable || b->allocated || b->pending_free || b->size != seg->size) {
      ++it;
      continue;
    }
    // Releasing synchronizes the device (as cudaFree does), so even a block
    // private to a busy stream is safe to give back.
    if (!device_->ReleaseSegment(reinterpret_cast<void*>(seg->addr)).ok()) {
      ++it;
      continue;
    }
    EraseFree(b);
    const StatPool sp = seg->large ? kLargePool : kSmallPool;
    stats_.segment.Decrease(sp, 1);
    stats_.reserved_bytes.Decrease(sp, static_cast<std::int64_t>(seg->size));
    ++stats_.num_device_free;
    RecordTrace(TraceAction::kSegmentFree, seg->addr, seg->size, seg->size, seg->stream);
    released += seg->size;
    ++free_epoch_;
    DeleteBlock(b);
    delete seg;
    it = segments_.erase(it);
  }
  return released;
}

absl::Status CachingAllocator::EmptyCache() {
  MutexLock lock(&mu_);
  EndUndo();
  ProcessPendingFrees(/*wait=*/true);
  HarvestStreams(nullptr, /*wait=*/true);
  ReleaseCachedSegments();
  return absl::OkStatus();
}

absl::Status CachingAllocator::RecordStream(void* ptr, Stream stream) {
  MutexLock lock(&mu_);
  EndUndo();
  Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "RecordStream"));
  if (stream == b->stream) return absl::OkStatus();
  if (std::find(b->extra_streams.begin(), b->extra_streams.end(), stream) == b->extra_streams.end()) {
    b->extra_streams.push_back(stream);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Configuration and observation

void CachingAllocator::SetPressureHandler(PressureHandler handler) {
  MutexLock lock(&mu_);
  pressure_handler_ = handler ? std::make_shared<PressureHandler>(std::move(handler)) : nullptr;
}

absl::Status CachingAllocator::SetBudget(std::size_t budget) {
  if (budget < kSmallBuffer || budget > device_->Capacity()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget must be between the smallest segment (%s) and the device's %s, not %d bytes",
        FormatBytes(kSmallBuffer), FormatBytes(device_->Capacity()), budget));
  }
  MutexLock lock(&mu_);
  EndUndo();
  budget_ = budget;
  if (static_cast<std::size_t>(stats_.reserved_bytes.all().current) > budget_) {
    ProcessPendingFrees(/*wait=*/true);
    HarvestStreams(nullptr, /*wait=*/true);
    ReleaseCachedSegments();
  }
  reserved_at_budget_change_ = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  return absl::OkStatus();
}

absl::Status CachingAllocator::SetMaxSplitSize(std::size_t bytes) {
  if (bytes <= kSmallSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_split_size must be above %s (the small pool's largest request), not %s",
        FormatBytes(kSmallSize), FormatBytes(bytes)));
  }
  MutexLock lock(&mu_);
  EndUndo();
  max_split_size_ = bytes;
  return absl::OkStatus();
}

std::size_t CachingAllocator::max_split_size() const {
  MutexLock lock(&mu_);
  return max_split_size_;
}

std::uint64_t CachingAllocator::fast_undo_count() const {
  MutexLock lock(&mu_);
  return redone_;
}

std::size_t CachingAllocator::budget() const {
  MutexLock lock(&mu_);
  return budget_;
}

absl::Status CachingAllocator::SetOwner(void* ptr, std::uint64_t owner) {
  MutexLock lock(&mu_);
  EndUndo();
  Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "SetOwner"));
  b->owner = owner;
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> CachingAllocator::BlockSize(const void* ptr) const {
  MutexLock lock(&mu_);
  Settle();
  const Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "BlockSize"));
  return b->size;
}

bool CachingAllocator::ContainsAddress(const void* ptr) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock lock(&mu_);
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return false;
  --it;
  return addr < it->first + it->second->size;
}

absl::StatusOr<std::size_t> CachingAllocator::AdjacentFreeBytes(const void* ptr) const {
  MutexLock lock(&mu_);
  Settle();
  const Block* b = live_.Find(reinterpret_cast<std::uintptr_t>(ptr));
  if (b == nullptr) return absl::InvalidArgumentError(DescribeBadPointer(ptr, "AdjacentFreeBytes"));
  std::size_t bytes = 0;
  for (const Block* n : {b->prev, b->next}) {
    if (n != nullptr && !n->allocated && !n->pending_free && n->mapped) bytes += n->size;
  }
  return bytes;
}

void CachingAllocator::PendingStat::Add(StatPool sp, std::int64_t delta) {
  current[kAggregatePool] += delta;
  current[sp] += delta;
}

void CachingAllocator::PendingStat::NotePeak(StatPool sp, const StatArray& from) {
  for (const int i : {static_cast<int>(kAggregatePool), static_cast<int>(sp)}) {
    peak[i] = std::max(peak[i], from.pools[i].current + current[i]);
  }
}

void CachingAllocator::PendingStat::ResetPeak(const StatArray& from) {
  for (int i = 0; i < 3; ++i) peak[i] = from.pools[i].current + current[i];
}

void CachingAllocator::PendingStat::Derive(const StatArray& from, StatArray* active) const {
  for (int i = 0; i < 3; ++i) {
    Stat& t = active->pools[i];
    const Stat& f = from.pools[i];
    t.current = f.current + current[i];
    t.peak = std::max(f.peak, peak[i]);
    t.allocated = f.allocated;
    t.base = f.base + base[i];
  }
}

void CachingAllocator::CountPending(StatPool sp, int sign, std::int64_t bytes) {
  pending_stats_.count.Add(sp, sign);
  pending_stats_.bytes.Add(sp, sign * bytes);
}

void CachingAllocator::NotePendingPeak(StatPool sp) {
  pending_stats_.count.NotePeak(sp, stats_.allocation);
  pending_stats_.bytes.NotePeak(sp, stats_.allocated_bytes);
}

AllocatorStats CachingAllocator::StatsLocked() const {
  // Every allocation made a block active, and every active block is
  // allocated or pending free: active counts what allocation counts, plus
  // the pending frees.
  AllocatorStats stats = stats_;
  pending_stats_.count.Derive(stats_.allocation, &stats.active);
  pending_stats_.bytes.Derive(stats_.allocated_bytes, &stats.active_bytes);
  stats.Complete();
  return stats;
}

AllocatorStats CachingAllocator::GetStats() const {
  MutexLock lock(&mu_);
  Settle();
  return StatsLocked();
}

void CachingAllocator::ResetPeakStats() {
  MutexLock lock(&mu_);
  EndUndo();
  stats_.ResetPeaks();
  // Expandable segments unmap their free pages before passing the most
  // they ever reserved: from now, before passing what they reserve now.
  reserved_high_water_ = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  pending_stats_.count.ResetPeak(stats_.allocation);
  pending_stats_.bytes.ResetPeak(stats_.allocated_bytes);
}

void CachingAllocator::ResetAccumulatedStats() {
  MutexLock lock(&mu_);
  EndUndo();
  stats_.ResetAccumulated();
  pending_stats_.count.base = pending_stats_.count.current;
  pending_stats_.bytes.base = pending_stats_.bytes.current;
}

namespace {

BlockState StateOf(bool allocated, bool pending_free) {
  if (allocated) return BlockState::kActiveAllocated;
  if (pending_free) return BlockState::kActivePendingFree;
  return BlockState::kInactive;
}

}  // namespace

Snapshot CachingAllocator::TakeSnapshot() const {
  MutexLock lock(&mu_);
  Settle();
  Snapshot snap;
  snap.device = device_->Describe();
  snap.budget = budget_;
  snap.stats = StatsLocked();
  snap.segments.reserve(segments_.size());
  for (const auto& [addr, seg] : segments_) {
    // An expandable segment shows as its runs of mapped pages.
    for (const Block* run = seg->first; run != nullptr;) {
      if (!run->mapped) {
        run = run->next;
        continue;
      }
      SegmentInfo info;
      info.address = run->addr;
      info.is_large = seg->large;
      info.is_expandable = seg->expandable;
      info.stream = seg->stream;
      const Block* b = run;
      for (; b != nullptr && b->mapped; b = b->next) {
        // An unbacked block keeps its size; only its mapped pages count.
        info.total_size += b->size - (b->unbacked_done ? b->unbacked_hi - b->unbacked_lo : 0);
        BlockInfo bi;
        bi.address = b->addr;
        bi.size = b->size;
        bi.state = StateOf(b->allocated, b->pending_free);
        bi.requested_size = bi.state == BlockState::kInactive ? 0 : b->requested;
        bi.stream = b->stream;
        bi.owner = b->owner;
        if (bi.state == BlockState::kActiveAllocated) info.allocated_size += b->size;
        if (bi.state != BlockState::kInactive) {
          info.active_size += b->size;
          info.requested_size += b->requested;
        }
        info.blocks.push_back(bi);
      }
      snap.segments.push_back(std::move(info));
      run = b;
    }
  }
  // Oldest first: once the ring is full, the oldest entry is the next to go.
  if (ring_size_ < ring_.size()) {
    snap.events.assign(ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(ring_size_));
  } else {
    const auto next = ring_.begin() + static_cast<std::ptrdiff_t>(ring_next_);
    snap.events.assign(next, ring_.end());
    snap.events.insert(snap.events.end(), ring_.begin(), next);
  }
  return snap;
}

MemoryMap CachingAllocator::GetMemoryMap() const {
  MutexLock lock(&mu_);
  Settle();
  MemoryMap map;
  map.segments.reserve(segments_.size());
  for (const auto& [addr, seg] : segments_) {
    // An expandable segment shows as its runs of mapped pages.
    for (const Block* run = seg->first; run != nullptr;) {
      if (!run->mapped) {
        run = run->next;
        continue;
      }
      MemoryMapSegment ms;
      ms.address = run->addr;
      ms.is_large = seg->large;
      ms.merge_boundary = seg->page_bounded ? page_size_ : 0;
      ms.page_size = seg->expandable ? page_size_ : 0;
      const Block* b = run;
      for (; b != nullptr && b->mapped; b = b->next) {
        ms.size += b->size - (b->unbacked_done ? b->unbacked_hi - b->unbacked_lo : 0);
        ms.blocks.push_back(MemoryMapBlock{b->addr, b->size,
                                           StateOf(b->allocated, b->pending_free), b->owner});
      }
      map.segments.push_back(std::move(ms));
      run = b;
    }
  }
  return map;
}

// ---------------------------------------------------------------------------
// Invariants

absl::Status CachingAllocator::CheckInvariants() const {
  MutexLock lock(&mu_);
  return CheckInvariantsLocked();
}

absl::Status CachingAllocator::CheckInvariantsLocked() const {
#define REMAT_INVARIANT(cond, ...)                                                     \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      return absl::FailedPreconditionError(                                            \
          absl::StrCat("allocator invariant broken: ", absl::StrFormat(__VA_ARGS__))); \
    }                                                                                  \
  } while (false)
  // What the walk counts, per StatPool (the aggregate, small, large).
  struct Counts {
    std::int64_t allocation = 0, allocated_bytes = 0, requested_bytes = 0;
    std::int64_t pending = 0, pending_bytes = 0;
    std::int64_t reserved = 0, segments = 0;
    std::int64_t inactive_split = 0, inactive_split_bytes = 0;
  };
  std::array<Counts, 3> counts{};
  std::size_t free_blocks[3] = {0, 0, 0};  // in the free sets, by pool (small, large, transient)
  std::size_t shared_blocks[3] = {0, 0, 0};
  std::size_t unmapped_blocks[3] = {0, 0, 0};
  std::size_t whole_free = 0;
  std::size_t free_pages = 0;
  std::size_t unbacking = 0;
  std::size_t pending_blocks = 0;
  const Pool* pools[3] = {&small_, &large_, &transient_};
  const char* pool_names[3] = {"small", "large", "transient"};

  for (const auto& [key, seg] : segments_) {
    REMAT_INVARIANT(seg != nullptr && seg->addr == key, "segment at %#x is filed under %#x",
                    seg == nullptr ? 0 : seg->addr, key);
    const int pi = seg->pool == &transient_ ? 2 : seg->large ? 1 : 0;
    const Pool* pool = pools[pi];
    REMAT_INVARIANT(seg->pool == pool && (pi != 2 || seg->expandable),
                    "segment at %#x belongs to no pool its kind allows", seg->addr);
    const StatPool sp = seg->large ? kLargePool : kSmallPool;
    REMAT_INVARIANT(
        seg->expandable == (page_size_ != 0),
        "segment at %#x: expandable is %d in an allocator whose expandable segments are %d",
        seg->addr, seg->expandable, page_size_ != 0);
    if (seg->expandable) {
      REMAT_INVARIANT(seg->addr % page_size_ == 0 && seg->size % page_size_ == 0 &&
                          seg->pages.size() == seg->size / page_size_,
                      "expandable segment at %#x (%d bytes, %d page entries) is not whole pages",
                      seg->addr, seg->size, seg->pages.size());
      REMAT_INVARIANT(seg->whole_size == std::numeric_limits<std::size_t>::max(),
                      "expandable segment at %#x has a whole size", seg->addr);
      REMAT_INVARIANT(seg->page_bounded == (!seg->large && page_size_ >= kSmallSize),
                      "expandable segment at %#x: page_bounded is %d", seg->addr,
                      seg->page_bounded);
    } else {
      REMAT_INVARIANT(seg->whole_size == seg->size && seg->size > 0 &&
                          seg->size % (seg->large ? kRoundLarge : kSmallBuffer) == 0,
                      "segment at %#x: size %d, whole size %d", seg->addr, seg->size,
                      seg->whole_size);
      REMAT_INVARIANT(!seg->page_bounded, "fixed segment at %#x is page-bounded", seg->addr);
      counts[sp].reserved += static_cast<std::int64_t>(seg->size);
    }
    ++counts[sp].segments;
    REMAT_INVARIANT(
        seg->first != nullptr && seg->first->addr == seg->addr && seg->first->prev == nullptr,
        "segment at %#x does not start with its first block", seg->addr);
    std::uintptr_t at = seg->addr;
    std::size_t mapped_pages = 0;  // pages the blocks say are mapped
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      REMAT_INVARIANT(b->addr == at,
                      "segment at %#x: block at %#x where %#x was expected (a gap or an overlap)",
                      seg->addr, b->addr, at);
      REMAT_INVARIANT(b->segment == seg && b->pool == pool,
                      "block at %#x names another segment or pool than the one it lies in",
                      b->addr);
      REMAT_INVARIANT(b->size > 0 && b->size % kMinBlockSize == 0 && b->addr % kMinBlockSize == 0,
                      "block at %#x of %d bytes is not in %d-byte units", b->addr, b->size,
                      kMinBlockSize);
      REMAT_INVARIANT(b->next == nullptr || b->next->prev == b,
                      "block at %#x: its next block's prev does not point back", b->addr);
      REMAT_INVARIANT(b->addr + b->size <= seg->addr + seg->size,
                      "block at %#x of %d bytes runs past its segment's end %#x", b->addr, b->size,
                      seg->addr + seg->size);
      at = b->addr + b->size;
      const int states = int{b->allocated} + int{b->pending_free} + int{!b->mapped};
      REMAT_INVARIANT(states <= 1,
                      "block at %#x is in %d states at once (allocated %d, pending %d, mapped %d)",
                      b->addr, states, b->allocated, b->pending_free, b->mapped);
      REMAT_INVARIANT(b->unbacked_hi == 0 || b->allocated || b->pending_free,
                      "free block at %#x is marked unbacked", b->addr);
      if (seg->page_bounded && b->mapped) {
        REMAT_INVARIANT(b->addr / page_size_ == (b->addr + b->size - 1) / page_size_,
                        "small block at %#x of %d bytes crosses a page boundary", b->addr, b->size);
      }
      if (!b->mapped) {
        REMAT_INVARIANT(
            seg->expandable && b->addr % page_size_ == 0 && b->size % page_size_ == 0,
            "unmapped block at %#x of %d bytes is not whole pages of an expandable segment",
            b->addr, b->size);
        REMAT_INVARIANT(b->prev == nullptr || b->prev->mapped,
                        "unmapped blocks at %#x and %#x are left apart", b->prev->addr, b->addr);
        REMAT_INVARIANT(pool->unmapped.contains(const_cast<Block*>(b)),
                        "unmapped block at %#x is not in its pool's unmapped set", b->addr);
        REMAT_INVARIANT(b->stream == seg->stream && !b->shared,
                        "unmapped block at %#x is not its segment's stream's", b->addr);
        ++unmapped_blocks[pi];
        for (std::size_t i = (b->addr - seg->addr) / page_size_; i < (at - seg->addr) / page_size_;
             ++i) {
          REMAT_INVARIANT(seg->pages[i].handle == 0,
                          "page at %#x under an unmapped block is mapped",
                          seg->addr + i * page_size_);
        }
        continue;
      }
      if (seg->expandable) {
        // Every page a mapped block touches is mapped, but for the pages an
        // allocated block has had unmapped (Unback).
        const std::size_t first = (b->addr - seg->addr) / page_size_;
        const std::size_t last = (at - 1 - seg->addr) / page_size_;
        for (std::size_t i = first; i <= last; ++i) {
          const std::uintptr_t page = seg->addr + i * page_size_;
          const bool given_up = b->unbacked_done && page >= b->unbacked_lo && page < b->unbacked_hi;
          REMAT_INVARIANT((seg->pages[i].handle != 0) != given_up,
                          "page at %#x under the block at %#x is %s", page, b->addr,
                          given_up ? "mapped though unbacked" : "not mapped");
          // A page shared by two blocks is counted once, by the first.
          if (!given_up && (i != first || b->prev == nullptr || !b->prev->mapped ||
                            (b->prev->addr + b->prev->size - 1 - seg->addr) / page_size_ != i)) {
            ++mapped_pages;
          }
        }
      }
      if (b->unbacked_hi != 0) {
        REMAT_INVARIANT(seg->expandable && b->unbacked_lo % page_size_ == 0 &&
                            b->unbacked_hi % page_size_ == 0 && b->unbacked_lo >= b->addr &&
                            b->unbacked_hi <= at && b->unbacked_lo < b->unbacked_hi,
                        "block at %#x: unbacked range [%#x, %#x) is not whole pages inside it",
                        b->addr, b->unbacked_lo, b->unbacked_hi);
        if (!b->unbacked_done) {
          ++unbacking;
          REMAT_INVARIANT(std::find(unbacking_.begin(), unbacking_.end(), b) != unbacking_.end(),
                          "block at %#x waits to be unbacked but is not listed", b->addr);
        }
      }
      if (b->allocated) {
        REMAT_INVARIANT(live_.Find(b->addr) == b, "allocated block at %#x is not in the live map",
                        b->addr);
        REMAT_INVARIANT(b->requested > 0 && b->size >= RoundRequest(b->requested),
                        "allocated block at %#x of %d bytes holds a request of %d bytes", b->addr,
                        b->size, b->requested);
        REMAT_INVARIANT(!b->shared, "allocated block at %#x is marked shared", b->addr);
        for (const StatPool p : {kAggregatePool, sp}) {
          ++counts[p].allocation;
          counts[p].allocated_bytes += static_cast<std::int64_t>(b->size);
          counts[p].requested_bytes += static_cast<std::int64_t>(b->requested);
        }
        continue;
      }
      if (b->pending_free) {
        REMAT_INVARIANT(b->pending_events > 0, "pending free at %#x waits for no event", b->addr);
        ++pending_blocks;
        for (const StatPool p : {kAggregatePool, sp}) {
          ++counts[p].pending;
          counts[p].pending_bytes += static_cast<std::int64_t>(b->size);
        }
        continue;
      }
      REMAT_INVARIANT(b->requested == 0 && b->owner == 0 && b->extra_streams.empty(),
                      "free block at %#x keeps its allocation's request, owner or streams",
                      b->addr);
      if (b == undone_) continue;  // set aside by the undo fast path: outside the set
      // A free mapped block: in its pool's set, under its key.
      REMAT_INVARIANT(b->partition == PartitionOf(b->stream, b->shared),
                      "free block at %#x is filed under partition %d, not %d", b->addr,
                      b->partition, PartitionOf(b->stream, b->shared));
      ++free_blocks[pi];
      if (b->shared) ++shared_blocks[pi];
      if (seg->expandable) free_pages += WholePageBytes(b->addr, b->size, page_size_);
      if (b->size == seg->whole_size) {
        ++whole_free;
      } else {
        for (const StatPool p : {kAggregatePool, sp}) {
          ++counts[p].inactive_split;
          counts[p].inactive_split_bytes += static_cast<std::int64_t>(b->size);
        }
      }
      // Free neighbours that may merge either way were merged (a block
      // shared after its private neighbour was freed stays apart from it).
      const Block* n = b->next;
      if (n != nullptr && n != undone_ && !n->allocated && !n->pending_free && n->mapped) {
        REMAT_INVARIANT(!(CanMerge(b, n) && CanMerge(n, b)),
                        "free neighbours at %#x and %#x were not coalesced", b->addr, n->addr);
      }
    }
    REMAT_INVARIANT(at == seg->addr + seg->size,
                    "the blocks of the segment at %#x end at %#x, not at its end %#x", seg->addr,
                    at, seg->addr + seg->size);
    if (seg->expandable) {
      std::size_t handles = 0;
      for (const PhysicalChunk& c : seg->pages) handles += c.handle != 0;
      REMAT_INVARIANT(handles == mapped_pages,
                      "expandable segment at %#x holds %d mapped pages, its blocks %d", seg->addr,
                      handles, mapped_pages);
      counts[sp].reserved += static_cast<std::int64_t>(mapped_pages * page_size_);
    }
  }
  for (const StatPool sp : {kSmallPool, kLargePool}) {
    counts[kAggregatePool].reserved += counts[sp].reserved;
    counts[kAggregatePool].segments += counts[sp].segments;
  }

  // The free sets hold exactly the free blocks counted above, and the sentinel last.
  for (int pi = 0; pi < 3; ++pi) {
    const Pool& pool = *pools[pi];
    REMAT_INVARIANT(!pool.free.empty() && *std::prev(pool.free.end()) == &pool.sentinel,
                    "the %s pool's free set does not end with its sentinel", pool_names[pi]);
    REMAT_INVARIANT(pool.free.size() == free_blocks[pi] + 1,
                    "the %s pool's free set holds %d blocks, its segments %d free ones",
                    pool_names[pi], pool.free.size() - 1, free_blocks[pi]);
    // Each entry is a free block of the pool that lies in its segment (so
    // among those counted above) and knows where it is in the set: with the
    // counts equal, the set holds exactly the segments' free blocks. (A
    // block's own position is only followed from the set: a block left out
    // may hold a stale one.)
    for (auto it = pool.free.begin(); it != pool.free.end(); ++it) {
      const Block* b = *it;
      if (b == &pool.sentinel) continue;
      REMAT_INVARIANT(
          b->pool == &pool && !b->allocated && !b->pending_free && b->mapped && b != undone_,
          "the %s pool's free set holds the block at %#x, which is not a free block of it",
          pool_names[pi], b->addr);
      REMAT_INVARIANT(b->free_pos == it,
                      "free block at %#x is not where its free-set position says", b->addr);
      REMAT_INVARIANT(segments_.contains(b->segment->addr) &&
                          segments_.at(b->segment->addr) == b->segment &&
                          (b->prev != nullptr ? b->prev->next == b : b->segment->first == b),
                      "the %s pool's free set holds the block at %#x, which is in no segment",
                      pool_names[pi], b->addr);
    }
    REMAT_INVARIANT(pool.shared_count == shared_blocks[pi],
                    "the %s pool counts %d shared free blocks, its free set holds %d",
                    pool_names[pi], pool.shared_count, shared_blocks[pi]);
    REMAT_INVARIANT(pool.unmapped.size() == unmapped_blocks[pi],
                    "the %s pool's unmapped set holds %d blocks, its segments %d", pool_names[pi],
                    pool.unmapped.size(), unmapped_blocks[pi]);
  }
  REMAT_INVARIANT(whole_free_segments_ == whole_free, "%d whole free segments counted, %d found",
                  whole_free_segments_, whole_free);
  REMAT_INVARIANT(free_page_bytes_ == free_pages, "%d bytes of free whole pages counted, %d found",
                  free_page_bytes_, free_pages);
  REMAT_INVARIANT(unbacking_.size() == unbacking,
                  "%d blocks listed as waiting to be unbacked, %d found", unbacking_.size(),
                  unbacking);

  // Allocated blocks are the live map; pending ones the pending frees.
  REMAT_INVARIANT(live_.size() == static_cast<std::size_t>(counts[kAggregatePool].allocation),
                  "the live map holds %d pointers, the segments %d allocated blocks", live_.size(),
                  counts[kAggregatePool].allocation);
  std::size_t listed_pending = 0;
  for (const PendingFree& p : pending_frees_) {
    REMAT_INVARIANT(p.block != nullptr && p.block->pending_free && !p.events.empty() &&
                        p.block->pending_events == static_cast<int>(p.events.size()),
                    "a pending free (block at %#x) disagrees with its block or has no event",
                    p.block == nullptr ? 0 : p.block->addr);
    ++listed_pending;
  }
  REMAT_INVARIANT(listed_pending == pending_blocks, "%d frees listed as pending, %d blocks pending",
                  listed_pending, pending_blocks);
  // Every event is in one place at a time: waited on by a pending free, in
  // flight behind a stream's frees, or spare.
  {
    absl::flat_hash_set<std::uintptr_t> events;
    for (const PendingFree& p : pending_frees_) {
      for (const Event e : p.events) {
        REMAT_INVARIANT(events.insert(e.handle).second, "event %#x is waited on twice", e.handle);
      }
    }
    for (const auto& [stream, h] : harvest_) {
      if (!h.in_flight) continue;
      REMAT_INVARIANT(events.insert(h.event.handle).second,
                      "event %#x is in flight for stream %d and waited on elsewhere",
                      h.event.handle, stream.handle);
    }
    for (const Event e : spare_events_) {
      REMAT_INVARIANT(events.insert(e.handle).second,
                      "event %#x is spare and in use (or spare twice)", e.handle);
    }
  }
  if (undone_ != nullptr) {
    REMAT_INVARIANT(!undone_->allocated && !undone_->pending_free && undone_->mapped,
                    "the block set aside by the undo fast path at %#x is not free", undone_->addr);
  }

  // The statistics are what the walk counted.
  for (const StatPool sp : {kAggregatePool, kSmallPool, kLargePool}) {
    const Counts& c = counts[sp];
    const char* name = kStatPoolNames[sp];
    auto check = [&](const char* what, const Stat& stat, std::int64_t want) -> absl::Status {
      if (stat.current != want) {
        return absl::FailedPreconditionError(
            absl::StrFormat("allocator invariant broken: %s[%s] is %d, the walk counts %d", what,
                            name, stat.current, want));
      }
      if (stat.current > stat.peak) {
        return absl::FailedPreconditionError(
            absl::StrFormat("allocator invariant broken: %s[%s] is %d, above its peak %d", what,
                            name, stat.current, stat.peak));
      }
      return absl::OkStatus();
    };
    for (absl::Status s :
         {check("allocation", stats_.allocation.pools[sp], c.allocation),
          check("allocated_bytes", stats_.allocated_bytes.pools[sp], c.allocated_bytes),
          check("requested_bytes", stats_.requested_bytes.pools[sp], c.requested_bytes),
          check("reserved_bytes", stats_.reserved_bytes.pools[sp], c.reserved),
          check("segment", stats_.segment.pools[sp], c.segments),
          check("inactive_split", stats_.inactive_split.pools[sp], c.inactive_split),
          check("inactive_split_bytes", stats_.inactive_split_bytes.pools[sp],
                c.inactive_split_bytes)}) {
      if (!s.ok()) return s;
    }
    REMAT_INVARIANT(pending_stats_.count.current[sp] == c.pending &&
                        pending_stats_.bytes.current[sp] == c.pending_bytes,
                    "pending frees[%s] counted as %d blocks, %d bytes; the walk finds %d, %d", name,
                    pending_stats_.count.current[sp], pending_stats_.bytes.current[sp], c.pending,
                    c.pending_bytes);
  }
  // Active is allocation plus the pending frees (StatsLocked derives it).
  const AllocatorStats derived = StatsLocked();
  REMAT_INVARIANT(
      derived.active.all().current ==
              counts[kAggregatePool].allocation + counts[kAggregatePool].pending &&
          derived.active_bytes.all().current ==
              counts[kAggregatePool].allocated_bytes + counts[kAggregatePool].pending_bytes &&
          derived.active_bytes.all().current <= derived.active_bytes.all().peak,
      "active is %d blocks, %d bytes (peak %d); the walk finds %d, %d",
      derived.active.all().current, derived.active_bytes.all().current,
      derived.active_bytes.all().peak,
      counts[kAggregatePool].allocation + counts[kAggregatePool].pending,
      counts[kAggregatePool].allocated_bytes + counts[kAggregatePool].pending_bytes);

  // The budget: no growth passes it (a lowered budget keeps what was reserved then).
  const auto reserved = static_cast<std::size_t>(counts[kAggregatePool].reserved);
  REMAT_INVARIANT(reserved + reserving_bytes_ <= std::max(budget_, reserved_at_budget_change_),
                  "%d bytes reserved (and %d being reserved), above the budget %d", reserved,
                  reserving_bytes_, budget_);
  REMAT_INVARIANT(page_size_ == 0 || reserved <= reserved_high_water_,
                  "%d bytes reserved, above the high-water mark %d", reserved,
                  reserved_high_water_);
#undef REMAT_INVARIANT
  return absl::OkStatus();
}

REMAT_HOT_INLINE void CachingAllocator::RecordTrace(TraceAction action, std::uintptr_t addr,
                                                    std::size_t size, std::size_t requested,
                                                    Stream stream) {
  if (ring_.empty()) return;
  TraceEvent& e = ring_[ring_next_];
  e.action = action;
  e.address = addr;
  e.size = size;
  e.requested_size = requested;
  e.stream = stream;
  e.time_ns = device_->NowNs();
  if (++ring_next_ == ring_.size()) ring_next_ = 0;
  if (ring_size_ < ring_.size()) ++ring_size_;
}

std::string CachingAllocator::DescribeBadPointer(const void* ptr, const char* op) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.upper_bound(addr);
  if (it != segments_.begin()) {
    const Segment* seg = std::prev(it)->second;
    if (addr < seg->addr + seg->size) {
      for (const Block* b = seg->first; b != nullptr; b = b->next) {
        if (addr < b->addr || addr >= b->addr + b->size) continue;
        if (!b->allocated && !b->pending_free) {
          return absl::StrFormat(
              "%s(%p): double free, or a pointer never allocated: it lies in free memory",
              op, ptr);
        }
        if (addr != b->addr) {
          return absl::StrFormat(
              "%s(%p): interior pointer, %d bytes into the allocated block at %#x; pass the "
              "pointer Allocate returned",
              op, ptr, addr - b->addr, b->addr);
        }
        if (b->pending_free) {
          return absl::StrFormat("%s(%p): double free (already freed, waiting for its streams)",
                                 op, ptr);
        }
        return absl::StrFormat("%s(%p): double free (the block is not allocated)", op, ptr);
      }
    }
  }
  return absl::StrFormat("%s(%p): not a pointer this allocator returned", op, ptr);
}

std::string CachingAllocator::OomMessage(std::size_t requested, std::size_t size,
                                         Stream stream) const {
  std::size_t largest_free = 0;
  std::size_t free_bytes = 0;
  std::string pools;
  for (const Pool* pool : {&small_, &large_}) {
    std::size_t pool_free = 0;
    std::size_t pool_largest = 0;
    // (The small pool's figures count the blocks placed apart too.)
    for (const Pool* part : {pool, pool == &small_ ? &transient_ : nullptr}) {
      if (part == nullptr) continue;
      for (const Block* b : part->free) {
        if (b == &part->sentinel) continue;
        pool_largest = std::max(pool_largest, b->size);
        pool_free += b->size;
      }
    }
    largest_free = std::max(largest_free, pool_largest);
    free_bytes += pool_free;
    const StatPool sp = StatPoolOf(*pool);
    absl::StrAppendFormat(
        &pools, "; %s pool: reserved %s, allocated %s, cached free %s (largest %s)",
        pool->large ? "large" : "small",
        FormatBytes(static_cast<std::uint64_t>(stats_.reserved_bytes.pools[sp].current)),
        FormatBytes(static_cast<std::uint64_t>(stats_.allocated_bytes.pools[sp].current)),
        FormatBytes(pool_free), FormatBytes(pool_largest));
  }
  const double fragmentation =
      free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free_bytes);
  const auto reserved = static_cast<std::uint64_t>(stats_.reserved_bytes.all().current);
  const auto allocated = static_cast<std::uint64_t>(stats_.allocated_bytes.all().current);
  return absl::StrFormat(
      "out of memory: cannot allocate %s (%d bytes, %s rounded) on stream %d; budget %s, "
      "reserved %s, allocated %s, cached free %s, largest free block %s, fragmentation %.1f%% "
      "(1 - largest free / cached free)%s; device %s",
      FormatBytes(requested), requested, FormatBytes(size), stream.handle, FormatBytes(budget_),
      FormatBytes(reserved), FormatBytes(allocated), FormatBytes(free_bytes),
      FormatBytes(largest_free), 100.0 * fragmentation, pools, device_->Describe());
}

}  // namespace remat
