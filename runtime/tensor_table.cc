#include "runtime/tensor_table.h"

#include "absl/strings/str_format.h"

namespace remat::runtime_internal {

TensorId TensorTable::NewId(Storage* s) {
  const TensorId id = next_id_++;
  const std::size_t page = (id - 1) / kPage;
  if (page == pages_.size()) {
    pages_.push_back(std::make_unique<Page>());
    ++pages_held_;
  }
  Page& p = *pages_[page];
  p.entries[(id - 1) % kPage] = Entry{s, false};
  ++p.uncollected;
  return id;
}

void TensorTable::Forget(absl::Span<const TensorId> ids) {
  for (TensorId id : ids) {
    const std::size_t page = (id - 1) / kPage;
    Page& p = *pages_[page];
    p.entries[(id - 1) % kPage].storage = nullptr;
    // A page is let go once its last id is handed out and all its tensors are gone.
    if (--p.uncollected == 0 && (page + 1) * kPage < next_id_) {
      pages_[page].reset();
      --pages_held_;
    }
  }
}

absl::Status TensorTable::CheckInvariants() const {
  const std::size_t touched = (next_id_ - 1 + kPage - 1) / kPage;
  if (pages_.size() != touched) {
    return absl::InternalError(absl::StrFormat(
        "tensor table: %d page slots for ids below %d, want %d", pages_.size(), next_id_, touched));
  }
  std::uint64_t held = 0;
  for (std::size_t page = 0; page < pages_.size(); ++page) {
    const bool all_issued = (page + 1) * kPage < next_id_;
    const Page* p = pages_[page].get();
    if (p == nullptr) {
      if (!all_issued) {
        return absl::InternalError(absl::StrFormat(
            "tensor table: page %d given back before all its ids were handed out", page));
      }
      continue;
    }
    ++held;
    std::size_t with_storage = 0;
    for (std::size_t i = 0; i < kPage; ++i) {
      const TensorId id = 1 + page * kPage + i;
      const Entry& e = p->entries[i];
      if (id >= next_id_) {
        if (e.storage != nullptr || e.freed) {
          return absl::InternalError(
              absl::StrFormat("tensor table: id %d, not handed out yet, has an entry", id));
        }
        continue;
      }
      if (e.storage != nullptr) ++with_storage;
      if (!e.freed && e.storage == nullptr) {
        return absl::InternalError(
            absl::StrFormat("tensor table: tensor %d is not freed but has no storage", id));
      }
    }
    if (with_storage != p->uncollected) {
      return absl::InternalError(
          absl::StrFormat("tensor table: page %d counts %d uncollected entries but holds %d", page,
                          p->uncollected, with_storage));
    }
    if (all_issued && with_storage == 0) {
      return absl::InternalError(absl::StrFormat(
          "tensor table: page %d has all its ids handed out and collected but is held", page));
    }
  }
  if (held != pages_held_) {
    return absl::InternalError(
        absl::StrFormat("tensor table: %d pages held but %d counted", held, pages_held_));
  }
  return absl::OkStatus();
}

}  // namespace remat::runtime_internal
