// The allocator settings string, with PyTorch's keys and meanings
// (PYTORCH_CUDA_ALLOC_CONF), so one string configures both:
//
//   expandable_segments:True            grow one range per pool and stream by pages
//   max_split_size_mb:256               blocks above it are never split
//   roundup_power2_divisions:4          round sizes up to 4 steps per power of two
//   roundup_power2_divisions:[256:1,512:2,>:4]
//                                       per size interval (MiB, powers of two):
//                                       1 below 256, 2 in [256, 512), 4 above
//   garbage_collection_threshold:0.8    above this share of the budget reserved,
//                                       release the cache before growing
//   release_lock_on_cudamalloc:True     no allocator lock held while the device
//                                       reserves a segment
//
// Pairs are separated by commas. An unknown key, a bad value or a key given
// twice is an error naming it, and the options are then left unchanged.
#ifndef REMAT_ALLOCATOR_ALLOC_CONF_H_
#define REMAT_ALLOCATOR_ALLOC_CONF_H_

#include <string_view>

#include "absl/status/status.h"
#include "allocator/caching_allocator.h"

namespace remat {

// kPyTorch: the string is PYTORCH_CUDA_ALLOC_CONF, read as PyTorch's
// allocator: the keys of PyTorch's own parts (backend, pinned_*) are left to
// PyTorch and skipped here.
enum class AllocConfSource { kRemat, kPyTorch };
absl::Status ApplyAllocConf(std::string_view conf, AllocatorOptions* options,
                            AllocConfSource source = AllocConfSource::kRemat);

}  // namespace remat

#endif  // REMAT_ALLOCATOR_ALLOC_CONF_H_
