#include "allocator/node_resource.h"

#include <cstdint>
#include <memory_resource>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace remat {
namespace {

// Counts what reaches the upstream resource.
class CountingResource final : public std::pmr::memory_resource {
 public:
  int allocations = 0;
  int deallocations = 0;

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    ++allocations;
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    ++deallocations;
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }
};

TEST(NodeResourceTest, ASetMatchesAPlainSetThroughRandomInsertsAndErases) {
  NodeResource nodes;
  std::pmr::set<std::uint64_t> ours(&nodes);
  std::set<std::uint64_t> reference;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t key = rng() % 5000;
    if (rng() % 3 == 0) {
      EXPECT_EQ(ours.erase(key), reference.erase(key));
    } else {
      EXPECT_EQ(ours.insert(key).second, reference.insert(key).second);
    }
  }
  EXPECT_TRUE(std::equal(ours.begin(), ours.end(), reference.begin(), reference.end()));
  // Nodes freed are reused: never more made than the most ever held, plus
  // the rest of the last chunk.
  EXPECT_LE(nodes.nodes_made(), 2 * 5000u + NodeResource::kMaxChunkNodes);
  EXPECT_GE(nodes.node_bytes(), sizeof(std::uint64_t));
}

TEST(NodeResourceTest, FreedNodesAreHandedOutAgainBeforeANewChunk) {
  CountingResource upstream;
  NodeResource nodes(&upstream);
  void* a = nodes.allocate(48, 8);
  const std::size_t made = nodes.nodes_made();
  EXPECT_EQ(made, NodeResource::kFirstChunkNodes);
  nodes.deallocate(a, 48, 8);
  EXPECT_EQ(nodes.allocate(48, 8), a);
  std::vector<void*> held{a};
  for (std::size_t i = 1; i < made; ++i) held.push_back(nodes.allocate(48, 8));
  EXPECT_EQ(nodes.nodes_made(), made);  // the first chunk, exactly used up
  held.push_back(nodes.allocate(48, 8));
  EXPECT_EQ(nodes.nodes_made(), 3 * made);  // then one twice its size
  std::set<void*> distinct(held.begin(), held.end());
  EXPECT_EQ(distinct.size(), held.size());
  for (void* p : held) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignof(std::max_align_t), 0u);
    nodes.deallocate(p, 48, 8);
  }
  EXPECT_EQ(upstream.allocations, 0);  // chunks do not come from upstream
}

TEST(NodeResourceTest, OtherSizesAndAlignmentsGoUpstream) {
  CountingResource upstream;
  NodeResource nodes(&upstream);
  void* node = nodes.allocate(40, 8);
  void* other = nodes.allocate(400, 8);
  void* aligned = nodes.allocate(40, 64);
  EXPECT_EQ(upstream.allocations, 2);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(aligned) % 64, 0u);
  nodes.deallocate(other, 400, 8);
  nodes.deallocate(aligned, 40, 64);
  nodes.deallocate(node, 40, 8);
  EXPECT_EQ(upstream.deallocations, 2);
}

}  // namespace
}  // namespace remat
