// ObjectPool: objects the runtime makes many of and reuses (storages, call
// groups). An object stays put for the pool's life, so a pointer to it stays
// valid; one given back is handed out again before a new one is made.
// Their memory comes in chunks that double in size (up to kMaxChunk), so a
// runtime that makes thousands of storages pays one heap allocation per
// chunk, not one per storage; each object is made when first handed out.
// Header-only (a template); the objects' own state is the caller's.
//
// Invariants (CheckInvariants): every object given back is one of the
// pool's, given back once.
#ifndef REMAT_RUNTIME_OBJECT_POOL_H_
#define REMAT_RUNTIME_OBJECT_POOL_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"

namespace remat::runtime_internal {

template <typename T>
class ObjectPool {
 public:
  ObjectPool() = default;
  ~ObjectPool() {
    for (T* t : all_) std::destroy_at(t);
  }
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;

  static constexpr std::size_t kFirstChunk = 16;
  static constexpr std::size_t kMaxChunk = 1024;

  // One given back earlier (the last), or a new one.
  T* Take() {
    if (!free_.empty()) {
      T* t = free_.back();
      free_.pop_back();
      return t;
    }
    if (chunk_used_ == chunk_size_) {
      chunk_size_ = chunks_.empty() ? kFirstChunk : std::min(2 * chunk_size_, kMaxChunk);
      chunks_.push_back(Chunk(std::allocator<T>().allocate(chunk_size_), FreeChunk{chunk_size_}));
      chunk_used_ = 0;
    }
    // Made where it is first handed out: the rest of the chunk's memory is
    // not touched until needed (a chunk made whole touched pages a run may
    // never use, each a page fault).
    T* t = std::construct_at(chunks_.back().get() + chunk_used_++);
    all_.push_back(t);
    return t;
  }
  // `t` (reset by the caller) may be handed out again.
  void Give(T* t) { free_.push_back(t); }

  // Objects made, in use or given back.
  std::size_t made() const { return all_.size(); }
  absl::Span<T* const> all() const { return all_; }
  absl::Span<T* const> given_back() const { return free_; }

  // `what` names the objects in the error.
  absl::Status CheckInvariants(std::string_view what) const {
    std::vector<const T*> made;
    made.reserve(all_.size());
    for (const T* t : all_) made.push_back(t);
    std::sort(made.begin(), made.end());
    std::vector<const T*> back(free_.begin(), free_.end());
    std::sort(back.begin(), back.end());
    if (std::adjacent_find(back.begin(), back.end()) != back.end()) {
      return absl::InternalError(absl::StrFormat("%s pool: an object is given back twice", what));
    }
    for (const T* t : back) {
      if (!std::binary_search(made.begin(), made.end(), t)) {
        return absl::InternalError(
            absl::StrFormat("%s pool: an object given back is not the pool's", what));
      }
    }
    return absl::OkStatus();
  }

 private:
  // A chunk's raw memory; its objects (all_) are destroyed by the pool.
  struct FreeChunk {
    std::size_t size = 0;
    void operator()(T* p) const { std::allocator<T>().deallocate(p, size); }
  };
  using Chunk = std::unique_ptr<T, FreeChunk>;
  std::vector<Chunk> chunks_;
  std::size_t chunk_size_ = 0;  // of the last chunk
  std::size_t chunk_used_ = 0;  // objects handed out of the last chunk
  std::vector<T*> all_;         // every object made, in the order made
  std::vector<T*> free_;
};

}  // namespace remat::runtime_internal

#endif  // REMAT_RUNTIME_OBJECT_POOL_H_
