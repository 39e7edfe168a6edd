// CandidateIndex: the storages a policy may evict now, in a vector where each
// storage knows its slot, so adding, removing and sampling k of n candidates
// cost O(1), O(1) and O(k), not O(storages).
//
// The Runtime decides what belongs (IsCandidate in runtime_internal.h:
// resident or prefetching, unpinned, evictable) and keeps the index in step
// on every state and pin change (Runtime::Reindex); the index keeps the slots.
// The order of the vector carries no meaning: removal moves the last entry
// into the hole, and sampling shuffles the entries it picks to the front.
//
// Invariants (CheckInvariants): every entry is a storage whose
// candidate_slot is its own position (so no storage is held twice).
// Runtime::CheckInvariants adds that the index holds exactly the storages
// IsCandidate accepts, and that a storage outside it has no slot.
#ifndef REMAT_RUNTIME_CANDIDATE_INDEX_H_
#define REMAT_RUNTIME_CANDIDATE_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace remat::runtime_internal {

struct Storage;

class CandidateIndex {
 public:
  CandidateIndex() = default;
  CandidateIndex(const CandidateIndex&) = delete;
  CandidateIndex& operator=(const CandidateIndex&) = delete;

  std::size_t size() const { return items_.size(); }
  absl::Span<Storage* const> all() const { return items_; }
  // `s` (not indexed) joins; `s` (indexed) leaves.
  void Add(Storage* s);
  void Remove(Storage* s);
  // Replaces `out` with k of the candidates (k <= size()): all of them, in
  // index order, when k == size(); otherwise k distinct ones chosen
  // uniformly by a partial Fisher-Yates shuffle of the index itself (a fixed
  // xorshift sequence, so runs repeat exactly).
  void Sample(std::size_t k, std::vector<Storage*>& out);

  absl::Status CheckInvariants() const;

 private:
  std::vector<Storage*> items_;
  std::uint64_t rng_state_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace remat::runtime_internal

#endif  // REMAT_RUNTIME_CANDIDATE_INDEX_H_
