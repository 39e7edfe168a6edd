// DropClasses: the equivalence classes of dropped storages that the `dtr-eq`
// policy scores by (Candidate::classes_ns), as DTR's union-find keeps them.
//
// A storage that is dropped gets a node (Add) carrying what regenerating it
// adds (its drop charge) and is joined with its dropped neighbours' classes
// (Runtime::JoinClasses); a class's root carries the summed cost. Classes
// only merge: a member that comes back (Leave) takes its cost out of its
// class but its node stays. When no member is left, every node goes (so the
// forest does not grow without end). Only a Runtime whose policy reads
// classes keeps them.
//
// Invariants (CheckInvariants):
//   - every node's parent is a node, and following parents reaches a root
//     (a node that is its own parent) without a cycle;
//   - members() <= nodes, and no members means no nodes.
// Runtime::CheckInvariants adds that members() is the number of dropped
// storages, each of which has a node, and that each root's cost is the
// summed drop charge of the dropped storages in its class.
#ifndef REMAT_RUNTIME_DROP_CLASSES_H_
#define REMAT_RUNTIME_DROP_CLASSES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace remat::runtime_internal {

class DropClasses {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;  // a storage without a node

  // A new member in a class of its own, carrying `cost_ns`; returns its node.
  std::uint32_t Add(std::int64_t cost_ns) {
    const auto node = static_cast<std::uint32_t>(nodes_.size());
    nodes_.push_back(Node{node, cost_ns});
    ++members_;
    return node;
  }
  // The member at `node` left the class, taking `cost_ns` out of it.
  void Leave(std::uint32_t node, std::int64_t cost_ns) {
    nodes_[Root(node)].cost_ns -= cost_ns;
    if (--members_ == 0) nodes_.clear();
  }
  // The root of `node`'s class (halving the path on the way).
  std::uint32_t Root(std::uint32_t node) {
    while (nodes_[node].parent != node) {
      nodes_[node].parent = nodes_[nodes_[node].parent].parent;
      node = nodes_[node].parent;
    }
    return node;
  }
  // The root without touching the path (for checks).
  std::uint32_t RootOf(std::uint32_t node) const {
    while (nodes_[node].parent != node) node = nodes_[node].parent;
    return node;
  }
  // Merges the classes of `a` and `b` (the roots of `a`'s then `b`'s are
  // found in that order); the merged class's root is `a`'s.
  void Join(std::uint32_t a, std::uint32_t b) {
    a = Root(a);
    b = Root(b);
    if (a == b) return;
    nodes_[b].parent = a;
    nodes_[a].cost_ns += nodes_[b].cost_ns;
  }
  // Adds `delta` to the cost of `node`'s class.
  void AddCost(std::uint32_t node, std::int64_t delta) { nodes_[Root(node)].cost_ns += delta; }
  // The summed cost of the class whose root is `root`.
  std::int64_t Cost(std::uint32_t root) const { return nodes_[root].cost_ns; }

  std::size_t nodes() const { return nodes_.size(); }
  bool IsRoot(std::uint32_t node) const { return nodes_[node].parent == node; }
  std::uint64_t members() const { return members_; }

  absl::Status CheckInvariants() const;

 private:
  struct Node {
    std::uint32_t parent;
    std::int64_t cost_ns;
  };
  std::vector<Node> nodes_;
  std::uint64_t members_ = 0;  // dropped storages with a node
};

}  // namespace remat::runtime_internal

#endif  // REMAT_RUNTIME_DROP_CLASSES_H_
