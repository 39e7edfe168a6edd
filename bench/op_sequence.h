// Allocation sequences the benchmarks replay, prepared before any timing.
//
// A sequence is a flat list of allocate and free operations over dense slots:
// "allocate `size` bytes into slot s", "free the block in slot s". The replay
// loop keeps one pointer per slot in a flat array, so the only work it times
// besides the allocator's is an array load or store. Every sequence ends with
// every slot free, so one pass leaves the allocator as it found it (apart from
// what it caches) and can be repeated.
#ifndef REMAT_BENCH_OP_SEQUENCE_H_
#define REMAT_BENCH_OP_SEQUENCE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace remat::bench {

struct Op {
  std::uint64_t size = 0;  // bytes to allocate; 0 frees the block in `slot`
  std::uint32_t slot = 0;
};

struct OpSequence {
  std::string description;  // where it came from, for the report
  std::vector<Op> ops;
  std::uint32_t num_slots = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;            // the closing frees included
  std::uint64_t closing_frees = 0;    // blocks still live at the end, freed to close the pass
  std::uint64_t peak_live_bytes = 0;  // of requested sizes
};

// RMM's random_allocations benchmark, as a fixed sequence: each of `num_ops`
// steps allocates (with probability `allocate_fraction`; always when nothing
// is live) a size uniform in [min_size, max_size], or frees a live block
// chosen uniformly at random. The closing frees follow.
struct RandomSequenceOptions {
  std::uint64_t seed = 20240611;
  std::size_t num_ops = 4096;
  double allocate_fraction = 0.73;
  std::uint64_t min_size = 1024;
  std::uint64_t max_size = 64ull << 20;
};
OpSequence MakeRandomSequence(const RandomSequenceOptions& options);

// The allocate and free lines of an RMM replay log, in log order. Allocation
// failures and zero-byte allocations (and their frees) are left out: they
// reserve nothing, and mallocx(0) is undefined.
absl::StatusOr<OpSequence> SequenceFromRmmLog(const std::string& path);

// A stand-in for a training step when no log is at hand: parameters for the
// whole step, a forward pass that keeps one activation per layer and frees a
// workspace, and a backward pass that frees activations in reverse while
// gradients come and go. Deterministic.
OpSequence MakeSyntheticTrainingStep(int layers = 48);

}  // namespace remat::bench

#endif  // REMAT_BENCH_OP_SEQUENCE_H_
