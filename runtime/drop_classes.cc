#include "runtime/drop_classes.h"

#include <vector>

#include "absl/strings/str_format.h"

namespace remat::runtime_internal {

absl::Status DropClasses::CheckInvariants() const {
  if (members_ > nodes_.size()) {
    return absl::InternalError(absl::StrFormat("drop classes: %d members but %d nodes", members_,
                                               nodes_.size()));
  }
  if (members_ == 0 && !nodes_.empty()) {
    return absl::InternalError(
        absl::StrFormat("drop classes: no members but %d nodes kept", nodes_.size()));
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].parent >= nodes_.size()) {
      return absl::InternalError(absl::StrFormat("drop classes: node %d has parent %d of %d nodes",
                                                 i, nodes_[i].parent, nodes_.size()));
    }
  }
  // Every walk to a root ends: each node is walked once (0: not yet, 1: on
  // the walk now, 2: reaches a root), so a cycle shows as a node met twice.
  std::vector<std::uint8_t> seen(nodes_.size(), 0);
  std::vector<std::uint32_t> path;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    path.clear();
    std::uint32_t node = static_cast<std::uint32_t>(i);
    while (seen[node] == 0 && nodes_[node].parent != node) {
      seen[node] = 1;
      path.push_back(node);
      node = nodes_[node].parent;
    }
    if (seen[node] == 1) {
      return absl::InternalError(
          absl::StrFormat("drop classes: the parents of node %d form a cycle", i));
    }
    seen[node] = 2;
    for (std::uint32_t n : path) seen[n] = 2;
  }
  return absl::OkStatus();
}

}  // namespace remat::runtime_internal
