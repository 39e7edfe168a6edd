// The process-wide allocators that the PyTorch library and the LD_PRELOAD
// shim serve from, configured from the environment:
//
//   REMAT_DEVICE=cuda|sim   the real GPU (default) or a SimDevice: no CUDA
//                           driver is touched, for tests and dry runs
//   REMAT_BUDGET=BYTES      cap on reserved bytes per device ("12GiB"; none by default)
//   REMAT_TRACE=FILE        write every allocation and free as an RMM replay
//                           CSV at exit (`remat replay FILE` reads it back)
//   REMAT_STATS=1           print the allocator's statistics to stderr at exit
//   REMAT_SNAPSHOT=FILE     write the allocator's state at exit as a PyTorch
//                           memory snapshot pickle (pytorch.org/memory_viz)
//   REMAT_SIM_CAPACITY=BYTES  the simulated GPU's size (default 80 GiB)
//   REMAT_SIM_BACKED=1      back simulated device memory with host memory
//
// A process other than the one the outputs are for (a forked child; a program
// a shell ran under `remat run`, which sets REMAT_ROOT_PID to its own child)
// writes FILE.<pid>, so processes never overwrite each other's files.
//
// One CachingAllocator per device index, created on first use and never
// destroyed, so calls made while the process exits (from other libraries'
// destructors) still work. On a SimDevice every stream is served as the
// default stream: the simulator knows only the streams it created.
#ifndef REMAT_INTEGRATIONS_ENV_ENV_ALLOCATOR_H_
#define REMAT_INTEGRATIONS_ENV_ENV_ALLOCATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/alloc_conf.h"
#include "allocator/caching_allocator.h"
#include "base/mutex.h"
#include "device/device_spec.h"
#include "trace/rmm_log_writer.h"

namespace remat::env {

struct Config {
  // REMAT_DEVICE, REMAT_SIM_CAPACITY, REMAT_SIM_BACKED (device/device_spec.h);
  // the CUDA device's ordinal is the one each call names.
  DeviceSpec device = [] {
    DeviceSpec d;
    d.sim.capacity = 80 * kGiB;
    return d;
  }();
  std::size_t budget = 0;  // 0: the device's capacity
  std::string trace_path;
  std::string snapshot_path;
  bool stats = false;
  // Allocator settings with PyTorch's keys (allocator/alloc_conf.h), from
  // REMAT_ALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF where ReadPyTorchAllocConf
  // was called and REMAT_ALLOC_CONF is unset.
  std::string alloc_conf;
  AllocConfSource alloc_conf_source = AllocConfSource::kRemat;
};

// Reads the REMAT_* variables; a malformed one is InvalidArgument naming it.
absl::StatusOr<Config> ConfigFromEnvironment();

// Makes ConfigFromEnvironment fall back on PYTORCH_CUDA_ALLOC_CONF: called
// when remat is PyTorch's allocator (libremat_torch.so), where that variable
// is the user's way of configuring the allocator.
void ReadPyTorchAllocConf();

class Allocators {
 public:
  static constexpr int kMaxDevices = 64;

  // The process's allocators, from the environment read on first use.
  static Allocators& Process();

  explicit Allocators(absl::StatusOr<Config> config);
  Allocators(const Allocators&) = delete;
  Allocators& operator=(const Allocators&) = delete;

  absl::StatusOr<void*> Allocate(int device, std::size_t bytes, std::uint64_t stream);
  // Frees a pointer one of our allocators handed out, on `stream` when given
  // (stream-ordered, as cudaFreeAsync). NotFound for pointers we do not own.
  absl::Status Free(const void* ptr, const std::uint64_t* stream = nullptr);
  // Free, for a caller that says which device the pointer is from (PyTorch's
  // pluggable allocator does): a pointer of another device is InvalidArgument
  // and stays allocated.
  absl::Status FreeOn(int device, const void* ptr, const std::uint64_t* stream = nullptr);
  bool Owns(const void* ptr);
  absl::Status RecordStream(const void* ptr, std::uint64_t stream);
  absl::Status EmptyCache();
  // Caps `device` at `fraction` of its capacity (PyTorch's memory fraction).
  absl::Status SetMemoryFraction(int device, double fraction);

  struct MemInfo {
    std::size_t free = 0;   // total less the bytes allocated to the program
    std::size_t total = 0;  // the budget (the device's capacity without one)
  };
  absl::StatusOr<MemInfo> GetMemInfo(int device);

  // Writes the trace, snapshot and statistics the configuration asks for;
  // once (later calls do nothing). Installed with atexit by Process().
  void Finish();

  const absl::StatusOr<Config>& config() const { return config_; }
  // The allocator of `device`, creating it on first use.
  absl::StatusOr<CachingAllocator*> For(int device);

 private:
  struct PerDevice {
    std::unique_ptr<Device> device;
    std::unique_ptr<CachingAllocator> allocator;
  };
  Stream StreamFor(std::uint64_t stream) const;
  CachingAllocator* Owner(const void* ptr);
  absl::StatusOr<CachingAllocator*> MakeFor(int device);

  const absl::StatusOr<Config> config_;
  Mutex mu_;  // guards creation; each allocator is thread-safe itself
  std::array<std::atomic<CachingAllocator*>, kMaxDevices> ready_{};
  std::array<PerDevice, kMaxDevices> devices_ ABSL_GUARDED_BY(mu_);
  bool IsRootProcess() const;  // the process the settings were given for
  std::string OutputPath(const std::string& path) const;
  const int created_pid_;
  Mutex trace_mu_;  // a call and its trace record, together
  RmmLogRecorder trace_;
  std::atomic<bool> finished_{false};
  // Says once on stderr why allocations fail (a bad REMAT_* variable, a
  // device that cannot be made): the program itself may only see errors.
  void TellOnce(int device, const absl::Status& why);
  std::atomic<bool> told_config_{false};
  std::array<std::atomic<bool>, kMaxDevices> told_{};
};

// The message of the last failure on this thread (empty if none).
const char* LastError();
void SetLastError(const absl::Status& status);

}  // namespace remat::env

#endif  // REMAT_INTEGRATIONS_ENV_ENV_ALLOCATOR_H_
