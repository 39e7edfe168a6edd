// CachingAllocator: a stream-ordered caching allocator of device memory.
//
// Design (the semantics of PyTorch's CUDA caching allocator, our own code):
//
// * Sizes round up to 512 B. Requests up to 1 MiB come from the small pool,
//   carved out of 2 MiB segments; larger ones from the large pool: 1-10 MiB
//   requests share 20 MiB segments, larger ones get a segment of their size
//   rounded up to 2 MiB.
// * A request takes the best-fitting free block, ordered by (size, address),
//   and splits off the rest when it is worth keeping (>= 512 B in the small
//   pool, > 1 MiB in the large). A freed block coalesces with free address
//   neighbours. Blocks larger than max_split_size are never split, and a
//   request below it never takes one of them.
// * Stream order. A block freed on stream S is reusable at once on S: later
//   work on S is ordered after the work that used it. Other streams may take it
//   only after an event recorded on S behind that use has completed. The event
//   is recorded lazily, when another stream first looks for memory, so a
//   one-stream program never pays for events. RecordStream(ptr, T) marks that T
//   also used a block; its free then records an event on every such stream and
//   the block stays "active_pending_free" until they complete.
// * Under pressure, in order: reuse cached blocks; reserve a new segment if
//   the budget and the device allow; wait for pending events and release the
//   whole free segments in the cache; ask the pressure handler (the runtime's
//   eviction) and retry while it reports progress; fail with ResourceExhausted.
//
// Expandable segments (AllocatorOptions::expandable_segments, PyTorch's
// expandable_segments:True; the device needs virtual memory). Each pool keeps,
// per stream, one large reserved address range whose pages (the device's page
// size, 2 MiB) are mapped as it grows and unmapped as it shrinks, so a freed
// block coalesces with everything free next to it and no segment boundary
// strands free bytes. A request that fits no free block maps the pages it
// lacks, preferring a place whose free mapped bytes it extends. In the small
// pool no block crosses a page boundary: each page fills as a fixed 2 MiB
// segment would, so no small block holds two pages. Before the reserved bytes
// would pass their high-water mark, the allocator first synchronizes the
// device and unmaps every whole free page it caches (what releasing the cache
// does for whole segments), so the reserved peak stays at the pages that hold
// live blocks. Reserved and segment statistics count mapped pages; snapshots
// show each run of mapped pages as a segment marked is_expandable.
//
// Zero-byte requests return nullptr without touching the pool, and freeing
// nullptr does nothing, as in PyTorch. Every other bad input (a foreign or
// interior pointer, a double free, a size beyond the device) returns an error
// and leaves the allocator unchanged.
//
// Thread-safe: one lock guards all state. The pressure handler runs without it
// held, so it may free (and allocate) through this allocator.
#ifndef REMAT_ALLOCATOR_CACHING_ALLOCATOR_H_
#define REMAT_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <memory_resource>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "allocator/address_map.h"
#include "allocator/allocator_stats.h"
#include "allocator/node_resource.h"
#include "allocator/snapshot.h"
#include "base/mutex.h"
#include "base/units.h"
#include "device/device.h"

namespace remat {

inline constexpr std::size_t kMinBlockSize = 512;       // every size rounds to this
inline constexpr std::size_t kSmallSize = 1 * kMiB;     // largest small-pool request
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;   // small-pool segment
inline constexpr std::size_t kLargeBuffer = 20 * kMiB;  // segment shared by 1-10 MiB requests
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;
inline constexpr std::size_t kRoundLarge = 2 * kMiB;    // larger segments round to this
inline constexpr std::size_t kMaxEventRingCapacity = std::size_t{1} << 24;

struct AllocatorOptions {
  // Cap on reserved bytes, to make a large GPU act as a smaller one.
  // 0: the device's capacity.
  std::size_t budget = 0;
  // Blocks above this size are never split. Default: no limit.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // Events kept in the snapshot's ring, at most kMaxEventRingCapacity; 0
  // (the default) records none. Off by default for the reason PyTorch's
  // memory history is opt-in: three stamped events per alloc/free pair are a
  // tenth of its cost. The ring is allocated up front (48 B an event).
  std::size_t event_ring_capacity = 0;
  // Safety net against a handler that reports progress it did not make.
  int max_pressure_rounds = 1 << 20;
  // Grow and shrink one reserved range per pool and stream (see above).
  // Create fails when the device has no virtual memory.
  bool expandable_segments = false;
  // Requests in [2^b, 2^(b+1)) bytes round up to one of roundup_divisions[b]
  // equal steps between powers of two (0 or 1: to 512 B only), as PyTorch's
  // roundup_power2_divisions; each value 0, 1 or a power of two up to 64.
  std::array<std::uint8_t, 64> roundup_divisions{};
  // Above this share of the budget reserved, the cache's whole free segments
  // (free pages, when expandable) are released before the pool grows. 0: off.
  double garbage_collection_threshold = 0;
  // The device reserves segments without the allocator's lock held, so other
  // threads allocate from the cache meanwhile (release_lock_on_cudamalloc).
  bool release_lock_on_device_reserve = false;
  // false: the allocator takes no lock, and only one thread may ever call it
  // (the simulator's replays, which own their allocator). An uncontended lock
  // and unlock are two atomic operations per call.
  bool thread_safe = true;
  // The undo fast path: an allocation freed by the very next call is set
  // aside uncoalesced, and a request for the same size on the same stream
  // that comes next takes it back at once. What every call returns and every
  // observer sees is what the full path gives (the same addresses,
  // statistics and snapshots: see Redo in caching_allocator.cc). false:
  // always the full path, for comparisons.
  bool fast_undo = true;
  // A step (BeginStep/EndStep) that makes more allocations than this is not
  // judged, and no later step is placed by steps: its books would cost a
  // step's size. 1 to CachingAllocator::kMaxStepAllocations.
  std::size_t max_step_allocations = std::size_t{1} << 22;
};

// What the allocator asks of the pressure handler.
struct PressureRequest {
  std::size_t bytes = 0;      // the rounded size of the request that does not fit
  Stream stream;              // the stream it is for
  std::size_t budget = 0;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  // True for an allocation, whose bytes must be free in one place; false for
  // Reback, which needs reserved room only (its address range is its own),
  // and for the runtime's live budget, which counts bytes.
  bool contiguous = true;
};

// Returns true when it freed something (the allocator then retries), false
// when it can do nothing more. It runs without the allocator's lock, on the
// allocating thread: several threads may call it at once (it must be
// thread-safe), and it may free and allocate through the allocator.
using PressureHandler = absl::AnyInvocable<bool(const PressureRequest&)>;

class CachingAllocator {
 public:
  // `device` must outlive the allocator. Fails on a budget below the smallest
  // segment or beyond the device's capacity, or a max_split_size below the
  // large-pool threshold.
  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(Device* device,
                                                                  AllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` of device memory usable on `stream`; nullptr for 0 bytes.
  // InvalidArgument when bytes exceed the device; ResourceExhausted when the
  // budget cannot hold it after everything above has been tried.
  absl::StatusOr<void*> Allocate(std::size_t bytes, Stream stream = kDefaultStream) {
    return Allocate(bytes, stream, /*owner=*/0);
  }
  // The same, with the block tagged as SetOwner does, in one step.
  absl::StatusOr<void*> Allocate(std::size_t bytes, Stream stream, std::uint64_t owner);
  // Frees on the stream the block was allocated on.
  absl::Status Free(void* ptr);
  // Frees on `stream` (as cudaFreeAsync): the block becomes reusable on it.
  // As with cudaFreeAsync, the caller orders `stream` after the work of the
  // allocation stream that uses the block; streams marked with RecordStream
  // are still waited for.
  absl::Status FreeOnStream(void* ptr, Stream stream);
  // Marks that `stream` also uses the block, so its free waits for `stream`.
  absl::Status RecordStream(void* ptr, Stream stream);
  // Returns every whole free segment to the device (after pending events).
  absl::Status EmptyCache();

  // Addresses that survive eviction (expandable segments only). Unback gives
  // up the memory of the whole pages inside a live block while the block,
  // and so its address, stays allocated: a framework that kept the pointer
  // (or a view into it) finds it again after Reback. It returns the bytes
  // that go (0 when no whole page lies inside the block: nothing changes).
  // The pages are unmapped when memory is next needed, after a device
  // synchronize, so work already enqueued on the block may finish; nothing
  // may be enqueued on it after Unback until Reback.
  absl::StatusOr<std::size_t> Unback(void* ptr);
  // Maps fresh pages under an unbacked block, within the budget (releasing
  // the cache and asking the pressure handler as Allocate does). The bytes
  // are not kept: the caller copies them back. ResourceExhausted when no
  // room can be made; the block then stays unbacked.
  absl::Status Reback(void* ptr, Stream stream = kDefaultStream);

  void SetPressureHandler(PressureHandler handler);
  // Rejects budgets below the smallest segment (2 MiB) and beyond the device.
  // Lowering it below what is
  // reserved releases the cache; what stays reserved stays.
  absl::Status SetBudget(std::size_t budget);
  std::size_t budget() const;
  // From the next request on, no free block above `bytes` is split for a
  // smaller request (SIZE_MAX: no limit); blocks split before stay as they
  // are. A training loop lowers it for the next step when a step failed for
  // want of a large block (StepPlannerOptions::split_limit_halvings_after_failure).
  // Rejects sizes within the small pool's requests, as Create does.
  absl::Status SetMaxSplitSize(std::size_t bytes);
  std::size_t max_split_size() const;
  // Tag the runtime puts on the block it owns, for the MemoryMap (0: none).
  absl::Status SetOwner(void* ptr, std::uint64_t owner);
  // Rounded size of a live allocation (the block it holds).
  absl::StatusOr<std::size_t> BlockSize(const void* ptr) const;
  // Bytes of the free blocks right before and after a live allocation in its
  // segment: what freeing it would coalesce with (for allocator-aware policies).
  absl::StatusOr<std::size_t> AdjacentFreeBytes(const void* ptr) const;
  // Whether `ptr` lies inside one of the segments this allocator reserved
  // (live, cached or freed block alike): such a pointer is never foreign.
  bool ContainsAddress(const void* ptr) const;

  AllocatorStats GetStats() const;
  void ResetPeakStats();
  void ResetAccumulatedStats();
  Snapshot TakeSnapshot() const;
  MemoryMap GetMemoryMap() const;

  // How many allocations the undo fast path served (AllocatorOptions::fast_undo).
  std::uint64_t fast_undo_count() const;

  // Steps: a training loop allocates the same sequence in every step, so one
  // step tells where the next should place its blocks. With expandable
  // segments, BeginStep starts recording the step's allocations (their
  // order, sizes and lifetimes); EndStep learns from it, and starts the next.
  // In the next step a small-pool request that, by its place in the step's
  // sequence and its size, was not live at the last step's peak of
  // allocated bytes takes its block from pages of its own, apart from the
  // blocks that were (a preference: under the budget either kind takes the
  // other's free room before anything is evicted). Those pages come free
  // before the peak, and the blocks live at the peak share as few pages as
  // their sizes allow. A request the last step did not make (another
  // position or size) is placed as without steps.
  //
  // The first such step is a trial against the plain step it learned from,
  // by the pages that held blocks at its peak (reserved bytes less the free
  // whole pages cached, which growth past the high-water mark gives back
  // first: in a loop that keeps its cache, the pages it no longer needs).
  // Fewer: later steps go on placing so, each by the step before. As many
  // or more: every later step is placed plainly. (Apart, the two kinds of
  // blocks cannot share a page, which costs one where a step fits in a
  // few.) A step that made no allocation, had one refused (out of memory)
  // or passed AllocatorOptions::max_step_allocations is not judged (nor is
  // any later step: placed plainly from then on); one that made another
  // sequence than the step it placed by starts the trial over; a plain step
  // with nothing to place apart stays plain. Without expandable segments
  // both do nothing. EndStep alone also starts recording (call it once
  // before the loop); neither need be called.
  void BeginStep();
  void EndStep();
  static constexpr std::size_t kMaxStepAllocations = std::size_t{1} << 22;
  // Of the last step learned: its allocations, and those placed apart.
  std::size_t learned_allocations() const;
  std::size_t learned_transient() const;

  // Walks every segment, block, free set and counter, and returns
  // FailedPrecondition naming the first broken invariant: blocks tile each
  // segment and link both ways; no two free neighbours that may merge are
  // left apart; every free block is in its pool's free set under its key and
  // every entry of a set is such a block; live, pending and unmapped blocks
  // are where their state says; sizes are rounded as promised; the
  // statistics equal what the walk counts; reserved bytes stay within the
  // budget; an expandable segment's mapped pages are those under its mapped
  // blocks. Linear in blocks, pages and pending frees: cheap enough for
  // tests and fuzzers to call after every operation. Changes nothing (a
  // free the undo fast path set aside stays set aside).
  absl::Status CheckInvariants() const;

  Device* device() const { return device_; }
  const AllocatorOptions& options() const { return options_; }

  static std::size_t RoundSize(std::size_t bytes);
  // RoundSize, with the options' power-of-two divisions.
  std::size_t RoundRequest(std::size_t bytes) const;
  // Size of the segment a request of `rounded` bytes reserves when nothing fits.
  static std::size_t SegmentSizeFor(std::size_t rounded);
  // What the pool grows by for such a request when the budget does not
  // squeeze it: its pages with expandable segments, else its usual segment.
  // (Within a tight budget a large request's segment shrinks to its own size,
  // and the next request of its kind finds no room again: room made for the
  // usual segment lasts. On the LSTM step at half its reserved peak, planning
  // for the squeezed size left every policy short of finishing.)
  std::size_t GrowthFor(std::size_t rounded) const {
    if (page_size_ != 0) return (rounded + page_size_ - 1) / page_size_ * page_size_;
    return SegmentSizeFor(rounded);
  }

 private:
  // Tests reach the private state through it, to break an invariant on
  // purpose and see CheckInvariants name it.
  friend class CachingAllocatorTestPeer;
  struct Segment;
  struct Block;
  struct Pool;
  // Free blocks: shared ones first, then each stream's private ones; within
  // each, by (size, address) for best fit.
  struct FreeKey {
    std::uintptr_t partition;  // 0: shared; otherwise the private stream's handle + 1
    std::size_t size;
    std::uintptr_t addr;
    friend bool operator<(const FreeKey& a, const FreeKey& b) {
      if (a.partition != b.partition) return a.partition < b.partition;
      if (a.size != b.size) return a.size < b.size;
      return a.addr < b.addr;
    }
  };
  static std::uintptr_t PartitionOf(Stream stream, bool shared) {
    return shared ? 0 : stream.handle + 1;
  }
  static FreeKey KeyOf(const Block* b) { return {b->partition, b->size, b->addr}; }
  struct FreeOrder {
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const { return KeyOf(a) < KeyOf(b); }
    bool operator()(const FreeKey& a, const Block* b) const { return a < KeyOf(b); }
    bool operator()(const Block* a, const FreeKey& b) const { return KeyOf(a) < b; }
  };
  // A node-based set, so that every free block keeps its position in it
  // (Block::free_pos) across other insertions and erasures: erasing a block,
  // or moving its key within its neighbours, needs no search. The nodes come
  // from a free list of their own (NodeResource), so an insertion costs no
  // call to malloc.
  using FreeSet = std::pmr::set<Block*, FreeOrder>;
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    Segment* segment = nullptr;
    Pool* pool = nullptr;   // its segment's pool (PoolOf without a branch)
    Block* prev = nullptr;  // address neighbours within the segment
    Block* next = nullptr;
    Stream stream;          // allocation stream; when free, the stream it is private to
    bool allocated = false;
    bool pending_free = false;
    bool shared = false;    // free and safe for every stream
    bool mapped = true;     // false: unmapped pages of an expandable segment (page-aligned)
    // Unback: the whole pages [unbacked_lo, unbacked_hi) of an allocated
    // block are given up; unbacked_done once they are unmapped.
    std::uintptr_t unbacked_lo = 0;
    std::uintptr_t unbacked_hi = 0;
    bool unbacked_done = false;
    std::uint64_t generation = 0;  // which allocation holds it (Reback's check)
    std::uintptr_t partition = 0;  // free-set partition, set on entering the set
    FreeSet::iterator free_pos{};  // where it is in its pool's free set, while there
    std::uint64_t free_seq = 0;
    int pending_events = 0;
    std::uint64_t owner = 0;
    absl::InlinedVector<Stream, 1> extra_streams;
  };
  struct Segment {
    std::uintptr_t addr = 0;
    std::size_t size = 0;        // the whole address range
    // A free block this size is a whole free segment; SIZE_MAX for an
    // expandable segment, which is never released whole.
    std::size_t whole_size = 0;
    bool large = false;
    bool expandable = false;
    // An expandable segment of the small pool: no block crosses a page
    // boundary, so each page fills like a fixed 2 MiB segment (see CanMerge).
    bool page_bounded = false;
    Pool* pool = nullptr;  // the pool its blocks belong to
    Stream stream;
    Block* first = nullptr;
    std::vector<PhysicalChunk> pages;  // expandable: page i's chunk (handle 0: unmapped)
  };
  struct AddrOrder {
    bool operator()(const Block* a, const Block* b) const { return a->addr < b->addr; }
  };
  struct Pool {
    explicit Pool(std::pmr::memory_resource* nodes) : free(nodes) {}
    FreeSet free;
    bool large = false;
    std::size_t shared_count = 0;
    // Unmapped blocks of the expandable segments, by address.
    absl::btree_set<Block*, AddrOrder> unmapped;
    // Sorts after every real block (partition kSentinelPartition) and never
    // leaves the set, so the tree never empties: an exact-fit alloc/free of a
    // whole segment would otherwise free and reallocate the root node each time.
    Block sentinel;
  };
  static constexpr std::uintptr_t kSentinelPartition = ~std::uintptr_t{0};
  struct PendingFree {
    Block* block;
    std::vector<Event> events;
  };
  // Lazy cross-stream hand-over: an event recorded on a stream covers every
  // block freed on it before free_seq_at_record.
  struct StreamHarvest {
    bool in_flight = false;
    Event event;
    std::uint64_t free_seq_at_record = 0;
  };

  CachingAllocator(Device* device, AllocatorOptions options);

  Pool& PoolFor(std::size_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  void RecordStepAllocation(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the allocations from here as a new step's.
  void StartStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EndStep's verdict on a step recorded whole.
  void JudgeStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a small request its own pool cannot grow for: a free block of the
  // other small pool (placement apart is a preference), or nullptr.
  Block* FindInOtherSmallPool(const Pool& pool, std::size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PoolFor, with what the last step learned (EndStep).
  Pool& PlacePoolFor(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (rounded > kSmallSize) return large_;
    if (learned_.empty()) [[likely]] return small_;
    const std::uint64_t i = allocations_made_ + 1 - step_first_generation_;
    return i < learned_.size() && learned_[i].size == rounded && learned_[i].transient
               ? transient_
               : small_;
  }
  StatPool StatPoolOf(const Pool& pool) const { return pool.large ? kLargePool : kSmallPool; }
  Pool& PoolOf(const Block* b) { return *b->pool; }

  // The best-fitting free block usable on `stream`, or nullptr.
  Block* FindFreeBlock(Pool& pool, std::size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Fits(const Block* b, std::size_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates from the free block `block`; returns the block allocated.
  Block* Commit(Block* block, std::size_t size, std::size_t requested, Stream stream,
                std::uint64_t owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks a block (out of the free set, split off) allocated: fields, the
  // live map, statistics, the trace.
  Block* HandOut(Block* block, std::size_t requested, Stream stream, std::uint64_t owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The undo fast path (see Redo in the .cc). Whether putting the freed
  // last allocation `b` back would only undo that allocation.
  bool UndoesCleanly(const Block* b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the block set aside (undone_) out again, as the full path would.
  Block* Redo(std::size_t requested, Stream stream, std::uint64_t owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the block set aside into the free set, as its free would have.
  void Settle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles, and forgets the last allocation: for every call that may change
  // the allocator's state, and wherever the lock was given back meanwhile.
  void EndUndo() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> AllocateSlow(Pool& pool, std::size_t size, std::size_t requested,
                                      Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* ReserveSegment(Pool& pool, std::size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReserveSegment, or Expand in expandable mode.
  Block* GrowPool(Pool& pool, std::size_t size, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.expandable_segments ? Expand(pool, size, stream)
                                        : ReserveSegment(pool, size, stream);
  }
  // Maps the pages a request of `size` lacks in one of the stream's
  // expandable segments (a new one when none has the address space), within
  // the budget; returns the free block that now fits, or nullptr.
  Block* Expand(Pool& pool, std::size_t size, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where Expand would map for `size`: the unmapped block to map from and
  // the pages it needs (0 when no segment has room).
  std::pair<Block*, std::size_t> FindExpansion(Pool& pool, std::size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Segment* NewExpandableSegment(Pool& pool, std::size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps the first `pages` pages of the unmapped block `u`; false (nothing
  // changed) when the device refuses.
  bool MapPages(Block* u, std::size_t pages, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps the whole pages inside free blocks of expandable segments, after
  // synchronizing the device; returns bytes unmapped.
  std::size_t UnmapFreePages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts an unmapped block into its pool's set, merged with unmapped neighbours.
  void InsertUnmapped(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps whole pages [lo, hi) of `seg`; returns the bytes unmapped (it
  // stops at the first page the device refuses).
  std::size_t UnmapPages(Segment* seg, std::uintptr_t lo, std::uintptr_t hi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps fresh pages over [lo, hi) of `seg`; false (nothing mapped) when the
  // device refuses.
  bool MapRange(Segment* seg, std::uintptr_t lo, std::uintptr_t hi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An inactive block whose middle pages were unbacked: splits off the
  // unmapped middle, and puts the mapped ends in the free set.
  void ReturnUnbacked(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes [lo, hi) of the inactive block `b` (whole pages, already unmapped)
  // an unmapped block in its pool's set, and splits off the mapped bytes
  // before and after it as inactive blocks (returned, not yet in the free set).
  std::pair<Block*, Block*> CarveUnmapped(Block* b, std::uintptr_t lo, std::uintptr_t hi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetUnbacking(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases every page and range of an expandable segment (destruction).
  void DestroyExpandable(Segment* seg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FreeLocked(void* ptr, const Stream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordUses(Block* block, const Stream* stream, std::vector<Event>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns an inactive block to its pool, private to `stream`, coalesced.
  void ReturnBlock(Block* block, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReturnBlock's first part: the freed block's fields and counters, before
  // it goes back into the free set.
  void ResetFreed(Block* block, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts an inactive block (not in the free set) into it, merged with the
  // free neighbours it may merge with.
  void InsertCoalesced(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanMerge(const Block* a, const Block* b) const;
  void InsertFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a block in the free set a new key, in place when the order allows.
  void RekeyFree(Block* b, std::uintptr_t addr, std::size_t size, Stream stream, bool shared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (+1) or removes (-1) a free block's share of the free-set counters.
  void CountFree(const Block* b, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free block of `seg` grows or shrinks: its split statistics change.
  void CountResize(const Segment* seg, std::size_t old_size, std::size_t new_size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes pending frees whose events are done (all of them when `wait`).
  void ProcessPendingFrees(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes streams' freed blocks shared once events behind them complete: every
  // stream but `requester` (which may use its own blocks already), or every
  // stream when `requester` is null. With `wait`, blocks until they complete.
  void HarvestStreams(const Stream* requester, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ShareBlocksOf(Stream stream, std::uint64_t before_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases whole free segments; returns bytes released.
  std::size_t ReleaseCachedSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Event> TakeEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordTrace(TraceAction action, std::uintptr_t addr, std::size_t size,
                   std::size_t requested, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeBadPointer(const void* ptr, const char* op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string OomMessage(std::size_t requested, std::size_t size, Stream stream) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInvariantsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The statistics with active and active_bytes filled in (see pending_stats_).
  AllocatorStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free of `bytes` in pool `sp` starts (+1) or stops (-1) pending.
  void CountPending(StatPool sp, int sign, std::int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An allocation made while frees are pending: active may pass its peak.
  void NotePendingPeak(StatPool sp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* NewBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteBlock(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* NewBlockChunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Device* const device_;
  const std::size_t device_capacity_;
  const AllocatorOptions options_;

  mutable Mutex mu_;
  std::size_t budget_ ABSL_GUARDED_BY(mu_);
  // options_.max_split_size until SetMaxSplitSize.
  std::size_t max_split_size_ ABSL_GUARDED_BY(mu_);
  const std::size_t page_size_;
  const bool round_divisions_;  // some roundup_divisions entry is above 1
  // Bytes segments being reserved without the lock will add (budget checks count them).
  std::size_t reserving_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t allocations_made_ ABSL_GUARDED_BY(mu_) = 0;  // blocks handed out (generations)
  // The most bytes ever reserved: expandable segments pass it only after
  // unmapping the free pages they cache.
  std::size_t reserved_high_water_ ABSL_GUARDED_BY(mu_) = 0;
  // Reserved bytes the last SetBudget left above a lowered budget (it keeps
  // what is live); no growth passes the budget, so reserved never passes
  // the larger of the two (CheckInvariants).
  std::size_t reserved_at_budget_change_ ABSL_GUARDED_BY(mu_) = 0;
  // The free sets' nodes (declared first: destroyed after the sets).
  NodeResource free_nodes_;
  Pool small_ ABSL_GUARDED_BY(mu_){&free_nodes_};
  Pool large_ ABSL_GUARDED_BY(mu_){&free_nodes_};
  // Small blocks the last step did not hold at its peak (EndStep).
  Pool transient_ ABSL_GUARDED_BY(mu_){&free_nodes_};
  // The step being recorded (BeginStep): each allocation's rounded size and
  // when (on the step's clock of allocations and frees) it was made and
  // freed; the clock at the step's peak of allocated bytes.
  struct StepAllocation {
    std::size_t size = 0;
    std::uint32_t made = 0;  // (the clock stays under 2 x kMaxStepAllocations)
    std::uint32_t freed = std::numeric_limits<std::uint32_t>::max();
  };
  bool recording_step_ ABSL_GUARDED_BY(mu_) = false;
  bool step_too_long_ ABSL_GUARDED_BY(mu_) = false;
  std::int64_t step_ooms_at_start_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<StepAllocation> step_allocations_ ABSL_GUARDED_BY(mu_);
  std::uint64_t step_first_generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::uint32_t step_clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t step_peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint32_t step_peak_at_ ABSL_GUARDED_BY(mu_) = 0;
  struct Learned {
    std::size_t size = 0;
    bool transient = false;  // not live at the step's peak
    // Placed apart in the next step: small (a large block goes to the large pool).
    bool apart() const { return transient && size <= kSmallSize; }
  };
  std::vector<Learned> learned_ ABSL_GUARDED_BY(mu_);
  // The trial of the learned placement against the plain one: the reserved
  // peak of the last step placed plainly, of the step being recorded, and
  // whether steps place by what they learn (kTrying: the next step is the
  // first; kKept: one did reserve less; kRefused: one did not).
  enum class Placement : std::uint8_t { kPlain, kTrying, kKept, kRefused };
  Placement placement_ ABSL_GUARDED_BY(mu_) = Placement::kPlain;
  std::size_t plain_step_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t step_reserved_peak_ ABSL_GUARDED_BY(mu_) = 0;
  AddressMap<Block> live_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<std::uintptr_t, Segment*> segments_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingFree> pending_frees_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Stream, StreamHarvest> harvest_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> spare_events_ ABSL_GUARDED_BY(mu_);
  std::vector<Block*> spare_blocks_ ABSL_GUARDED_BY(mu_);
  // Every Block's storage (NewBlockChunk); freed with the allocator.
  std::vector<std::unique_ptr<Block[]>> block_chunks_ ABSL_GUARDED_BY(mu_);
  std::size_t block_chunk_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t next_free_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // The undo fast path: the block the last call allocated from the free set
  // directly (nullptr after any other call), its request's rounded size, and
  // whether that allocation split a free block (whose rest follows it); and
  // a block its free set aside, not yet in the free set.
  Block* last_alloc_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::size_t last_alloc_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool last_alloc_split_ ABSL_GUARDED_BY(mu_) = false;
  Block* undone_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::uint64_t redone_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped whenever memory becomes free, so a slow path that released the
  // lock knows whether someone else freed memory meanwhile.
  std::uint64_t free_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Free blocks spanning a whole segment (what ReleaseCachedSegments can give back).
  std::size_t whole_free_segments_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of the whole pages inside free blocks of expandable segments
  // (what UnmapFreePages can give back).
  std::size_t free_page_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks Unback gave up whose pages are still mapped.
  std::vector<Block*> unbacking_ ABSL_GUARDED_BY(mu_);
  // stats_.active and stats_.active_bytes are not counted as blocks come and
  // go: a block is active while allocated or pending free, so active is
  // allocation plus the frees still pending, filled in by StatsLocked. The
  // hot path counts allocation alone; the pending few are counted here.
  // Frees still pending, as counts (of blocks) or bytes, per StatPool (the
  // aggregate, the small pool, the large pool).
  struct PendingStat {
    std::array<std::int64_t, 3> current{};
    // Active's peak where it passed allocation's (while frees were pending),
    // or active as it was at the last peak reset.
    std::array<std::int64_t, 3> peak{};
    // Pending frees at the last reset of the accumulated totals.
    std::array<std::int64_t, 3> base{};

    void Add(StatPool sp, std::int64_t delta);
    // active = allocation + pending; `from` is allocation's Stat array.
    void NotePeak(StatPool sp, const StatArray& from);
    void ResetPeak(const StatArray& from);
    void Derive(const StatArray& from, StatArray* active) const;
  };
  struct PendingFreeStats {
    PendingStat count;
    PendingStat bytes;
  };
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  PendingFreeStats pending_stats_ ABSL_GUARDED_BY(mu_);
  std::vector<TraceEvent> ring_ ABSL_GUARDED_BY(mu_);
  std::size_t ring_next_ ABSL_GUARDED_BY(mu_) = 0;  // where the next event goes
  std::size_t ring_size_ ABSL_GUARDED_BY(mu_) = 0;  // events held (at most ring_.size())
  // Shared so a call in progress (made without the lock) survives a replacement.
  std::shared_ptr<PressureHandler> pressure_handler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace remat

#endif  // REMAT_ALLOCATOR_CACHING_ALLOCATOR_H_
