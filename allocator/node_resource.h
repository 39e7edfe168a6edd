// NodeResource: a memory resource for many objects of one size (the nodes of
// a node-based container), kept on a free list over chunks that live as long
// as the resource. Allocating or freeing a node is a few instructions: a pop
// or a push, with no size-class search as std::pmr's pool resources do.
//
// The node size is fixed by the first allocation. Requests of another size
// or of a stricter alignment than std::max_align_t go to the upstream
// resource (a container of one node type never makes any).
//
// Not thread-safe: its owner serializes use (the allocator's lock).
#ifndef REMAT_ALLOCATOR_NODE_RESOURCE_H_
#define REMAT_ALLOCATOR_NODE_RESOURCE_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <memory_resource>
#include <new>
#include <vector>

namespace remat {

class NodeResource final : public std::pmr::memory_resource {
 public:
  static constexpr std::size_t kFirstChunkNodes = 64;
  static constexpr std::size_t kMaxChunkNodes = 4096;

  explicit NodeResource(std::pmr::memory_resource* upstream = std::pmr::get_default_resource())
      : upstream_(upstream) {}
  NodeResource(const NodeResource&) = delete;
  NodeResource& operator=(const NodeResource&) = delete;
  ~NodeResource() override = default;  // the chunks go; nodes must not be in use

  // Nodes made so far (handed out or on the free list), and the node size (0
  // before the first allocation).
  std::size_t nodes_made() const { return made_; }
  std::size_t node_bytes() const { return node_bytes_; }

 private:
  struct FreeNode {
    FreeNode* next;
  };

  void* do_allocate(std::size_t bytes, std::size_t align) override {
    if (node_bytes_ == 0 && align <= alignof(std::max_align_t)) {
      node_bytes_ = std::max(RoundUp(bytes), sizeof(FreeNode));
      request_bytes_ = bytes;
    }
    if (bytes != request_bytes_ || align > alignof(std::max_align_t)) {
      return upstream_->allocate(bytes, align);
    }
    if (free_ == nullptr) Grow();
    FreeNode* n = free_;
    free_ = n->next;
    return n;
  }

  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    if (bytes != request_bytes_ || align > alignof(std::max_align_t)) {
      upstream_->deallocate(p, bytes, align);
      return;
    }
    auto* n = static_cast<FreeNode*>(p);
    n->next = free_;
    free_ = n;
  }

  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  static std::size_t RoundUp(std::size_t bytes) {
    constexpr std::size_t a = alignof(std::max_align_t);
    return (bytes + a - 1) / a * a;
  }

  // A new chunk, twice the last (up to kMaxChunkNodes), threaded onto the
  // free list in address order.
  void Grow() {
    const std::size_t nodes =
        chunks_.empty() ? kFirstChunkNodes : std::min(2 * last_chunk_nodes_, kMaxChunkNodes);
    chunks_.push_back(std::make_unique<std::byte[]>(nodes * node_bytes_));
    last_chunk_nodes_ = nodes;
    made_ += nodes;
    std::byte* base = chunks_.back().get();
    for (std::size_t i = nodes; i > 0; --i) {
      auto* n = reinterpret_cast<FreeNode*>(base + (i - 1) * node_bytes_);
      n->next = free_;
      free_ = n;
    }
  }

  std::pmr::memory_resource* upstream_;
  std::size_t request_bytes_ = 0;  // the size containers ask for
  std::size_t node_bytes_ = 0;     // that size, rounded up to max_align_t
  std::size_t last_chunk_nodes_ = 0;
  std::size_t made_ = 0;
  FreeNode* free_ = nullptr;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
};

}  // namespace remat

#endif  // REMAT_ALLOCATOR_NODE_RESOURCE_H_
