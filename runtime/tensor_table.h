// TensorTable: the runtime's map from tensor ids to their entries, a lookup by
// index rather than a hash.
//
// Ids are handed out in order from 1, so their entries live in pages of
// kPage indexed by id. A page whose tensors are all collected is given back
// (its ids still answer "issued", and a caller reads a missing page as
// "freed"), so a process that makes tensors without end keeps only the pages
// of tensors still around.
//
// Invariants (CheckInvariants):
//   - pages_ has one slot per page touched so far: ceil((next_id - 1) / kPage);
//   - a held page's `uncollected` equals its entries with a storage;
//   - an entry the owner has not freed has a storage;
//   - entries of ids not yet handed out (>= next_id) are empty;
//   - a page is given back only once all its ids are handed out, and a page
//     whose ids are all handed out and collected is given back;
//   - pages_held() equals the pages held.
#ifndef REMAT_RUNTIME_TENSOR_TABLE_H_
#define REMAT_RUNTIME_TENSOR_TABLE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace remat {

using TensorId = std::uint64_t;  // as runtime/runtime.h declares it

namespace runtime_internal {

struct Storage;  // runtime/runtime_internal.h; the table only holds pointers to them

class TensorTable {
 public:
  static constexpr std::size_t kPage = 4096;

  // A tensor id's entry: its storage until the storage is collected (then
  // nullptr), and whether the owner freed it.
  struct Entry {
    Storage* storage = nullptr;
    bool freed = false;
  };

  TensorTable() = default;
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  // Whether the id was ever handed out.
  bool Issued(TensorId id) const { return id != 0 && id < next_id_; }
  // The entry of an id ever handed out whose page is still held; nullptr otherwise.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Entry* Find(TensorId id) const {
    // Id 0 wraps to a page past the end: one bounds check covers it.
    const std::size_t page = (id - 1) / kPage;
    if (id >= next_id_ || page >= pages_.size()) return nullptr;
    Page* p = pages_[page].get();
    return p == nullptr ? nullptr : &p->entries[(id - 1) % kPage];
  }
  // Hands out the next id, its entry naming `s` (not freed).
  TensorId NewId(Storage* s);
  // The storage behind these ids was collected: their entries let it go, and
  // pages left with nothing uncollected are given back.
  void Forget(absl::Span<const TensorId> ids);

  TensorId next_id() const { return next_id_; }
  // Pages held now (RuntimeStats::tensor_pages).
  std::uint64_t pages_held() const { return pages_held_; }
  // Calls f(id, entry) for every id on a held page that was handed out.
  template <typename F>
  void ForEachEntry(F&& f) const {
    for (std::size_t page = 0; page < pages_.size(); ++page) {
      if (pages_[page] == nullptr) continue;
      for (std::size_t i = 0; i < kPage; ++i) {
        const TensorId id = 1 + page * kPage + i;
        if (id >= next_id_) return;
        f(id, pages_[page]->entries[i]);
      }
    }
  }

  absl::Status CheckInvariants() const;

 private:
  struct Page {
    std::array<Entry, kPage> entries;
    std::size_t uncollected = 0;  // entries with a storage
  };
  // Page i holds ids [1 + i * kPage, 1 + (i + 1) * kPage); nullptr once given back.
  std::vector<std::unique_ptr<Page>> pages_;
  std::uint64_t pages_held_ = 0;
  TensorId next_id_ = 1;
};

}  // namespace runtime_internal
}  // namespace remat

#endif  // REMAT_RUNTIME_TENSOR_TABLE_H_
