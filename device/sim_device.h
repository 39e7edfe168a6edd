// SimDevice: a GPU that runs anywhere, with deterministic time.
//
// Memory. In backed mode every segment is real host memory (mmap'd lazily, so
// a large capacity costs only what is touched) and copies move real bytes:
// correctness tests check that evicted data comes back intact. In unbacked mode
// segments are address ranges only and copies move nothing: an 80 GB training
// trace replays on a laptop. Unbacked pointers must never be dereferenced.
//
// Time. The host has a virtual clock and every stream a virtual completion
// time. Work enqueued on a stream starts when both the stream's previous work
// and the host have reached that point, and takes its cost: a copy costs
// latency + bytes / bandwidth, host work costs what its caller says. Events
// capture a stream's completion time. The host clock advances only when the
// host waits (Synchronize*, or AdvanceHost), so queries are deterministic: an
// event recorded behind pending work stays incomplete until the host waits.
// Enqueued copies and host functions execute when the host clock passes their
// completion time, in completion order; a bug that reuses memory before a copy
// out of it has completed therefore corrupts the copy, as it would on a GPU.
#ifndef REMAT_DEVICE_SIM_DEVICE_H_
#define REMAT_DEVICE_SIM_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "base/units.h"
#include "device/device.h"

namespace remat {

struct SimCostModel {
  double host_to_device_gbps = 25.0;   // 1e9 bytes per second
  double device_to_host_gbps = 25.0;
  double device_to_device_gbps = 1500.0;
  std::int64_t copy_latency_ns = 2000;
  // One copy engine per direction, as on a GPU: host-to-device copies run one
  // after another whatever stream issued them, and so do device-to-host
  // copies, each at its direction's rate; the two directions run at the same
  // time. (Several copies of one direction in flight share the link's
  // bandwidth; running them in turn ends the last one at the same time.)
  // false: every stream copies on its own, at the full rate (no contention).
  bool copy_engines = true;

  std::int64_t CopyNs(std::size_t bytes, CopyKind kind) const;
};

struct SimDeviceOptions {
  std::size_t capacity = 80 * kGiB;
  // Real bytes behind every pointer (for correctness tests) or addresses only.
  bool backed = false;
  // Pinned host memory the device will hand out (beyond it AllocateHost fails).
  std::size_t host_capacity = kTiB;
  SimCostModel cost;
  // Unbacked: which of the disjoint device address windows (each four times
  // the capacity) it hands out device addresses from. Devices alive at once
  // in one process (one per GPU index) take different windows, so that no
  // device address is ever handed out by two of them (pinned host addresses
  // may coincide: they stand for the one host). Create refuses a window that
  // does not fit the simulated address space.
  int address_window = 0;
  // false: the device takes no lock, and only one thread may ever use it
  // (the simulator's replays, which own their device).
  bool thread_safe = true;
};

class SimDevice final : public Device {
 public:
  // The largest capacity an unbacked device can address.
  static constexpr std::size_t kMaxCapacity = 16 * kTiB;

  // Fails on a zero capacity or one beyond kMaxCapacity.
  static absl::StatusOr<std::unique_ptr<SimDevice>> Create(SimDeviceOptions options = {});
  ~SimDevice() override;

  std::string Describe() const override;
  std::size_t Capacity() const override { return options_.capacity; }
  std::size_t FreeBytes() const override;
  std::int64_t NowNs() const override;

  absl::StatusOr<void*> ReserveSegment(std::size_t bytes) override;
  absl::Status ReleaseSegment(void* ptr) override;
  absl::StatusOr<void*> AllocateHost(std::size_t bytes) override;
  absl::Status FreeHost(void* ptr) override;

  absl::StatusOr<Stream> CreateStream() override;
  absl::Status DestroyStream(Stream stream) override;
  absl::StatusOr<Event> CreateEvent() override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::Status Synchronize() override;

  absl::Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                         Stream stream) override;
  absl::Status LaunchHostFunc(Stream stream, absl::AnyInvocable<void() &&> fn,
                              std::int64_t cost_ns = 0) override;

  // Virtual memory with 2 MiB pages. Address ranges come from the device's
  // window (unbacked) or from host address space reserved with no access
  // (backed: a device or host read of an unmapped or inaccessible page is an
  // error from CopyAsync, and a fault from the CPU). Chunks count against the
  // capacity; a chunk's bytes are not kept once it is unmapped, and a chunk
  // is released only unmapped (stricter than CUDA, which defers the free).
  static constexpr std::size_t kPageSize = 2 * kMiB;
  std::size_t PageSize() const override { return kPageSize; }
  absl::StatusOr<void*> ReserveAddressRange(std::size_t bytes) override;
  absl::Status ReleaseAddressRange(void* ptr) override;
  absl::StatusOr<PhysicalChunk> CreateChunk(std::size_t bytes) override;
  absl::Status ReleaseChunk(PhysicalChunk chunk) override;
  absl::Status Map(void* ptr, PhysicalChunk chunk) override;
  absl::Status SetAccess(void* ptr, std::size_t bytes) override;
  absl::Status Unmap(void* ptr, std::size_t bytes) override;
  // Bytes mapped with access, and physical chunks alive (mapped or not).
  std::size_t MappedBytes() const;
  std::size_t num_chunks() const;

  // Keeps `stream` busy for `cost_ns` after its work so far, with nothing to
  // run: LaunchHostFunc of an empty function, without queueing one (what a
  // simulated kernel that touches no bytes costs).
  absl::Status Occupy(Stream stream, std::int64_t cost_ns);

  // --- Simulation controls and observations ---
  bool backed() const { return options_.backed; }
  // Copies and host functions enqueued and not yet run (they run when the
  // host clock passes their completion: when the host waits).
  std::size_t PendingWork() const;
  const SimCostModel& cost_model() const { return options_.cost; }
  // Lets host time pass (work the host does between calls), running whatever
  // device work completes meanwhile.
  void AdvanceHost(std::int64_t ns);
  // Completion time of everything enqueued on the stream so far.
  absl::StatusOr<std::int64_t> StreamTimeNs(Stream stream) const;
  std::size_t ReservedBytes() const;
  std::size_t num_segments() const;
  std::uint64_t copied_bytes(CopyKind kind) const;
  // Fault injection for tests: the next `count` CopyAsync calls fail with
  // Internal (as a copy on a faulted GPU would) and enqueue nothing.
  void FailNextCopies(int count);
  // Likewise the next `count` StreamWaitEvent calls (the stream waits for nothing).
  void FailNextWaits(int count);
  // Fault injection for tests of byte checks: in backed mode, the next
  // `count` host-to-device copies deliver their bytes with the first one
  // flipped, as a faulty link would.
  void CorruptNextCopiesIn(int count);

 private:
  // Address ranges handed out first-fit from a fixed window.
  class AddressSpace {
   public:
    AddressSpace(std::uintptr_t base, std::size_t size);
    std::uintptr_t Take(std::size_t bytes);  // 0 when no range is large enough
    void Give(std::uintptr_t addr, std::size_t bytes);

   private:
    std::map<std::uintptr_t, std::size_t> free_;  // start -> length
  };

  struct PendingOp {
    std::int64_t end_ns;
    std::uint64_t seq;
    absl::AnyInvocable<void() &&> run;
  };
  struct LaterFirst {
    bool operator()(const PendingOp& a, const PendingOp& b) const {
      return a.end_ns != b.end_ns ? a.end_ns > b.end_ns : a.seq > b.seq;
    }
  };
  struct EventState {
    bool recorded = false;
    std::int64_t time_ns = 0;
  };
  struct Chunk {
    std::size_t bytes = 0;
    std::uintptr_t mapped_at = 0;  // 0: not mapped
  };
  struct Mapping {
    std::size_t bytes = 0;
    std::uintptr_t chunk = 0;
    bool access = false;
  };

  explicit SimDevice(SimDeviceOptions options);

  // Moves the host clock to `t` (never backwards) and runs completed work.
  void AdvanceTo(std::int64_t t) ABSL_LOCKS_EXCLUDED(mu_, exec_mu_);
  // Appends `cost_ns` of work to the stream; returns its completion time.
  // `not_before_ns`: the work cannot start earlier (a busy copy engine).
  std::int64_t EnqueueLocked(std::int64_t* stream_time, std::int64_t cost_ns,
                             std::int64_t not_before_ns = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::int64_t*> StreamTimeLocked(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckDeviceRangeLocked(const void* ptr, std::size_t bytes, const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether [addr, addr + bytes) is exactly a run of whole, adjacent mappings.
  bool IsRunOfMappingsLocked(std::uintptr_t addr, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether [addr, addr + bytes) is covered by contiguous accessible mappings.
  bool MappedWithAccessLocked(std::uintptr_t addr, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reserved range holding [addr, addr + bytes), or vm_ranges_.end().
  std::map<std::uintptr_t, std::size_t>::const_iterator VmRangeOfLocked(std::uintptr_t addr,
                                                                        std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimDeviceOptions options_;

  mutable Mutex mu_;
  Mutex exec_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serializes execution of completed work
  // Written under mu_; read without it by NowNs, which the allocator calls to
  // time-stamp every event and should not cost a lock.
  std::atomic<std::int64_t> host_now_ns_{0};
  absl::flat_hash_map<std::uintptr_t, std::int64_t> stream_time_ ABSL_GUARDED_BY(mu_);
  std::uintptr_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::uintptr_t, EventState> events_ ABSL_GUARDED_BY(mu_);
  std::uintptr_t next_event_ ABSL_GUARDED_BY(mu_) = 1;
  std::priority_queue<PendingOp, std::vector<PendingOp>, LaterFirst> pending_ ABSL_GUARDED_BY(mu_);
  std::uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t running_end_ns_ ABSL_GUARDED_BY(mu_) = -1;  // op being executed, if any
  int copies_to_fail_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_in_to_corrupt_ ABSL_GUARDED_BY(mu_) = 0;
  int waits_to_fail_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t busy_until_ns_ ABSL_GUARDED_BY(mu_) = 0;    // latest completion ever queued
  // When each copy engine finishes what it was given ([0] host to device,
  // [1] device to host); see SimCostModel::copy_engines.
  std::int64_t engine_free_at_ns_[2] ABSL_GUARDED_BY(mu_) = {0, 0};

  AddressSpace device_space_ ABSL_GUARDED_BY(mu_);
  AddressSpace host_space_ ABSL_GUARDED_BY(mu_);
  std::map<std::uintptr_t, std::size_t> segments_ ABSL_GUARDED_BY(mu_);  // start -> bytes
  absl::flat_hash_map<std::uintptr_t, std::size_t> host_blocks_ ABSL_GUARDED_BY(mu_);
  std::map<std::uintptr_t, std::size_t> vm_ranges_ ABSL_GUARDED_BY(mu_);  // start -> bytes
  absl::flat_hash_map<std::uintptr_t, Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  std::uintptr_t next_chunk_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::uintptr_t, Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // start -> mapping
  std::size_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Segments and chunks alike: what the capacity is charged.
  std::size_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t host_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t copied_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
};

}  // namespace remat

#endif  // REMAT_DEVICE_SIM_DEVICE_H_
