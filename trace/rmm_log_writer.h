// Writing allocation logs in RMM's replay format (see rmm_log.h), so what a
// program allocated under remat (through the LD_PRELOAD shim or the PyTorch
// library) replays with `remat replay`.
//
// RmmLogRecorder is thread-safe and remembers each live pointer's size:
// cudaFree and PyTorch's free do not always say how large the block was, and
// the log must (the parser checks every free against its allocation).
#ifndef REMAT_TRACE_RMM_LOG_WRITER_H_
#define REMAT_TRACE_RMM_LOG_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/mutex.h"
#include "trace/rmm_log.h"

namespace remat {

class RmmLogRecorder {
 public:
  // A successful allocation (`ptr` may be null for zero bytes).
  void Allocate(const void* ptr, std::size_t bytes, std::uint64_t stream);
  // A free of a pointer Allocate recorded; other pointers (and a second free
  // of one) are left out, as the program's own error, not the log's.
  void Free(const void* ptr, std::uint64_t stream);
  void AllocateFailure(std::size_t bytes, std::uint64_t stream);

  std::size_t size() const;
  // The whole log: header and one line per record, in the order recorded.
  std::string Text() const;
  absl::Status WriteTo(const std::string& path) const;

 private:
  struct Entry {
    std::uint64_t thread;
    std::int64_t time_ns;  // since midnight, UTC
    AllocAction action;
    std::uintptr_t ptr;
    std::uint64_t bytes;
    std::uint64_t stream;
  };
  void Add(AllocAction action, std::uintptr_t ptr, std::uint64_t bytes, std::uint64_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, std::uint64_t> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace remat

#endif  // REMAT_TRACE_RMM_LOG_WRITER_H_
