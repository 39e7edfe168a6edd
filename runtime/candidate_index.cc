#include "runtime/candidate_index.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "runtime/runtime_internal.h"

namespace remat::runtime_internal {

void CandidateIndex::Add(Storage* s) {
  s->candidate_slot = items_.size();
  items_.push_back(s);
}

void CandidateIndex::Remove(Storage* s) {
  Storage* last = items_.back();
  items_[s->candidate_slot] = last;
  last->candidate_slot = s->candidate_slot;
  items_.pop_back();
  s->candidate_slot = Storage::kNoSlot;
}

void CandidateIndex::Sample(std::size_t k, std::vector<Storage*>& out) {
  const std::size_t n = items_.size();
  if (k == n) {
    out.assign(items_.begin(), items_.end());
    return;
  }
  out.clear();
  for (std::size_t i = 0; i < k; ++i) {
    rng_state_ ^= rng_state_ << 13;
    rng_state_ ^= rng_state_ >> 7;
    rng_state_ ^= rng_state_ << 17;
    const std::size_t j = i + static_cast<std::size_t>(rng_state_ % (n - i));
    std::swap(items_[i], items_[j]);
    items_[i]->candidate_slot = i;
    items_[j]->candidate_slot = j;
    out.push_back(items_[i]);
  }
}

absl::Status CandidateIndex::CheckInvariants() const {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const Storage* s = items_[i];
    if (s == nullptr) {
      return absl::InternalError(absl::StrFormat("candidate index: slot %d is empty", i));
    }
    if (s->candidate_slot != i) {
      return absl::InternalError(absl::StrFormat(
          "candidate index: the storage in slot %d (serial %d) says its slot is %d", i, s->serial,
          s->candidate_slot == Storage::kNoSlot ? -1 : static_cast<long long>(s->candidate_slot)));
    }
  }
  return absl::OkStatus();
}

}  // namespace remat::runtime_internal
