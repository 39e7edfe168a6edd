// alloc_pairs: N allocate+free pairs of one size on remat's CachingAllocator
// (an unbacked SimDevice, default options: what allocator_bench's churn loop
// runs), and nothing else. scripts/alloc_instructions.sh runs it under
// callgrind twice, with N and 2N pairs, so that the difference divided by N is
// the instructions of one pair, with start-up and tear-down cancelled out.
//
//   alloc_pairs PAIRS [SIZE]     (SIZE defaults to 4096)
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "bench/host_allocators.h"

int main(int argc, char** argv) {
  std::size_t pairs = 0;
  std::size_t size = 4096;
  if (argc < 2 || argc > 3 || !absl::SimpleAtoi(argv[1], &pairs) ||
      (argc == 3 && !absl::SimpleAtoi(argv[2], &size)) || size == 0) {
    std::fprintf(stderr, "usage: alloc_pairs PAIRS [SIZE]\n");
    return 2;
  }
  remat::bench::RematAllocator allocator;
  if (!allocator.ok()) {
    std::fprintf(stderr, "alloc_pairs: %s\n", allocator.error().c_str());
    return 1;
  }
  for (std::size_t i = 0; i < pairs; ++i) {
    void* p = allocator.Allocate(size);
    if (p == nullptr || !allocator.Free(p)) {
      std::fprintf(stderr, "alloc_pairs: allocate or free failed at pair %zu\n", i);
      return 1;
    }
  }
  return 0;
}
