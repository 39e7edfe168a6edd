/* Allocates through an installed libremat and prints one line. */
#include <remat/remat.h>
#include <stdio.h>

int main(void) {
  remat_allocator_options options;
  remat_allocator* allocator = NULL;
  remat_stats stats;
  void* p = NULL;
  remat_allocator_options_init(&options);
  options.sim_capacity_bytes = (uint64_t)1 << 30;
  if (remat_allocator_create(&options, &allocator) != REMAT_OK ||
      remat_allocate(allocator, 1 << 20, 0, &p) != REMAT_OK ||
      remat_get_stats(allocator, &stats) != REMAT_OK || remat_deallocate(allocator, p) != REMAT_OK ||
      remat_allocator_destroy(allocator) != REMAT_OK) {
    fprintf(stderr, "consumer: %s\n", remat_last_error());
    return 1;
  }
  printf("remat %s: allocated %llu bytes\n", remat_version(),
         (unsigned long long)stats.allocated_bytes);
  return stats.allocated_bytes == (1u << 20) ? 0 : 1;
}
