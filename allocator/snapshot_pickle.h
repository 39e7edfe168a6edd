// A Snapshot in PyTorch's memory snapshot layout, as a Python pickle, so the
// tools people already use on PyTorch snapshots open ours: the viewer at
// https://pytorch.org/memory_viz, and `python -m torch.cuda._memory_viz`.
//
// The pickle holds one dict, as torch.cuda.memory._snapshot() returns it:
//
//   {'segments': [{'device': 0, 'address': A, 'total_size': N,
//                  'allocated_size': .., 'active_size': .., 'requested_size': ..,
//                  'stream': S, 'segment_type': 'small' | 'large',
//                  'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
//                  'blocks': [{'address': A, 'size': N, 'requested_size': R,
//                              'state': 'active_allocated' | 'active_pending_free' | 'inactive',
//                              'frames': []}, ...]}, ...],
//    'device_traces': [[{'action': 'alloc' | 'free_requested' | 'free_completed' |
//                                  'segment_alloc' | 'segment_free' | 'oom',
//                        'addr': A, 'size': N, 'stream': S, 'time_us': T, 'frames': []},
//                       ...]],
//    'allocator_settings': {}}
//
// Blocks tile their segment in address order, free space included. One
// device (index 0); streams are the Stream handles. As in PyTorch, a trace
// entry's size is what the caller asked for on alloc, frees and oom (the
// block's rounded size is in the segments), and the segment's size on
// segment events; time_us is the device clock in microseconds (on a replay,
// the log's clock). No stack frames are recorded: every `frames` is empty.
#ifndef REMAT_ALLOCATOR_SNAPSHOT_PICKLE_H_
#define REMAT_ALLOCATOR_SNAPSHOT_PICKLE_H_

#include <string>

#include "absl/status/status.h"
#include "allocator/snapshot.h"

namespace remat {

// The pickle's bytes (protocol 2).
std::string SnapshotToPickle(const Snapshot& snapshot);

// Writes SnapshotToPickle(snapshot) to `path`; errors as base/file.h's WriteFile.
absl::Status WriteSnapshotPickle(const Snapshot& snapshot, const std::string& path);

}  // namespace remat

#endif  // REMAT_ALLOCATOR_SNAPSHOT_PICKLE_H_
