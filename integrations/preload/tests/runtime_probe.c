/* A plain CUDA program (runtime API, dynamic libcudart) that checks every
 * interposed call's result when run under `remat run --device sim --budget B`.
 * Usage: runtime_probe BUDGET_BYTES. Exits 0 when every check holds, else
 * prints the failed check and exits 1 (3 for a failure after main). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "runtime_probe:%d: check failed: %s\n", __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

/* Served before main runs. */
static void* before_main = NULL;
__attribute__((constructor)) static void AllocateBeforeMain(void) {
  if (cudaMalloc(&before_main, 4096) != cudaSuccess) before_main = NULL;
}

/* And after exit, once remat has written its trace. */
__attribute__((destructor)) static void AllocateAfterExit(void) {
  void* p = NULL;
  if (cudaMalloc(&p, 4096) != cudaSuccess || p == NULL) _exit(3);
  if (cudaFree(p) != cudaSuccess) _exit(3);
}

static void* Churn(void* arg) {
  unsigned seed = (unsigned)(size_t)arg;
  for (int i = 0; i < 2000; ++i) {
    void* p = NULL;
    size_t bytes = 512 + (rand_r(&seed) % (1 << 20));
    if (cudaMalloc(&p, bytes) != cudaSuccess) return (void*)1;
    if (cudaFree(p) != cudaSuccess) return (void*)1;
    /* dlsym from many threads at once: ours for our names, the real one else. */
    if (dlsym(RTLD_DEFAULT, "cudaMalloc") == NULL) return (void*)1;
    if (dlsym(RTLD_DEFAULT, "getpid") != (void*)&getpid) return (void*)1;
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: runtime_probe BUDGET_BYTES\n");
    return 2;
  }
  const size_t budget = strtoull(argv[1], NULL, 10);

  CHECK(before_main != NULL);
  CHECK(cudaFree(before_main) == cudaSuccess);

  size_t free_bytes = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  CHECK(total == budget);
  CHECK(free_bytes == budget);

  void* a = NULL;
  CHECK(cudaMalloc(&a, 3 << 20) == cudaSuccess && a != NULL);
  CHECK(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  CHECK(free_bytes == budget - (3 << 20));

  /* Over the budget: CUDA's error, and the program goes on. */
  void* big = NULL;
  CHECK(cudaMalloc(&big, budget + 1) == cudaErrorMemoryAllocation);
  CHECK(cudaMallocAsync(&big, budget * 2, 0) == cudaErrorMemoryAllocation);

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
  /* Built with the per-thread default stream: the async calls above and below
   * are cudaMallocAsync_ptsz and cudaFreeAsync_ptsz. */
  CHECK(dlsym(RTLD_DEFAULT, "cudaMallocAsync_ptsz") != NULL);
#endif
  void* b = NULL;
  CHECK(cudaMallocAsync(&b, 1000, 0) == cudaSuccess && b != NULL);
  CHECK(cudaFreeAsync(b, 0) == cudaSuccess);
  CHECK(cudaFree(a) == cudaSuccess);
  CHECK(cudaFree(a) == cudaErrorInvalidValue);   /* a double free */
  CHECK(cudaFree(&free_bytes) == cudaErrorInvalidValue); /* a foreign pointer */
  CHECK(cudaFree(NULL) == cudaSuccess);
  CHECK(cudaMalloc(NULL, 16) == cudaErrorInvalidValue);
  void* zero = (void*)1;
  CHECK(cudaMalloc(&zero, 0) == cudaSuccess);

  /* Found through dlsym, in the global scope and in libcudart itself. */
  void* cudart = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
  if (cudart == NULL) cudart = dlopen("libcudart.so", RTLD_LAZY | RTLD_NOLOAD);
  CHECK(cudart != NULL);
  if (cudart != NULL) {
    cudaError_t (*malloc_fn)(void**, size_t) =
        (cudaError_t(*)(void**, size_t))dlsym(cudart, "cudaMalloc");
    CHECK(malloc_fn != NULL);
    if (malloc_fn != NULL) CHECK(malloc_fn(&big, budget + 1) == cudaErrorMemoryAllocation);
  }
  /* RTLD_NEXT keeps its meaning for the caller: the next object after us. */
  CHECK(dlsym(RTLD_NEXT, "getpid") == (void*)&getpid);

  /* Many threads. */
  pthread_t threads[8];
  for (size_t i = 0; i < 8; ++i) pthread_create(&threads[i], NULL, Churn, (void*)(i + 1));
  for (int i = 0; i < 8; ++i) {
    void* result = NULL;
    pthread_join(threads[i], &result);
    CHECK(result == NULL);
  }

  /* A fork while another thread allocates: the child's allocator works. */
  pthread_t busy;
  pthread_create(&busy, NULL, Churn, (void*)99);
  for (int k = 0; k < 5; ++k) {
    pid_t child = fork();
    if (child == 0) {
      void* p = NULL;
      int ok = cudaMalloc(&p, 1 << 20) == cudaSuccess && cudaFree(p) == cudaSuccess;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  void* busy_result = NULL;
  pthread_join(busy, &busy_result);
  CHECK(busy_result == NULL);

  if (failures == 0) printf("runtime_probe: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
