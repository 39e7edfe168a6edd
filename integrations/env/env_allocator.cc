#include "integrations/env/env_allocator.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_format.h"
#include "allocator/alloc_conf.h"
#include "allocator/snapshot_pickle.h"
#include "base/env.h"
#include "base/units.h"
#include "device/device_spec.h"
#include "device/sim_device.h"

namespace remat::env {
namespace {

thread_local std::string tls_last_error;

void PrintStats(int device, const CachingAllocator& alloc) {
  const AllocatorStats s = alloc.GetStats();
  std::fprintf(stderr,
               "remat: device %d (%s): peak allocated %s, peak reserved %s, budget %s, "
               "%lld allocations, %lld retries, %lld out of memory\n",
               device, alloc.device()->Describe().c_str(),
               FormatBytes(static_cast<std::uint64_t>(s.allocated_bytes.all().peak)).c_str(),
               FormatBytes(static_cast<std::uint64_t>(s.reserved_bytes.all().peak)).c_str(),
               FormatBytes(alloc.budget()).c_str(),
               static_cast<long long>(s.allocation.all().allocated),
               static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms));
}

std::atomic<bool> read_pytorch_alloc_conf{false};

}  // namespace

const char* LastError() { return tls_last_error.c_str(); }

void SetLastError(const absl::Status& status) {
  tls_last_error = status.ok() ? std::string() : std::string(status.message());
}

absl::StatusOr<Config> ConfigFromEnvironment() {
  Config c;
  if (absl::Status s = c.device.ReadEnvironment(); !s.ok()) return s;
  if (absl::Status s = BytesFromEnv("REMAT_BUDGET", &c.budget); !s.ok()) return s;
  if (absl::Status s = FlagFromEnv("REMAT_STATS", &c.stats); !s.ok()) return s;
  if (const char* t = GetEnv("REMAT_TRACE")) c.trace_path = t;
  if (const char* t = GetEnv("REMAT_SNAPSHOT")) c.snapshot_path = t;
  const char* conf_var = "REMAT_ALLOC_CONF";
  const char* conf = GetEnv(conf_var);
  if (conf == nullptr && read_pytorch_alloc_conf.load(std::memory_order_relaxed)) {
    conf_var = "PYTORCH_CUDA_ALLOC_CONF";
    conf = GetEnv(conf_var);
    c.alloc_conf_source = AllocConfSource::kPyTorch;
  }
  if (conf != nullptr) {
    AllocatorOptions probe;
    if (absl::Status s = ApplyAllocConf(conf, &probe, c.alloc_conf_source); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s=%s: %s", conf_var, conf, s.message()));
    }
    c.alloc_conf = conf;
  }
  return c;
}

void ReadPyTorchAllocConf() { read_pytorch_alloc_conf.store(true, std::memory_order_relaxed); }

Allocators& Allocators::Process() {
  // Leaked on purpose: calls made while the process exits must still work.
  static Allocators* const process = [] {
    auto* a = new Allocators(ConfigFromEnvironment());
    std::atexit([] { Process().Finish(); });
    return a;
  }();
  return *process;
}

Allocators::Allocators(absl::StatusOr<Config> config)
    : config_(std::move(config)), created_pid_(getpid()) {}

Stream Allocators::StreamFor(std::uint64_t stream) const {
  if (config_.ok() && config_->device.kind == DeviceSpec::Kind::kSim) return kDefaultStream;
  return Stream{static_cast<std::uintptr_t>(stream)};
}

void Allocators::TellOnce(int device, const absl::Status& why) {
  if (!config_.ok()) {
    // A bad setting: every allocation on every device fails alike.
    if (told_config_.exchange(true)) return;
    std::fprintf(stderr, "remat: %s; every CUDA allocation made through remat fails\n",
                 std::string(why.message()).c_str());
    return;
  }
  if (told_[device].exchange(true)) return;
  std::fprintf(stderr, "remat: device %d: %s; allocations on it through remat fail\n", device,
               std::string(why.message()).c_str());
}

absl::StatusOr<CachingAllocator*> Allocators::For(int device) {
  if (device < 0 || device >= kMaxDevices) {  // this call's own bad input
    return absl::InvalidArgumentError(absl::StrFormat("device %d is out of range", device));
  }
  absl::StatusOr<CachingAllocator*> made = MakeFor(device);
  if (!made.ok()) TellOnce(device, made.status());  // every later call would fail alike
  return made;
}

absl::StatusOr<CachingAllocator*> Allocators::MakeFor(int device) {
  if (!config_.ok()) return config_.status();
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrFormat("device %d is out of range", device));
  }
  if (CachingAllocator* a = ready_[device].load(std::memory_order_acquire)) return a;
  MutexLock lock(&mu_);
  if (CachingAllocator* a = ready_[device].load(std::memory_order_relaxed)) return a;
  PerDevice& d = devices_[device];
  DeviceSpec spec = config_->device;
  spec.cuda_ordinal = device;
  // Simulated devices: each index its own addresses, as real GPUs have.
  spec.sim.address_window = device;
#ifndef REMAT_HAVE_CUDA
  if (spec.kind == DeviceSpec::Kind::kCuda) {
    return absl::FailedPreconditionError(
        "remat was built without CUDA: set REMAT_DEVICE=sim to use the simulated device");
  }
#endif
  absl::StatusOr<std::unique_ptr<Device>> made = MakeDevice(spec);
  if (!made.ok()) return made.status();
  d.device = std::move(*made);
  const std::size_t capacity = d.device->Capacity();
  if (config_->budget > capacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("REMAT_BUDGET (%s) is larger than device %d (%s)",
                        FormatBytes(config_->budget), device, FormatBytes(capacity)));
  }
  AllocatorOptions options;
  options.budget = config_->budget;
  if (!config_->snapshot_path.empty()) options.event_ring_capacity = 1 << 16;
  if (absl::Status s = ApplyAllocConf(config_->alloc_conf, &options, config_->alloc_conf_source);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<CachingAllocator>> alloc =
      CachingAllocator::Create(d.device.get(), options);
  if (!alloc.ok()) return alloc.status();
  d.allocator = std::move(*alloc);
  ready_[device].store(d.allocator.get(), std::memory_order_release);
  return d.allocator.get();
}

absl::StatusOr<void*> Allocators::Allocate(int device, std::size_t bytes, std::uint64_t stream) {
  absl::StatusOr<CachingAllocator*> alloc = For(device);
  if (!alloc.ok()) return alloc.status();
  if (config_->trace_path.empty()) return (*alloc)->Allocate(bytes, StreamFor(stream));
  // The call and its record under one lock: the log's order is the allocator's.
  MutexLock lock(&trace_mu_);
  absl::StatusOr<void*> ptr = (*alloc)->Allocate(bytes, StreamFor(stream));
  if (ptr.ok()) {
    trace_.Allocate(*ptr, bytes, stream);
  } else {
    trace_.AllocateFailure(bytes, stream);
  }
  return ptr;
}

CachingAllocator* Allocators::Owner(const void* ptr) {
  // Any address inside our segments is ours, live or not: a double or
  // interior free must never reach the real cudaFree, which would free a
  // segment the cache still holds.
  for (int i = 0; i < kMaxDevices; ++i) {
    CachingAllocator* a = ready_[i].load(std::memory_order_acquire);
    if (a != nullptr && a->ContainsAddress(ptr)) return a;
  }
  return nullptr;
}

bool Allocators::Owns(const void* ptr) { return ptr != nullptr && Owner(ptr) != nullptr; }

absl::Status Allocators::FreeOn(int device, const void* ptr, const std::uint64_t* stream) {
  if (ptr == nullptr) return absl::OkStatus();
  CachingAllocator* owner = Owner(ptr);
  if (owner != nullptr && (device < 0 || device >= kMaxDevices ||
                           ready_[device].load(std::memory_order_acquire) != owner)) {
    int from = -1;
    for (int i = 0; i < kMaxDevices; ++i) {
      if (ready_[i].load(std::memory_order_acquire) == owner) from = i;
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%p was allocated on device %d, not device %d: not freed", ptr, from, device));
  }
  return Free(ptr, stream);
}

absl::Status Allocators::Free(const void* ptr, const std::uint64_t* stream) {
  if (ptr == nullptr) return absl::OkStatus();
  CachingAllocator* a = Owner(ptr);
  if (a == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%p was not allocated by remat", ptr));
  }
  void* p = const_cast<void*>(ptr);
  auto free = [&] {
    return stream != nullptr ? a->FreeOnStream(p, StreamFor(*stream)) : a->Free(p);
  };
  if (config_->trace_path.empty()) return free();
  MutexLock lock(&trace_mu_);
  absl::Status s = free();
  if (s.ok()) trace_.Free(ptr, stream != nullptr ? *stream : 0);
  return s;
}

absl::Status Allocators::RecordStream(const void* ptr, std::uint64_t stream) {
  CachingAllocator* a = Owner(ptr);
  if (a == nullptr) {
    return absl::NotFoundError(absl::StrFormat("%p was not allocated by remat", ptr));
  }
  return a->RecordStream(const_cast<void*>(ptr), StreamFor(stream));
}

absl::Status Allocators::EmptyCache() {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (CachingAllocator* a = ready_[i].load(std::memory_order_acquire)) {
      if (absl::Status s = a->EmptyCache(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Allocators::SetMemoryFraction(int device, double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("memory fraction %g is not in (0, 1]", fraction));
  }
  absl::StatusOr<CachingAllocator*> alloc = For(device);
  if (!alloc.ok()) return alloc.status();
  const auto capacity = static_cast<double>((*alloc)->device()->Capacity());
  return (*alloc)->SetBudget(static_cast<std::size_t>(fraction * capacity));
}

absl::StatusOr<Allocators::MemInfo> Allocators::GetMemInfo(int device) {
  absl::StatusOr<CachingAllocator*> alloc = For(device);
  if (!alloc.ok()) return alloc.status();
  MemInfo info;
  info.total = (*alloc)->budget();
  const auto allocated =
      static_cast<std::size_t>((*alloc)->GetStats().allocated_bytes.all().current);
  info.free = info.total > allocated ? info.total - allocated : 0;
  return info;
}

// Outputs of a process other than the one the files were meant for (a
// forked child, or a program a shell started under `remat run`, which names
// its own child in REMAT_ROOT_PID) get the process id appended, so processes
// never overwrite each other's files.
bool Allocators::IsRootProcess() const {
  const pid_t pid = getpid();
  bool root = pid == created_pid_;
  if (const char* r = std::getenv("REMAT_ROOT_PID"); r != nullptr && *r != '\0') {
    root = root && std::to_string(pid) == r;
  }
  return root;
}

std::string Allocators::OutputPath(const std::string& path) const {
  return IsRootProcess() ? path : absl::StrFormat("%s.%d", path, static_cast<int>(getpid()));
}

void Allocators::Finish() {
  if (finished_.exchange(true) || !config_.ok()) return;
  bool any = false;
  for (int i = 0; i < kMaxDevices; ++i) any = any || ready_[i].load() != nullptr;
  if (!any && (!config_->trace_path.empty() || !config_->snapshot_path.empty() ||
               config_->stats)) {
    // Only the process the settings were given for says so: a child forked
    // before any allocation (a data loader's worker) inherits this handler.
    if (!IsRootProcess()) return;
    std::fprintf(stderr,
                 "remat: process %d made no CUDA allocation through remat: no trace, snapshot "
                 "or statistics of its own to write\n",
                 static_cast<int>(getpid()));
    return;
  }
  if (!config_->trace_path.empty()) {
    if (absl::Status s = trace_.WriteTo(OutputPath(config_->trace_path)); !s.ok()) {
      std::fprintf(stderr, "remat: cannot write the trace: %s\n", std::string(s.message()).c_str());
    }
  }
  for (int i = 0; i < kMaxDevices; ++i) {
    CachingAllocator* a = ready_[i].load(std::memory_order_acquire);
    if (a == nullptr) continue;
    if (config_->stats) PrintStats(i, *a);
    if (!config_->snapshot_path.empty()) {
      // One file per device after the first: FILE, FILE.1, ...
      const std::string base = OutputPath(config_->snapshot_path);
      const std::string path = i == 0 ? base : absl::StrFormat("%s.%d", base, i);
      if (absl::Status s = WriteSnapshotPickle(a->TakeSnapshot(), path); !s.ok()) {
        std::fprintf(stderr, "remat: cannot write the snapshot: %s\n",
                     std::string(s.message()).c_str());
      }
    }
  }
}

}  // namespace remat::env
