/* The driver API as programs reach it without linking libcuda: by dlsym, and
 * through cuGetProcAddress as cudart does (static cudart included). Checks
 * each result under `remat run --device sim --budget B`.
 * Usage: driver_probe BUDGET_BYTES. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*MemAlloc)(CUdeviceptr*, size_t);
typedef CUresult (*MemFree)(CUdeviceptr);
typedef CUresult (*MemGetInfo)(size_t*, size_t*);
typedef CUresult (*GetProcAddress)(const char*, void**, int, uint64_t, int*);

static int failures = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "driver_probe:%d: check failed: %s\n", __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static void Exercise(const char* how, MemAlloc alloc, MemFree release, MemGetInfo info,
                     size_t budget) {
  fprintf(stderr, "driver_probe: through %s\n", how);
  size_t free_bytes = 0, total = 0;
  CHECK(info(&free_bytes, &total) == 0);
  CHECK(total == budget);
  CUdeviceptr p = 0;
  CHECK(alloc(&p, 1 << 20) == 0 && p != 0);
  CHECK(alloc(&p, budget + 1) == 2); /* CUDA_ERROR_OUT_OF_MEMORY */
  CHECK(alloc(&p, 0) == 1);          /* CUDA_ERROR_INVALID_VALUE, as the driver */
  CUdeviceptr q = 0;
  CHECK(alloc(&q, 4096) == 0);
  CHECK(release(q) == 0);
  CHECK(release(q) == 1); /* a double free */
  CHECK(info(&free_bytes, &total) == 0);
  CHECK(free_bytes == budget - (1 << 20));
  CHECK(release(p) == 0);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: driver_probe BUDGET_BYTES\n");
    return 2;
  }
  const size_t budget = strtoull(argv[1], NULL, 10);

  MemAlloc alloc = (MemAlloc)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  MemFree release = (MemFree)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  MemGetInfo info = (MemGetInfo)dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2");
  CHECK(alloc != NULL && release != NULL && info != NULL);
  if (alloc && release && info) Exercise("dlsym", alloc, release, info, budget);

  GetProcAddress gpa = (GetProcAddress)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
  CHECK(gpa != NULL);
  if (gpa != NULL) {
    void *a = NULL, *f = NULL, *i = NULL, *self = NULL;
    int status = -1;
    CHECK(gpa("cuMemAlloc", &a, 13000, 0, &status) == 0 && status == 0);
    CHECK(gpa("cuMemFree", &f, 13000, 0, NULL) == 0);
    CHECK(gpa("cuMemGetInfo", &i, 13000, 0, NULL) == 0);
    CHECK(gpa("cuGetProcAddress", &self, 13000, 0, NULL) == 0 && self != NULL);
    if (a && f && i) Exercise("cuGetProcAddress", (MemAlloc)a, (MemFree)f, (MemGetInfo)i, budget);
    /* Asked for something it does not serve: the real driver's answer where
     * there is one (remat run --device cuda), else not found. */
    void* other = (void*)1;
    const char* mode = getenv("REMAT_DEVICE");
    if (mode != NULL && strcmp(mode, "sim") == 0) {
      CHECK(gpa("cuLaunchKernel", &other, 13000, 0, &status) != 0 && other == NULL);
    } else {
      CHECK(gpa("cuLaunchKernel", &other, 13000, 0, &status) == 0 && other != NULL);
    }
  }
  if (failures == 0) printf("driver_probe: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
