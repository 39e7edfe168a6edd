#include "bench/op_sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "trace/rmm_log.h"

namespace remat::bench {
namespace {

// SplitMix64: the same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (the modulo bias is negligible for the n used here).
  std::uint64_t Below(std::uint64_t n) { return Next() % n; }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Builds a sequence while tracking live slots, reusing freed ones.
class Builder {
 public:
  explicit Builder(std::string description) { seq_.description = std::move(description); }

  std::uint32_t Allocate(std::uint64_t size) {
    std::uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = seq_.num_slots++;
      sizes_.push_back(0);
    }
    sizes_[slot] = size;
    live_.push_back(slot);
    live_bytes_ += size;
    seq_.peak_live_bytes = std::max(seq_.peak_live_bytes, live_bytes_);
    seq_.ops.push_back(Op{size, slot});
    ++seq_.allocations;
    return slot;
  }
  // Frees the live block at position `index` of live().
  void FreeAt(std::size_t index) {
    const std::uint32_t slot = live_[index];
    live_[index] = live_.back();
    live_.pop_back();
    live_bytes_ -= sizes_[slot];
    free_slots_.push_back(slot);
    seq_.ops.push_back(Op{0, slot});
    ++seq_.frees;
  }
  void Free(std::uint32_t slot) {
    FreeAt(static_cast<std::size_t>(std::find(live_.begin(), live_.end(), slot) - live_.begin()));
  }
  const std::vector<std::uint32_t>& live() const { return live_; }

  OpSequence Finish() && {
    // Oldest first, as a program tearing down would.
    std::vector<std::uint32_t> rest = live_;
    std::sort(rest.begin(), rest.end());
    seq_.closing_frees = rest.size();
    for (std::uint32_t slot : rest) Free(slot);
    return std::move(seq_);
  }

 private:
  OpSequence seq_;
  std::vector<std::uint32_t> live_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint64_t> sizes_;
  std::uint64_t live_bytes_ = 0;
};

}  // namespace

OpSequence MakeRandomSequence(const RandomSequenceOptions& options) {
  Builder b(
      absl::StrFormat("random: %d steps, %.0f%% allocate, sizes uniform in [%d, %d] B, "
                      "seed %d",
                      options.num_ops, options.allocate_fraction * 100, options.min_size,
                      options.max_size, options.seed));
  Rng rng(options.seed);
  const std::uint64_t span = options.max_size - options.min_size + 1;
  for (std::size_t i = 0; i < options.num_ops; ++i) {
    if (b.live().empty() || rng.Unit() < options.allocate_fraction) {
      b.Allocate(options.min_size + rng.Below(span));
    } else {
      b.FreeAt(rng.Below(b.live().size()));
    }
  }
  return std::move(b).Finish();
}

absl::StatusOr<OpSequence> SequenceFromRmmLog(const std::string& path) {
  absl::StatusOr<AllocLog> log = ReadRmmLog(path);
  if (!log.ok()) return log.status();
  // The log's slots are already dense and reused after a free; rebuild them
  // through the builder anyway so the closing frees and counts are ours.
  Builder b(absl::StrFormat(
      "RMM log %s: %d allocate and %d free lines (%d failures and %d "
      "zero-byte allocations left out)",
      path, log->allocations, log->frees, log->alloc_failures, log->zero_byte_allocations));
  std::vector<std::uint32_t> our_slot(log->num_slots, 0);
  for (const AllocRecord& r : log->records) {
    if (r.slot == kNoSlot) continue;
    if (r.action == AllocAction::kAllocate) {
      our_slot[r.slot] = b.Allocate(r.size);
    } else if (r.action == AllocAction::kFree) {
      b.Free(our_slot[r.slot]);
    }
  }
  return std::move(b).Finish();
}

OpSequence MakeSyntheticTrainingStep(int layers) {
  Builder b(absl::StrFormat("synthetic training step: %d layers (no RMM log found)", layers));
  Rng rng(7);
  auto activation = [&] { return (std::uint64_t{1} << (12 + rng.Below(15))) + 512 * rng.Below(8); };
  std::vector<std::uint32_t> params, acts;
  for (int i = 0; i < layers; ++i) params.push_back(b.Allocate(activation()));
  for (int i = 0; i < layers; ++i) {
    const std::uint32_t workspace = b.Allocate(activation());
    acts.push_back(b.Allocate(activation()));
    b.Free(workspace);
  }
  std::uint32_t grad = b.Allocate(activation());
  for (int i = layers - 1; i >= 0; --i) {
    const std::uint32_t next_grad = b.Allocate(activation());
    const std::uint32_t weight_grad = b.Allocate(activation());
    b.Free(acts[static_cast<std::size_t>(i)]);
    b.Free(grad);
    b.Free(weight_grad);
    grad = next_grad;
  }
  b.Free(grad);
  return std::move(b).Finish();  // the parameters are the closing frees
}

}  // namespace remat::bench
