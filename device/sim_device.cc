#include "device/sim_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace remat {
namespace {

// Unbacked address windows: far from anything the host maps, below 2^47.
constexpr std::uintptr_t kDeviceBase = std::uintptr_t{0x1000} << 32;  // 16 TiB
constexpr std::uintptr_t kHostBase = std::uintptr_t{0x6000} << 32;    // 96 TiB
constexpr std::size_t kGranule = 512;  // every unbacked range is aligned to this

std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// A device's unbacked address window: four times its capacity, so that
// address-space fragmentation never refuses what the capacity allows.
std::uintptr_t DeviceWindowBytes(const SimDeviceOptions& o) {
  return 4 * RoundUp(o.capacity, kGranule);
}
std::uintptr_t DeviceWindowBase(const SimDeviceOptions& o) {
  return kDeviceBase + static_cast<std::uintptr_t>(o.address_window) * DeviceWindowBytes(o);
}

void* MapBytes(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

const char* CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return "host-to-device";
    case CopyKind::kDeviceToHost: return "device-to-host";
    case CopyKind::kDeviceToDevice: return "device-to-device";
  }
  return "?";
}

}  // namespace

std::int64_t SimCostModel::CopyNs(std::size_t bytes, CopyKind kind) const {
  double gbps = device_to_device_gbps;
  if (kind == CopyKind::kHostToDevice) gbps = host_to_device_gbps;
  if (kind == CopyKind::kDeviceToHost) gbps = device_to_host_gbps;
  return copy_latency_ns + static_cast<std::int64_t>(static_cast<double>(bytes) / gbps);
}

SimDevice::AddressSpace::AddressSpace(std::uintptr_t base, std::size_t size) {
  free_.emplace(base, size);
}

std::uintptr_t SimDevice::AddressSpace::Take(std::size_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::uintptr_t addr = it->first;
    const std::size_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_.emplace(addr + bytes, rest);
    return addr;
  }
  return 0;
}

void SimDevice::AddressSpace::Give(std::uintptr_t addr, std::size_t bytes) {
  auto next = free_.lower_bound(addr);
  if (next != free_.end() && addr + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      prev->second += bytes;
      return;
    }
  }
  free_.emplace(addr, bytes);
}

absl::StatusOr<std::unique_ptr<SimDevice>> SimDevice::Create(SimDeviceOptions options) {
  if (options.capacity == 0 || options.capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SimDevice capacity must be between 1 byte and %s, not %d bytes",
        FormatBytes(kMaxCapacity), options.capacity));
  }
  if (options.host_capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SimDevice host capacity must be at most %s", FormatBytes(kMaxCapacity)));
  }
  const std::uintptr_t windows = (kHostBase - kDeviceBase) / DeviceWindowBytes(options);
  if (options.address_window < 0 || static_cast<std::uintptr_t>(options.address_window) >= windows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SimDevice address window %d does not fit a device of %s (the simulated device address "
        "space holds %d such windows)",
        options.address_window, FormatBytes(options.capacity), windows));
  }
  const SimCostModel& c = options.cost;
  if (!(c.host_to_device_gbps > 0) || !(c.device_to_host_gbps > 0) ||
      !(c.device_to_device_gbps > 0) || c.copy_latency_ns < 0) {
    return absl::InvalidArgumentError("SimDevice bandwidths must be positive, latency >= 0");
  }
  return std::unique_ptr<SimDevice>(new SimDevice(options));
}

SimDevice::SimDevice(SimDeviceOptions options)
    : options_(options),
      mu_(options.thread_safe),
      exec_mu_(options.thread_safe),
      // Address windows larger than the capacity, so that address-space
      // fragmentation never refuses what the capacity allows (GPUs map
      // physical pages into a virtual space far larger than memory).
      device_space_(DeviceWindowBase(options), DeviceWindowBytes(options)),
      host_space_(kHostBase, 4 * RoundUp(std::max<std::size_t>(options.host_capacity, 1), kGranule)) {
  stream_time_.emplace(kDefaultStream.handle, 0);
}

SimDevice::~SimDevice() {
  AdvanceTo(INT64_MAX / 2);  // run what is still queued; nothing may outlive us
  MutexLock lock(&mu_);
  if (options_.backed) {
    for (const auto& [addr, bytes] : segments_) munmap(reinterpret_cast<void*>(addr), bytes);
    for (const auto& [addr, bytes] : host_blocks_) munmap(reinterpret_cast<void*>(addr), bytes);
    for (const auto& [addr, bytes] : vm_ranges_) munmap(reinterpret_cast<void*>(addr), bytes);
  }
}

std::string SimDevice::Describe() const {
  return absl::StrFormat("sim (%s, %s)", options_.backed ? "backed" : "unbacked",
                         FormatBytes(options_.capacity));
}

std::size_t SimDevice::FreeBytes() const {
  MutexLock lock(&mu_);
  return options_.capacity - reserved_bytes_;
}

std::int64_t SimDevice::NowNs() const { return host_now_ns_.load(std::memory_order_acquire); }

std::size_t SimDevice::ReservedBytes() const {
  MutexLock lock(&mu_);
  return reserved_bytes_;
}

std::size_t SimDevice::num_segments() const {
  MutexLock lock(&mu_);
  return segments_.size();
}

std::uint64_t SimDevice::copied_bytes(CopyKind kind) const {
  MutexLock lock(&mu_);
  return copied_[static_cast<int>(kind)];
}

absl::StatusOr<void*> SimDevice::ReserveSegment(std::size_t bytes) {
  MutexLock lock(&mu_);
  if (bytes == 0) return absl::InvalidArgumentError("ReserveSegment of 0 bytes");
  if (bytes > options_.capacity - reserved_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot reserve %s; %s of %s already reserved", Describe(), FormatBytes(bytes),
        FormatBytes(reserved_bytes_), FormatBytes(options_.capacity)));
  }
  std::uintptr_t addr = 0;
  if (options_.backed) {
    addr = reinterpret_cast<std::uintptr_t>(MapBytes(bytes));
  } else {
    addr = device_space_.Take(RoundUp(bytes, kGranule));
  }
  if (addr == 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: no address range for %s", Describe(), FormatBytes(bytes)));
  }
  segments_.emplace(addr, bytes);
  reserved_bytes_ += bytes;
  return reinterpret_cast<void*>(addr);
}

absl::Status SimDevice::ReleaseSegment(void* ptr) {
  (void)Synchronize();  // as cudaFree does; it cannot fail here
  MutexLock lock(&mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.find(addr);
  if (it == segments_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReleaseSegment(%p): not a segment of %s", ptr, Describe()));
  }
  const std::size_t bytes = it->second;
  segments_.erase(it);
  reserved_bytes_ -= bytes;
  if (options_.backed) {
    munmap(ptr, bytes);
  } else {
    device_space_.Give(addr, RoundUp(bytes, kGranule));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Virtual memory

absl::StatusOr<void*> SimDevice::ReserveAddressRange(std::size_t bytes) {
  MutexLock lock(&mu_);
  if (bytes == 0 || bytes % kPageSize != 0 || bytes > kMaxCapacity * 64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReserveAddressRange of %d bytes: the size must be a positive multiple of the %s page, "
        "at most %s",
        bytes, FormatBytes(kPageSize), FormatBytes(kMaxCapacity * 64)));
  }
  std::uintptr_t addr = 0;
  if (options_.backed) {
    // Host address space with no access, aligned to the page as CUDA's is.
    void* p = mmap(nullptr, bytes + kPageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p != MAP_FAILED) {
      const auto raw = reinterpret_cast<std::uintptr_t>(p);
      addr = RoundUp(raw, kPageSize);
      if (addr > raw) munmap(p, addr - raw);
      const std::uintptr_t end = raw + bytes + kPageSize;
      if (end > addr + bytes) munmap(reinterpret_cast<void*>(addr + bytes), end - (addr + bytes));
    }
  } else {
    // Take page-aligned space: the window's base is aligned, so over-take and give back the slack.
    const std::uintptr_t raw = device_space_.Take(bytes + kPageSize);
    if (raw != 0) {
      addr = RoundUp(raw, kPageSize);
      if (addr > raw) device_space_.Give(raw, addr - raw);
      const std::uintptr_t end = raw + bytes + kPageSize;
      if (end > addr + bytes) device_space_.Give(addr + bytes, end - (addr + bytes));
    }
  }
  if (addr == 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: no address range of %s", Describe(), FormatBytes(bytes)));
  }
  vm_ranges_.emplace(addr, bytes);
  return reinterpret_cast<void*>(addr);
}

absl::Status SimDevice::ReleaseAddressRange(void* ptr) {
  MutexLock lock(&mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = vm_ranges_.find(addr);
  if (it == vm_ranges_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReleaseAddressRange(%p): not an address range of %s", ptr, Describe()));
  }
  const std::size_t bytes = it->second;
  auto m = mappings_.lower_bound(addr);
  if (m != mappings_.end() && m->first < addr + bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReleaseAddressRange(%p): %#x is still mapped; unmap first", ptr, m->first));
  }
  vm_ranges_.erase(it);
  if (options_.backed) {
    munmap(ptr, bytes);
  } else {
    device_space_.Give(addr, bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<PhysicalChunk> SimDevice::CreateChunk(std::size_t bytes) {
  MutexLock lock(&mu_);
  if (bytes == 0 || bytes % kPageSize != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CreateChunk of %d bytes: the size must be a positive multiple of the %s page", bytes,
        FormatBytes(kPageSize)));
  }
  if (bytes > options_.capacity - reserved_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot create a chunk of %s; %s of %s already in use", Describe(), FormatBytes(bytes),
        FormatBytes(reserved_bytes_), FormatBytes(options_.capacity)));
  }
  const PhysicalChunk chunk{next_chunk_++};
  chunks_.emplace(chunk.handle, Chunk{bytes, 0});
  reserved_bytes_ += bytes;
  return chunk;
}

absl::Status SimDevice::ReleaseChunk(PhysicalChunk chunk) {
  MutexLock lock(&mu_);
  auto it = chunks_.find(chunk.handle);
  if (it == chunks_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReleaseChunk(%d): not a chunk of %s", chunk.handle, Describe()));
  }
  if (it->second.mapped_at != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReleaseChunk(%d): still mapped at %#x; unmap first", chunk.handle, it->second.mapped_at));
  }
  reserved_bytes_ -= it->second.bytes;
  chunks_.erase(it);
  return absl::OkStatus();
}

std::map<std::uintptr_t, std::size_t>::const_iterator SimDevice::VmRangeOfLocked(
    std::uintptr_t addr, std::size_t bytes) const {
  auto it = vm_ranges_.upper_bound(addr);
  if (it == vm_ranges_.begin()) return vm_ranges_.end();
  --it;
  if (addr - it->first >= it->second || bytes > it->second - (addr - it->first)) {
    return vm_ranges_.end();
  }
  return it;
}

absl::Status SimDevice::Map(void* ptr, PhysicalChunk chunk) {
  MutexLock lock(&mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto c = chunks_.find(chunk.handle);
  if (c == chunks_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Map(%p, chunk %d): not a chunk of %s", ptr, chunk.handle, Describe()));
  }
  if (c->second.mapped_at != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Map(%p, chunk %d): the chunk is mapped at %#x already", ptr, chunk.handle,
        c->second.mapped_at));
  }
  const std::size_t bytes = c->second.bytes;
  if (addr % kPageSize != 0 || VmRangeOfLocked(addr, bytes) == vm_ranges_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Map(%p, %s): not a page-aligned place inside a reserved address range of %s", ptr,
        FormatBytes(bytes), Describe()));
  }
  auto next = mappings_.lower_bound(addr);
  const bool overlaps_next = next != mappings_.end() && next->first < addr + bytes;
  const bool overlaps_prev =
      next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > addr;
  if (overlaps_next || overlaps_prev) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Map(%p, %s): part of the range is mapped already", ptr, FormatBytes(bytes)));
  }
  mappings_.emplace(addr, Mapping{bytes, chunk.handle, false});
  c->second.mapped_at = addr;
  return absl::OkStatus();
}

bool SimDevice::IsRunOfMappingsLocked(std::uintptr_t addr, std::size_t bytes) const {
  std::uintptr_t at = addr;
  auto m = mappings_.find(addr);
  while (at < addr + bytes && m != mappings_.end() && m->first == at) {
    at += m->second.bytes;
    ++m;
  }
  return bytes != 0 && at == addr + bytes;
}

absl::Status SimDevice::SetAccess(void* ptr, std::size_t bytes) {
  MutexLock lock(&mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!IsRunOfMappingsLocked(addr, bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SetAccess(%p, %d): the range is not exactly a run of mappings on %s", ptr, bytes,
        Describe()));
  }
  for (auto m = mappings_.find(addr); m != mappings_.end() && m->first < addr + bytes; ++m) {
    if (!m->second.access) mapped_bytes_ += m->second.bytes;
    m->second.access = true;
  }
  if (options_.backed && mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) {
    return absl::InternalError(absl::StrFormat("SetAccess(%p): mprotect failed", ptr));
  }
  return absl::OkStatus();
}

absl::Status SimDevice::Unmap(void* ptr, std::size_t bytes) {
  MutexLock lock(&mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (!IsRunOfMappingsLocked(addr, bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Unmap(%p, %d): the range is not exactly a run of whole mappings on %s", ptr, bytes,
        Describe()));
  }
  for (auto m = mappings_.find(addr); m != mappings_.end() && m->first < addr + bytes;) {
    if (m->second.access) mapped_bytes_ -= m->second.bytes;
    chunks_[m->second.chunk].mapped_at = 0;
    m = mappings_.erase(m);
  }
  if (options_.backed) {
    // The bytes go with the mapping, and the pages fault again.
    madvise(ptr, bytes, MADV_DONTNEED);
    mprotect(ptr, bytes, PROT_NONE);
  }
  return absl::OkStatus();
}

std::size_t SimDevice::MappedBytes() const {
  MutexLock lock(&mu_);
  return mapped_bytes_;
}

std::size_t SimDevice::num_chunks() const {
  MutexLock lock(&mu_);
  return chunks_.size();
}

bool SimDevice::MappedWithAccessLocked(std::uintptr_t addr, std::size_t bytes) const {
  auto m = mappings_.upper_bound(addr);
  if (m == mappings_.begin()) return false;
  --m;
  std::uintptr_t at = addr;
  while (m != mappings_.end() && m->first <= at && at < m->first + m->second.bytes &&
         m->second.access) {
    at = m->first + m->second.bytes;
    if (at >= addr + bytes) return true;
    ++m;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Pinned host memory

absl::StatusOr<void*> SimDevice::AllocateHost(std::size_t bytes) {
  MutexLock lock(&mu_);
  if (bytes == 0) return absl::InvalidArgumentError("AllocateHost of 0 bytes");
  if (bytes > options_.host_capacity - host_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot allocate %s of pinned host memory; %s of %s in use", Describe(),
        FormatBytes(bytes), FormatBytes(host_bytes_), FormatBytes(options_.host_capacity)));
  }
  std::uintptr_t addr = options_.backed ? reinterpret_cast<std::uintptr_t>(MapBytes(bytes))
                                        : host_space_.Take(RoundUp(bytes, kGranule));
  if (addr == 0) return absl::ResourceExhaustedError("SimDevice: out of host address space");
  host_blocks_.emplace(addr, bytes);
  host_bytes_ += bytes;
  return reinterpret_cast<void*>(addr);
}

absl::Status SimDevice::FreeHost(void* ptr) {
  MutexLock lock(&mu_);
  auto it = host_blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == host_blocks_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FreeHost(%p): not pinned host memory of %s", ptr, Describe()));
  }
  if (options_.backed) {
    munmap(ptr, it->second);
  } else {
    host_space_.Give(it->first, RoundUp(it->second, kGranule));
  }
  host_bytes_ -= it->second;
  host_blocks_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<Stream> SimDevice::CreateStream() {
  MutexLock lock(&mu_);
  const Stream stream{next_stream_++};
  // A new stream starts at the host's present, not in the past.
  stream_time_.emplace(stream.handle, host_now_ns_.load(std::memory_order_relaxed));
  return stream;
}

absl::Status SimDevice::DestroyStream(Stream stream) {
  MutexLock lock(&mu_);
  if (stream == kDefaultStream) return absl::InvalidArgumentError("cannot destroy the default stream");
  if (stream_time_.erase(stream.handle) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown stream %d", stream.handle));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::int64_t*> SimDevice::StreamTimeLocked(Stream stream) {
  auto it = stream_time_.find(stream.handle);
  if (it == stream_time_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown stream %d on %s", stream.handle, Describe()));
  }
  return &it->second;
}

absl::StatusOr<std::int64_t> SimDevice::StreamTimeNs(Stream stream) const {
  MutexLock lock(&mu_);
  auto it = stream_time_.find(stream.handle);
  if (it == stream_time_.end()) return absl::InvalidArgumentError("unknown stream");
  return it->second;
}

absl::StatusOr<Event> SimDevice::CreateEvent() {
  MutexLock lock(&mu_);
  const Event event{next_event_++};
  events_.emplace(event.handle, EventState{});
  return event;
}

absl::Status SimDevice::DestroyEvent(Event event) {
  MutexLock lock(&mu_);
  if (events_.erase(event.handle) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown event %d", event.handle));
  }
  return absl::OkStatus();
}

absl::Status SimDevice::RecordEvent(Event event, Stream stream) {
  MutexLock lock(&mu_);
  auto it = events_.find(event.handle);
  if (it == events_.end()) return absl::InvalidArgumentError("RecordEvent: unknown event");
  std::int64_t* stream_time;
  REMAT_ASSIGN_OR_RETURN(stream_time, StreamTimeLocked(stream));
  it->second.recorded = true;
  it->second.time_ns = std::max(*stream_time, host_now_ns_.load(std::memory_order_relaxed));
  return absl::OkStatus();
}

absl::StatusOr<bool> SimDevice::QueryEvent(Event event) {
  MutexLock lock(&mu_);
  auto it = events_.find(event.handle);
  if (it == events_.end()) return absl::InvalidArgumentError("QueryEvent: unknown event");
  if (!it->second.recorded) return true;
  const std::int64_t t = it->second.time_ns;
  if (t > host_now_ns_.load(std::memory_order_relaxed)) return false;
  // The host clock may have passed `t` while another thread is still running
  // the work that completes by then: the event is done only once that has run.
  if (!pending_.empty() && pending_.top().end_ns <= t) return false;
  return running_end_ns_ < 0 || running_end_ns_ > t;
}

absl::Status SimDevice::StreamWaitEvent(Stream stream, Event event) {
  MutexLock lock(&mu_);
  if (waits_to_fail_ > 0) {
    --waits_to_fail_;
    return absl::InternalError(absl::StrFormat("%s: injected fault in a stream wait", Describe()));
  }
  auto it = events_.find(event.handle);
  if (it == events_.end()) return absl::InvalidArgumentError("StreamWaitEvent: unknown event");
  std::int64_t* stream_time;
  REMAT_ASSIGN_OR_RETURN(stream_time, StreamTimeLocked(stream));
  if (it->second.recorded) *stream_time = std::max(*stream_time, it->second.time_ns);
  return absl::OkStatus();
}

absl::Status SimDevice::SynchronizeEvent(Event event) {
  std::int64_t t = 0;
  {
    MutexLock lock(&mu_);
    auto it = events_.find(event.handle);
    if (it == events_.end()) return absl::InvalidArgumentError("SynchronizeEvent: unknown event");
    if (it->second.recorded) t = it->second.time_ns;
  }
  AdvanceTo(t);
  return absl::OkStatus();
}

absl::Status SimDevice::SynchronizeStream(Stream stream) {
  std::int64_t t = 0;
  {
    MutexLock lock(&mu_);
    std::int64_t* stream_time;
    REMAT_ASSIGN_OR_RETURN(stream_time, StreamTimeLocked(stream));
    t = *stream_time;
  }
  AdvanceTo(t);
  return absl::OkStatus();
}

absl::Status SimDevice::Synchronize() {
  std::int64_t t = 0;
  {
    MutexLock lock(&mu_);
    // Work of streams destroyed since is still queued: wait for it too.
    t = busy_until_ns_;
    for (const auto& [handle, time] : stream_time_) t = std::max(t, time);
  }
  AdvanceTo(t);
  return absl::OkStatus();
}

void SimDevice::AdvanceHost(std::int64_t ns) {
  std::int64_t t;
  {
    MutexLock lock(&mu_);
    t = host_now_ns_.load(std::memory_order_relaxed) + std::max<std::int64_t>(ns, 0);
  }
  AdvanceTo(t);
}

void SimDevice::AdvanceTo(std::int64_t t) {
  MutexLock exec(&exec_mu_);
  {
    MutexLock lock(&mu_);
    if (t > host_now_ns_.load(std::memory_order_relaxed)) host_now_ns_.store(t, std::memory_order_release);
  }
  for (;;) {
    absl::AnyInvocable<void() &&> run;
    {
      MutexLock lock(&mu_);
      if (pending_.empty() || pending_.top().end_ns > host_now_ns_.load(std::memory_order_relaxed)) break;
      // priority_queue::top is const; the op is moved out just before pop.
      run = std::move(const_cast<PendingOp&>(pending_.top()).run);
      running_end_ns_ = pending_.top().end_ns;
      pending_.pop();
    }
    if (run) std::move(run)();
    MutexLock lock(&mu_);
    running_end_ns_ = -1;
  }
}

std::int64_t SimDevice::EnqueueLocked(std::int64_t* stream_time, std::int64_t cost_ns,
                                      std::int64_t not_before_ns) {
  const std::int64_t start = std::max({*stream_time, host_now_ns_.load(std::memory_order_relaxed),
                                       not_before_ns});
  // (The simulator refuses traces whose costs come near the clock's end.)
  *stream_time = AddTimes(start, cost_ns);
  busy_until_ns_ = std::max(busy_until_ns_, *stream_time);
  return *stream_time;
}

absl::Status SimDevice::CheckDeviceRangeLocked(const void* ptr, std::size_t bytes,
                                               const char* what) const {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.upper_bound(addr);
  if (it != segments_.begin()) {
    --it;
    if (addr >= it->first && addr - it->first <= it->second && bytes <= it->second - (addr - it->first)) {
      return absl::OkStatus();
    }
  }
  if (VmRangeOfLocked(addr, bytes) != vm_ranges_.end()) {
    if (MappedWithAccessLocked(addr, bytes)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s range [%p, +%d) is not mapped with access on %s", what, ptr, bytes, Describe()));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s range [%p, +%d) is not inside a reserved segment of %s", what, ptr, bytes, Describe()));
}

void SimDevice::FailNextCopies(int count) {
  MutexLock lock(&mu_);
  copies_to_fail_ = count;
}

void SimDevice::FailNextWaits(int count) {
  MutexLock lock(&mu_);
  waits_to_fail_ = count;
}

void SimDevice::CorruptNextCopiesIn(int count) {
  MutexLock lock(&mu_);
  copies_in_to_corrupt_ = count;
}

absl::Status SimDevice::CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                                  Stream stream) {
  MutexLock lock(&mu_);
  if (copies_to_fail_ > 0) {
    --copies_to_fail_;
    return absl::InternalError(
        absl::StrFormat("%s: injected fault in a %s copy", Describe(), CopyKindName(kind)));
  }
  std::int64_t* stream_time;
  REMAT_ASSIGN_OR_RETURN(stream_time, StreamTimeLocked(stream));
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s copy with a null pointer", CopyKindName(kind)));
  }
  if (kind != CopyKind::kHostToDevice) REMAT_RETURN_IF_ERROR(CheckDeviceRangeLocked(src, bytes, "copy source"));
  if (kind != CopyKind::kDeviceToHost) REMAT_RETURN_IF_ERROR(CheckDeviceRangeLocked(dst, bytes, "copy destination"));
  std::int64_t* engine = nullptr;
  if (options_.cost.copy_engines && kind != CopyKind::kDeviceToDevice) {
    engine = &engine_free_at_ns_[kind == CopyKind::kHostToDevice ? 0 : 1];
  }
  const std::int64_t end = EnqueueLocked(stream_time, options_.cost.CopyNs(bytes, kind),
                                         engine != nullptr ? *engine : 0);
  if (engine != nullptr) *engine = end;
  copied_[static_cast<int>(kind)] += bytes;
  if (options_.backed) {
    const bool corrupt = kind == CopyKind::kHostToDevice && copies_in_to_corrupt_ > 0;
    if (corrupt) --copies_in_to_corrupt_;
    pending_.push(PendingOp{end, next_seq_++, [dst, src, bytes, corrupt] {
                              std::memmove(dst, src, bytes);
                              if (corrupt) *static_cast<unsigned char*>(dst) ^= 0x5a;
                            }});
  }
  return absl::OkStatus();
}

absl::Status SimDevice::LaunchHostFunc(Stream stream, absl::AnyInvocable<void() &&> fn,
                                       std::int64_t cost_ns) {
  MutexLock lock(&mu_);
  std::int64_t* stream_time;
  REMAT_ASSIGN_OR_RETURN(stream_time, StreamTimeLocked(stream));
  if (cost_ns < 0) return absl::InvalidArgumentError("LaunchHostFunc: negative cost");
  const std::int64_t end = EnqueueLocked(stream_time, cost_ns);
  pending_.push(PendingOp{end, next_seq_++, std::move(fn)});
  return absl::OkStatus();
}

std::size_t SimDevice::PendingWork() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

absl::Status SimDevice::Occupy(Stream stream, std::int64_t cost_ns) {
  MutexLock lock(&mu_);
  // (Once per replayed op: the lookup inline, the error built only on failure.)
  auto it = stream_time_.find(stream.handle);
  if (it == stream_time_.end()) return StreamTimeLocked(stream).status();
  if (cost_ns < 0) return absl::InvalidArgumentError("Occupy: negative cost");
  EnqueueLocked(&it->second, cost_ns);
  return absl::OkStatus();
}

}  // namespace remat
