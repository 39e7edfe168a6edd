/* Every function of remat.h, from C, on the simulated device, linked against
 * libremat.so alone. A failed check prints where and remat_last_error(), and
 * the program exits with status 1. */
#include <remat/remat.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static int failures = 0;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: %s\n", __FILE__, __LINE__, \
              #cond, remat_last_error());                                               \
      ++failures;                                                                       \
      return;                                                                           \
    }                                                                                   \
  } while (0)

/* The call returns `want`; on a failure code, with a message. */
#define CHECK_STATUS(call, want)                                                         \
  do {                                                                                   \
    remat_status got_ = (call);                                                          \
    if (got_ != (want)) {                                                                \
      fprintf(stderr, "%s:%d: %s returned %s, want %s\n  last error: %s\n", __FILE__,    \
              __LINE__, #call, remat_status_name(got_), remat_status_name(want),         \
              remat_last_error());                                                       \
      ++failures;                                                                        \
      return;                                                                            \
    }                                                                                    \
    if ((want) != REMAT_OK && remat_last_error()[0] == '\0') {                           \
      fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__, #call); \
      ++failures;                                                                        \
      return;                                                                            \
    }                                                                                    \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, REMAT_OK)

#define CHECK_ERROR_HAS(text)                                                       \
  do {                                                                              \
    if (strstr(remat_last_error(), (text)) == NULL) {                               \
      fprintf(stderr, "%s:%d: last error lacks \"%s\": %s\n", __FILE__, __LINE__,   \
              (text), remat_last_error());                                          \
      ++failures;                                                                   \
      return;                                                                       \
    }                                                                               \
  } while (0)

static remat_allocator* make_allocator(uint64_t capacity, uint64_t budget, int backed) {
  remat_allocator_options options;
  remat_allocator* allocator = NULL;
  if (remat_allocator_options_init(&options) != REMAT_OK) return NULL;
  options.sim_capacity_bytes = capacity;
  options.budget_bytes = budget;
  options.sim_backed = backed;
  options.history_events = 64;
  if (remat_allocator_create(&options, &allocator) != REMAT_OK) {
    fprintf(stderr, "remat_allocator_create: %s\n", remat_last_error());
    return NULL;
  }
  return allocator;
}

static int same_stats(const remat_stats* a, const remat_stats* b) {
  return memcmp(a, b, sizeof(*a)) == 0;
}

/* --- Status and arguments ------------------------------------------------------ */

static void test_status_names_and_version(void) {
  CHECK(strcmp(remat_status_name(REMAT_OK), "REMAT_OK") == 0);
  CHECK(strcmp(remat_status_name(REMAT_OUT_OF_MEMORY), "REMAT_OUT_OF_MEMORY") == 0);
  CHECK(strcmp(remat_status_name((remat_status)99), "REMAT_UNKNOWN") == 0);
  CHECK(strlen(remat_version()) >= 5);
  CHECK(remat_abi_version() == REMAT_ABI_VERSION);
  remat_string_free(NULL);
}

static void test_null_arguments(void) {
  remat_allocator* allocator = (remat_allocator*)0x1;
  void* p = NULL;
  CHECK_STATUS(remat_allocator_options_init(NULL), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_allocator_create(NULL, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("remat_allocator_create");
  CHECK_ERROR_HAS("out is NULL");
  CHECK_STATUS(remat_allocate(NULL, 16, 0, &p), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("allocator is NULL");
  CHECK_STATUS(remat_get_stats(NULL, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_runtime_create(NULL, "lru", NULL), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_tensor_acquire(NULL, 1, 0, &p), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_allocator_destroy(NULL));
  CHECK_OK(remat_runtime_destroy(NULL));
  /* A bad device kind or capacity fails, leaving *out alone. */
  {
    remat_allocator_options options;
    CHECK_OK(remat_allocator_options_init(&options));
    options.device = (remat_device_kind)7;
    CHECK_STATUS(remat_allocator_create(&options, &allocator), REMAT_INVALID_ARGUMENT);
    CHECK_ERROR_HAS("unknown device kind 7");
    CHECK_OK(remat_allocator_options_init(&options));
    options.sim_capacity_bytes = 0;
    CHECK_STATUS(remat_allocator_create(&options, &allocator), REMAT_INVALID_ARGUMENT);
    CHECK_OK(remat_allocator_options_init(&options));
    options.budget_bytes = 1;  /* below the smallest segment */
    CHECK_STATUS(remat_allocator_create(&options, &allocator), REMAT_INVALID_ARGUMENT);
    CHECK(allocator == (remat_allocator*)0x1);
  }
}

/* The CUDA device: usable where a GPU is, a clean failure elsewhere. */
static void test_cuda_device_or_clean_failure(void) {
  remat_allocator_options options;
  remat_allocator* allocator = NULL;
  remat_status st;
  CHECK_OK(remat_allocator_options_init(&options));
  options.device = REMAT_DEVICE_CUDA;
  options.cuda_device = 0;
  st = remat_allocator_create(&options, &allocator);
  if (st == REMAT_OK) {
    void* p = NULL;
    CHECK_OK(remat_allocate(allocator, MIB, 0, &p));
    CHECK(p != NULL);
    CHECK_OK(remat_deallocate(allocator, p));
    CHECK_OK(remat_allocator_destroy(allocator));
    printf("  (CUDA device available: allocated and freed on it)\n");
  } else {
    CHECK_STATUS(st, REMAT_FAILED_PRECONDITION);
    CHECK(allocator == NULL);
    printf("  (no CUDA device: %s)\n", remat_last_error());
  }
  options.cuda_device = -1;
  CHECK_STATUS(remat_allocator_create(&options, &allocator), REMAT_INVALID_ARGUMENT);
}

/* --- Allocator ------------------------------------------------------------------- */

static void test_allocate_and_free(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_stats stats;
  void* small = NULL;
  void* large = NULL;
  CHECK(a != NULL);
  CHECK_OK(remat_allocate(a, 1000, 0, &small));
  CHECK_OK(remat_allocate(a, 30 * MIB, 0, &large));
  CHECK(small != NULL && large != NULL && small != large);
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.allocated_bytes == 1024 + 30 * MIB);  /* rounded to 512 B */
  CHECK(stats.requested_bytes == 1000 + 30 * MIB);
  CHECK(stats.allocations == 2);
  CHECK(stats.reserved_bytes >= stats.allocated_bytes);
  CHECK(stats.device_capacity_bytes == GIB);
  CHECK(stats.budget_bytes == GIB);
  CHECK_OK(remat_deallocate(a, small));
  CHECK_OK(remat_deallocate(a, large));
  CHECK_OK(remat_deallocate(a, NULL));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.allocated_bytes == 0 && stats.allocations == 0);
  CHECK(stats.allocated_bytes_peak == 1024 + 30 * MIB);
  CHECK(stats.reserved_bytes > 0);  /* cached */
  CHECK_OK(remat_empty_cache(a));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.reserved_bytes == 0 && stats.segments == 0);
  CHECK(stats.num_device_alloc == stats.num_device_free);
  CHECK_OK(remat_reset_peak_stats(a));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.allocated_bytes_peak == 0);
  CHECK_OK(remat_allocator_destroy(a));
}

/* Steps with expandable segments: L1 and T share a page, L2 takes a second,
 * T goes, and a 2 MiB block needs a third page at the peak; after a step, T
 * is placed apart and the peak holds two. */
static void one_step(remat_allocator* a, uint64_t* peak) {
  void* l1 = NULL;
  void* t = NULL;
  void* l2 = NULL;
  void* big = NULL;
  remat_stats stats;
  CHECK_OK(remat_allocate(a, 512 * 1024, 0, &l1));
  CHECK_OK(remat_allocate(a, MIB, 0, &t));
  CHECK_OK(remat_allocate(a, MIB, 0, &l2));
  CHECK_OK(remat_deallocate(a, t));
  CHECK_OK(remat_allocate(a, 2 * MIB, 0, &big));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK_OK(remat_deallocate(a, l1));
  CHECK_OK(remat_deallocate(a, l2));
  CHECK_OK(remat_deallocate(a, big));
  CHECK_OK(remat_end_step(a));
  CHECK_OK(remat_empty_cache(a));
  CHECK_OK(remat_reset_peak_stats(a));
  *peak = stats.reserved_bytes_peak;
}

static void test_end_step(void) {
  remat_allocator_options options;
  remat_allocator* a = NULL;
  uint64_t peak = 0;
  CHECK_OK(remat_allocator_options_init(&options));
  options.alloc_conf = "expandable_segments:True";
  CHECK_OK(remat_allocator_create(&options, &a));
  CHECK_STATUS(remat_end_step(NULL), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_end_step(a)); /* (what came before the loop) */
  one_step(a, &peak);
  CHECK(peak == 6 * MIB);
  one_step(a, &peak);
  CHECK(peak == 4 * MIB); /* T apart, gone before the peak */
  one_step(a, &peak);
  CHECK(peak == 4 * MIB); /* kept: it reserved less */
  CHECK_OK(remat_allocator_destroy(a));
  /* Fixed segments: nothing changes. */
  a = make_allocator(GIB, 0, 0);
  CHECK(a != NULL);
  CHECK_OK(remat_end_step(a));
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_oom_under_budget(void) {
  remat_allocator* a = make_allocator(GIB, 8 * MIB, 0);
  remat_stats before;
  remat_stats after;
  void* p = NULL;
  void* q = (void*)0x1;
  CHECK(a != NULL);
  CHECK_OK(remat_allocate(a, 4 * MIB, 0, &p));
  CHECK_OK(remat_get_stats(a, &before));
  CHECK_STATUS(remat_allocate(a, 16 * MIB, 0, &q), REMAT_OUT_OF_MEMORY);
  CHECK_ERROR_HAS("remat_allocate");
  CHECK_ERROR_HAS("out of memory");
  CHECK_ERROR_HAS("budget");
  CHECK(q == (void*)0x1);  /* untouched */
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.allocated_bytes == before.allocated_bytes);
  /* Raising the budget makes it fit. */
  CHECK_OK(remat_set_budget(a, 64 * MIB));
  CHECK_OK(remat_allocate(a, 16 * MIB, 0, &q));
  CHECK_OK(remat_deallocate(a, q));
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_bad_frees_change_nothing(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_stats before;
  remat_stats after;
  void* p = NULL;
  void* keep = NULL;
  int local = 0;
  CHECK(a != NULL);
  CHECK_OK(remat_allocate(a, 4096, 0, &keep));
  CHECK_OK(remat_allocate(a, 4096, 0, &p));
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_get_stats(a, &before));

  CHECK_STATUS(remat_deallocate(a, p), REMAT_INVALID_ARGUMENT);  /* double free */
  CHECK_ERROR_HAS("remat_deallocate");
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(same_stats(&before, &after));

  CHECK_STATUS(remat_deallocate(a, &local), REMAT_INVALID_ARGUMENT);  /* foreign */
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(same_stats(&before, &after));

  CHECK_STATUS(remat_deallocate(a, (char*)keep + 512), REMAT_INVALID_ARGUMENT);  /* interior */
  CHECK_STATUS(remat_deallocate_on_stream(a, &local, 0), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_record_stream(a, &local, 0), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(same_stats(&before, &after));

  CHECK_OK(remat_deallocate(a, keep));
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_zero_and_enormous_sizes(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_stats before;
  remat_stats after;
  void* p = (void*)0x1;
  CHECK(a != NULL);
  CHECK_OK(remat_get_stats(a, &before));
  CHECK_OK(remat_allocate(a, 0, 0, &p));
  CHECK(p == NULL);
  CHECK_OK(remat_deallocate(a, p));
  p = (void*)0x1;
  CHECK_STATUS(remat_allocate(a, (size_t)-1, 0, &p), REMAT_INVALID_ARGUMENT);
  CHECK(p == (void*)0x1);
  CHECK_STATUS(remat_allocate(a, (size_t)(GIB + 1), 0, &p), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_allocate(a, (size_t)-1 - 100, 0, &p), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(after.allocated_bytes == 0 && after.reserved_bytes == 0 && after.num_ooms == 0);
  CHECK(same_stats(&before, &after));
  CHECK_OK(remat_allocator_destroy(a));
}

static void count_call(void* counter) { ++*(int*)counter; }

static void test_streams_and_host_work(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  uint64_t s1 = 0;
  uint64_t s2 = 0;
  void* p = NULL;
  int calls = 0;
  remat_stats stats;
  CHECK(a != NULL);
  CHECK_OK(remat_stream_create(a, &s1));
  CHECK_OK(remat_stream_create(a, &s2));
  CHECK(s1 != 0 && s2 != 0 && s1 != s2);
  CHECK_OK(remat_allocate(a, 64 * KIB, s1, &p));
  CHECK_OK(remat_record_stream(a, p, s2));
  CHECK_OK(remat_launch_host_func(a, s2, count_call, &calls, 1000));
  CHECK_OK(remat_deallocate_on_stream(a, p, s1));
  CHECK_OK(remat_get_stats(a, &stats));
  /* Used on s2, whose work has not run: the free waits for it. */
  CHECK(stats.allocated_bytes == 0);
  CHECK(calls == 0);
  CHECK_OK(remat_stream_synchronize(a, s2));
  CHECK(calls == 1);
  CHECK_OK(remat_stream_synchronize(a, s1));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK_STATUS(remat_launch_host_func(a, s1, NULL, NULL, 0), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_launch_host_func(a, s1, count_call, &calls, -1), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_empty_cache(a));
  CHECK_OK(remat_stream_destroy(a, s1));
  CHECK_OK(remat_stream_destroy(a, s2));
  CHECK(remat_stream_destroy(a, s2) != REMAT_OK);  /* already gone */
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_budget_and_snapshot(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_stats stats;
  char* json = NULL;
  void* p = NULL;
  CHECK(a != NULL);
  CHECK_STATUS(remat_set_budget(a, MIB), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_set_budget(a, 2 * GIB), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_set_budget(a, 64 * MIB));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.budget_bytes == 64 * MIB);
  CHECK_OK(remat_set_budget(a, 0));
  CHECK_OK(remat_get_stats(a, &stats));
  CHECK(stats.budget_bytes == GIB);
  CHECK_OK(remat_allocate(a, 3 * MIB, 0, &p));
  CHECK_STATUS(remat_snapshot_json(a, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_snapshot_json(a, &json));
  CHECK(json != NULL && json[0] == '{');
  CHECK(strstr(json, "segments") != NULL);
  CHECK(strstr(json, "active_allocated") != NULL);
  remat_string_free(json);
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_allocator_destroy(a));
}

/* --- Runtime --------------------------------------------------------------------- */

/* out[j] = in[j] * 31 + tag + j, or tag * 7 + j without an input: what the
 * "kernel" of each tensor computes. */
static void fill(unsigned char* out, const unsigned char* in, size_t bytes, unsigned tag) {
  size_t j;
  for (j = 0; j < bytes; ++j) {
    out[j] = in != NULL ? (unsigned char)(in[j] * 31u + tag + j) : (unsigned char)(tag * 7u + j);
  }
}

typedef struct kernel {
  remat_allocator* allocator;
  unsigned tag;
  int* destroyed;  /* counts destroy calls */
  int* runs;       /* counts recompute calls */
} kernel;

typedef struct job {
  const unsigned char* in;
  unsigned char* out;
  size_t bytes;
  unsigned tag;
} job;

static void run_job(void* arg) {
  job* j = (job*)arg;
  fill(j->out, j->in, j->bytes, j->tag);
  free(j);
}

/* The recompute callback: enqueues the kernel on the stream, in stream
 * order, as a GPU kernel launch would. */
static int recompute(void* user_data, void* const* inputs, size_t num_inputs, void* output,
                     size_t bytes, uint64_t stream) {
  kernel* k = (kernel*)user_data;
  job* j = (job*)malloc(sizeof(job));
  if (j == NULL) return 1;
  j->in = num_inputs > 0 ? (const unsigned char*)inputs[0] : NULL;
  j->out = (unsigned char*)output;
  j->bytes = bytes;
  j->tag = k->tag;
  if (k->runs != NULL) ++*k->runs;
  if (remat_launch_host_func(k->allocator, stream, run_job, j, 10000) != REMAT_OK) {
    free(j);
    return 2;
  }
  return 0;
}

static void destroy_kernel(void* user_data) {
  kernel* k = (kernel*)user_data;
  ++*k->destroyed;
  free(k);
}

static kernel* new_kernel(remat_allocator* a, unsigned tag, int* destroyed, int* runs) {
  kernel* k = (kernel*)malloc(sizeof(kernel));
  if (k == NULL) abort();
  k->allocator = a;
  k->tag = tag;
  k->destroyed = destroyed;
  k->runs = runs;
  return k;
}

static void test_unknown_policy_and_one_runtime_per_allocator(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_runtime* rt = NULL;
  remat_runtime* second = NULL;
  remat_runtime_options options;
  CHECK(a != NULL);
  CHECK_STATUS(remat_runtime_create(a, "belady-ish", &rt), REMAT_INVALID_ARGUMENT);
  CHECK(rt == NULL);
  CHECK_ERROR_HAS("belady-ish");
  CHECK(strncmp(remat_last_error(), "remat_runtime_create:", 21) == 0); /* names its caller */
  CHECK_ERROR_HAS("lru");
  CHECK_ERROR_HAS("largest");
  CHECK_ERROR_HAS("dtr");
  CHECK_STATUS(remat_runtime_create(a, "dtr:no_such_knob=3", &rt), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("no_such_knob");

  CHECK_OK(remat_runtime_options_init(&options));
  CHECK(options.enable_drop && options.enable_offload && options.host_pool_bytes > 0);
  options.policy = "largest";
  CHECK_OK(remat_runtime_create_with_options(a, &options, &rt));
  CHECK(rt != NULL);
  CHECK_STATUS(remat_runtime_create(a, NULL, &second), REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_allocator_destroy(a), REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("runtime");
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_runtime_create(a, NULL, &second));  /* NULL: the default policy */
  CHECK_OK(remat_runtime_destroy(second));
  CHECK_OK(remat_allocator_destroy(a));
}

#define CHAIN 12

/* A chain x -> y1 -> ... -> y12 of 1 MiB tensors under a 4 MiB budget: most
 * are dropped, and every one comes back with the bytes it was made with. */
static void test_dropped_tensors_come_back_with_their_bytes(void) {
  const size_t bytes = (size_t)MIB;
  remat_allocator* a = make_allocator(GIB, 4 * MIB, 1);
  remat_runtime* rt = NULL;
  remat_runtime_options ropts;
  remat_runtime_stats rstats;
  uint64_t ids[CHAIN + 1];
  unsigned char* want[CHAIN + 1];
  int destroyed = 0;
  int runs = 0;
  int i;
  int dropped = 0;
  void* ptr = NULL;
  kernel x_kernel = {NULL, 1, NULL, NULL};
  x_kernel.allocator = a;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_options_init(&ropts));
  ropts.policy = "lru";
  ropts.enable_offload = 0;
  CHECK_OK(remat_runtime_create_with_options(a, &ropts, &rt));

  /* x: an input of the step, never evicted. */
  want[0] = (unsigned char*)malloc(bytes);
  fill(want[0], NULL, bytes, 1);
  CHECK_OK(remat_tensor_create(rt, bytes, NULL, 0, &ids[0], &ptr));
  CHECK(recompute(&x_kernel, NULL, 0, ptr, bytes, 0) == 0);  /* in stream order */
  CHECK_OK(remat_tensor_release(rt, ids[0]));

  for (i = 1; i <= CHAIN; ++i) {
    remat_tensor_options topts;
    void* in_ptr = NULL;
    void* out_ptr = NULL;
    kernel* k = new_kernel(a, (unsigned)(i + 1), &destroyed, &runs);
    CHECK_OK(remat_tensor_options_init(&topts));
    topts.inputs = &ids[i - 1];
    topts.num_inputs = 1;
    topts.compute_ns = 10000;
    topts.allow_drop = 1;
    topts.recompute = recompute;
    topts.user_data = k;
    topts.destroy = destroy_kernel;
    want[i] = (unsigned char*)malloc(bytes);
    fill(want[i], want[i - 1], bytes, (unsigned)(i + 1));
    /* The first computation: the input pinned, the kernel run once. */
    CHECK_OK(remat_tensor_acquire(rt, ids[i - 1], 0, &in_ptr));
    CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &ids[i], &out_ptr));
    CHECK(recompute(k, &in_ptr, 1, out_ptr, bytes, 0) == 0);
    CHECK_OK(remat_tensor_release(rt, ids[i]));
    CHECK_OK(remat_tensor_release(rt, ids[i - 1]));
  }
  CHECK(runs == CHAIN);
  for (i = 1; i <= CHAIN; ++i) {
    remat_tensor_state state;
    CHECK_OK(remat_tensor_get_state(rt, ids[i], &state));
    if (state == REMAT_TENSOR_DROPPED) ++dropped;
  }
  CHECK(dropped >= CHAIN / 2);

  /* Newest first, then oldest first: each acquire may recompute a chain. */
  for (i = CHAIN; i >= 0; i -= 3) {
    CHECK_OK(remat_tensor_acquire(rt, ids[i], 0, &ptr));
    CHECK_OK(remat_stream_synchronize(a, 0));
    CHECK(memcmp(ptr, want[i], bytes) == 0);
    CHECK_OK(remat_tensor_release(rt, ids[i]));
  }
  for (i = 0; i <= CHAIN; ++i) {
    CHECK_OK(remat_tensor_acquire(rt, ids[i], 0, &ptr));
    CHECK_OK(remat_stream_synchronize(a, 0));
    if (memcmp(ptr, want[i], bytes) != 0) {
      fprintf(stderr, "tensor %d came back with other bytes\n", i);
      CHECK(0);
    }
    CHECK_OK(remat_tensor_release(rt, ids[i]));
  }
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.drops > 0);
  CHECK(rstats.recomputes > 0);
  CHECK(rstats.tensors_created == CHAIN + 1);
  CHECK(rstats.live_tensors == CHAIN + 1);
  CHECK(rstats.pinned_by_api == 0);
  CHECK(runs == CHAIN + (int)rstats.recomputes);

  /* Freed tensors' callbacks go once nothing can need them. */
  for (i = CHAIN; i >= 0; --i) CHECK_OK(remat_tensor_free(rt, ids[i]));
  CHECK(destroyed == CHAIN);
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.live_tensors == 0 && rstats.resident_bytes == 0);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
  for (i = 0; i <= CHAIN; ++i) free(want[i]);
}

/* The caller's own eviction: a tensor dropped on request comes back with its
 * bytes; what it does not allow, a pinned tensor and bad arguments are
 * refused and change nothing. */
static void test_the_caller_evicts_a_tensor(void) {
  const size_t bytes = (size_t)MIB;
  remat_allocator* a = make_allocator(GIB, 0, 1);
  remat_runtime* rt = NULL;
  remat_runtime_stats rstats;
  remat_tensor_options topts;
  remat_tensor_state state;
  uint64_t x = 0;
  uint64_t y = 0;
  unsigned char* want_x = (unsigned char*)malloc(bytes);
  unsigned char* want_y = (unsigned char*)malloc(bytes);
  void* x_ptr = NULL;
  void* y_ptr = NULL;
  int destroyed = 0;
  int runs = 0;
  int evicted = -1;
  uint64_t freed = 7;
  kernel x_kernel = {NULL, 1, NULL, NULL};
  kernel* k = NULL;
  CHECK(a != NULL && want_x != NULL && want_y != NULL);
  x_kernel.allocator = a;
  k = new_kernel(a, 2, &destroyed, &runs);
  CHECK_OK(remat_runtime_create(a, "lru", &rt));
  fill(want_x, NULL, bytes, 1);
  fill(want_y, want_x, bytes, 2);
  CHECK_OK(remat_tensor_create(rt, bytes, NULL, 0, &x, &x_ptr));
  CHECK(recompute(&x_kernel, NULL, 0, x_ptr, bytes, 0) == 0);
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.inputs = &x;
  topts.num_inputs = 1;
  topts.allow_drop = 1;
  topts.recompute = recompute;
  topts.user_data = k;
  topts.destroy = destroy_kernel;
  CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &y, &y_ptr));
  CHECK(recompute(k, &x_ptr, 1, y_ptr, bytes, 0) == 0);
  /* Pinned (made and not yet released): refused. */
  CHECK_STATUS(remat_tensor_evict(rt, y, REMAT_EVICT_DROP, 0, &evicted),
               REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("pinned");
  CHECK(evicted == -1);
  CHECK_OK(remat_tensor_release(rt, y));
  CHECK_OK(remat_tensor_release(rt, x));
  CHECK_STATUS(remat_tensor_evict(rt, x, REMAT_EVICT_DROP, 0, NULL), REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_tensor_evict(rt, y, REMAT_EVICT_OFFLOAD, 0, NULL),
               REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_tensor_evict(rt, y, (remat_evict_action)7, 0, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_tensor_evict(rt, 999999, REMAT_EVICT_DROP, 0, NULL), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_evict(NULL, y, REMAT_EVICT_DROP, 0, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_tensor_get_state(rt, y, &state));
  CHECK(state == REMAT_TENSOR_RESIDENT);

  CHECK_OK(remat_tensor_evict(rt, y, REMAT_EVICT_DROP, 0, &evicted));
  CHECK(evicted == 1);
  CHECK_OK(remat_tensor_get_state(rt, y, &state));
  CHECK(state == REMAT_TENSOR_DROPPED);
  CHECK_OK(remat_tensor_evict(rt, y, REMAT_EVICT_DROP, 0, &evicted));
  CHECK(evicted == 0);  /* already gone */
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.drops == 1 && rstats.pressure_events == 0);
  CHECK_OK(remat_tensor_acquire(rt, y, 0, &y_ptr));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(y_ptr, want_y, bytes) == 0);
  CHECK(runs == 2);  /* made once, regenerated once */
  CHECK_OK(remat_tensor_release(rt, y));

  /* Pressure from outside: the policy frees what it can, here y alone. */
  CHECK_STATUS(remat_runtime_evict_bytes(rt, 0, 0, &freed), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_runtime_evict_bytes(NULL, 1, 0, &freed), REMAT_INVALID_ARGUMENT);
  CHECK(freed == 7);
  CHECK_OK(remat_runtime_evict_bytes(rt, 1, 0, &freed));
  CHECK(freed == bytes);
  CHECK_OK(remat_tensor_get_state(rt, y, &state));
  CHECK(state == REMAT_TENSOR_DROPPED);
  CHECK_OK(remat_runtime_evict_bytes(rt, 1, 0, &freed));
  CHECK(freed == 0);  /* nothing more can go: x has no way back */
  CHECK_OK(remat_tensor_get_state(rt, x, &state));
  CHECK(state == REMAT_TENSOR_RESIDENT);
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.drops == 2 && rstats.pressure_events >= 1);
  CHECK_OK(remat_tensor_acquire(rt, y, 0, &y_ptr));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(y_ptr, want_y, bytes) == 0);
  CHECK(runs == 3);
  CHECK_OK(remat_tensor_release(rt, y));

  /* Dropped again, and brought back from the caller's own copy: nothing
   * runs, the caller writes the bytes, a release ends the pin. */
  CHECK_STATUS(remat_tensor_refill(rt, y, 0, &y_ptr), REMAT_FAILED_PRECONDITION);  /* resident */
  CHECK_STATUS(remat_tensor_refill(rt, 999999, 0, &y_ptr), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_refill(NULL, y, 0, &y_ptr), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_tensor_evict(rt, y, REMAT_EVICT_DROP, 0, &evicted));
  CHECK(evicted == 1);
  y_ptr = NULL;
  CHECK_OK(remat_tensor_refill(rt, y, 0, &y_ptr));
  CHECK(y_ptr != NULL);
  CHECK_OK(remat_tensor_get_state(rt, y, &state));
  CHECK(state == REMAT_TENSOR_RESIDENT);
  memcpy(y_ptr, want_y, bytes);
  CHECK_OK(remat_tensor_release(rt, y));
  CHECK_OK(remat_tensor_acquire(rt, y, 0, &y_ptr));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(y_ptr, want_y, bytes) == 0);
  CHECK(runs == 3);  /* refilled, not regenerated */
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.refills == 1);
  CHECK_OK(remat_tensor_release(rt, y));
  CHECK_STATUS(remat_tensor_release(rt, y), REMAT_FAILED_PRECONDITION);  /* one pin each */
  CHECK_OK(remat_tensor_free(rt, y));
  CHECK_OK(remat_tensor_free(rt, x));
  CHECK(destroyed == 1);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
  free(want_x);
  free(want_y);
}

/* Offloaded to host and back, with a prefetch, bytes intact. */
static void test_offloaded_tensor_comes_back_with_its_bytes(void) {
  const size_t bytes = 2 * (size_t)MIB;
  remat_allocator* a = make_allocator(GIB, 4 * MIB, 1);
  remat_runtime* rt = NULL;
  remat_runtime_options ropts;
  remat_tensor_options topts;
  remat_runtime_stats rstats;
  remat_tensor_state state;
  unsigned char* want = (unsigned char*)malloc(bytes);
  uint64_t z = 0;
  uint64_t big = 0;
  uint64_t view = 0;
  void* ptr = NULL;
  kernel z_kernel = {NULL, 42, NULL, NULL};
  z_kernel.allocator = a;
  CHECK(a != NULL && want != NULL);
  CHECK_OK(remat_runtime_options_init(&ropts));
  ropts.policy = "lru";
  ropts.enable_drop = 0;
  ropts.host_pool_bytes = 64 * MIB;
  CHECK_OK(remat_runtime_create_with_options(a, &ropts, &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_offload = 1;
  fill(want, NULL, bytes, 42);
  CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &z, &ptr));
  CHECK(recompute(&z_kernel, NULL, 0, ptr, bytes, 0) == 0);  /* writes in stream order */
  CHECK_OK(remat_tensor_release(rt, z));
  CHECK_OK(remat_tensor_create_view(rt, z, &view));

  /* Needs all of the budget: z goes to host. */
  CHECK_OK(remat_tensor_create(rt, 4 * MIB, NULL, 0, &big, &ptr));
  CHECK_OK(remat_tensor_get_state(rt, z, &state));
  CHECK(state == REMAT_TENSOR_OFFLOADING || state == REMAT_TENSOR_ON_HOST);
  CHECK_OK(remat_tensor_get_state(rt, view, &state));
  CHECK(state == REMAT_TENSOR_OFFLOADING || state == REMAT_TENSOR_ON_HOST);
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));

  CHECK_OK(remat_tensor_prefetch(rt, z, 0));
  CHECK_OK(remat_tensor_get_state(rt, z, &state));
  CHECK(state == REMAT_TENSOR_PREFETCHING);
  CHECK_OK(remat_tensor_acquire(rt, view, 0, &ptr));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(ptr, want, bytes) == 0);
  CHECK_OK(remat_tensor_release(rt, view));
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.offloads == 1 && rstats.prefetches == 1);
  CHECK(rstats.offloaded_bytes == bytes && rstats.restored_bytes == bytes);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
  free(want);
}

/* copy_ahead with read_only tensors: once the budget has bound (x offloaded
 * for d), y, lru's next offload, is copied out while it stays resident; e's
 * pressure then offloads it with that copy, and it comes back with its bytes. */
static void test_copies_made_ahead(void) {
  const size_t bytes = 2 * (size_t)MIB;
  remat_allocator* a = make_allocator(GIB, 8 * MIB, 1);
  remat_runtime* rt = NULL;
  remat_runtime_options ropts;
  remat_tensor_options topts;
  remat_tensor_options costly;
  remat_runtime_stats rstats;
  remat_tensor_state state;
  unsigned char* want = (unsigned char*)malloc(bytes);
  uint64_t x = 0, y = 0, c = 0, d = 0, e = 0;
  void* ptr = NULL;
  kernel y_kernel = {NULL, 43, NULL, NULL};
  y_kernel.allocator = a;
  CHECK(a != NULL && want != NULL);
  CHECK_OK(remat_runtime_options_init(&ropts));
  CHECK(ropts.copy_ahead == 0);
  ropts.policy = "lru";
  ropts.enable_drop = 0;
  ropts.host_pool_bytes = 64 * MIB;
  ropts.copy_ahead = 1;
  CHECK_OK(remat_runtime_create_with_options(a, &ropts, &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  CHECK(topts.read_only == 0);
  topts.allow_offload = 1;
  topts.read_only = 1;
  CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &x, &ptr));
  CHECK_OK(remat_tensor_release(rt, x));
  CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &y, &ptr));
  CHECK(recompute(&y_kernel, NULL, 0, ptr, bytes, 0) == 0);
  fill(want, NULL, bytes, 43);
  CHECK_OK(remat_tensor_release(rt, y));
  CHECK_OK(remat_tensor_create(rt, 3 * MIB, NULL, 0, &c, &ptr));
  CHECK_OK(remat_tensor_release(rt, c));
  CHECK_OK(remat_tensor_options_init(&costly));
  costly.compute_ns = 1000000; /* time for the link to copy y */
  CHECK_OK(remat_tensor_create(rt, bytes, &costly, 0, &d, &ptr));
  CHECK_OK(remat_tensor_release(rt, d));
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.offloads == 1 && rstats.copies_ahead == 1 && rstats.ahead_offloads == 0);
  CHECK_OK(remat_tensor_get_state(rt, y, &state));
  CHECK(state == REMAT_TENSOR_RESIDENT);

  CHECK_OK(remat_tensor_create(rt, bytes, NULL, 0, &e, &ptr));
  CHECK_OK(remat_tensor_release(rt, e));
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.offloads == 2 && rstats.ahead_offloads == 1);
  CHECK_OK(remat_tensor_free(rt, e));
  CHECK_OK(remat_tensor_acquire(rt, y, 0, &ptr));
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(ptr, want, bytes) == 0);
  CHECK_OK(remat_tensor_release(rt, y));
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
  free(want);
}

static int failing_recompute(void* user_data, void* const* inputs, size_t num_inputs,
                             void* output, size_t bytes, uint64_t stream) {
  (void)inputs;
  (void)num_inputs;
  (void)output;
  (void)bytes;
  (void)stream;
  ++*(int*)user_data;
  remat_recompute_set_error("kernel launch failed: too many resources requested");
  return 7;
}

static void test_failing_callback_reaches_acquire(void) {
  remat_allocator* a = make_allocator(GIB, 4 * MIB, 1);
  remat_runtime* rt = NULL;
  remat_tensor_options topts;
  remat_tensor_state state;
  remat_stats before;
  remat_stats after;
  uint64_t t = 0;
  uint64_t big = 0;
  void* ptr = (void*)0x1;
  int calls = 0;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_create(a, "lru", &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_drop = 1;
  topts.recompute = failing_recompute;
  topts.user_data = &calls;
  CHECK_OK(remat_tensor_create(rt, 2 * MIB, &topts, 0, &t, NULL));
  CHECK_OK(remat_tensor_release(rt, t));
  CHECK_OK(remat_tensor_create(rt, 4 * MIB, NULL, 0, &big, NULL));
  CHECK_OK(remat_tensor_get_state(rt, t, &state));
  CHECK(state == REMAT_TENSOR_DROPPED);
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));
  CHECK_OK(remat_get_stats(a, &before));

  ptr = (void*)0x1;
  CHECK_STATUS(remat_tensor_acquire(rt, t, 0, &ptr), REMAT_INTERNAL);
  CHECK_ERROR_HAS("remat_tensor_acquire");
  CHECK_ERROR_HAS("returned 7");
  CHECK_ERROR_HAS("too many resources requested");
  CHECK(ptr == (void*)0x1);
  CHECK(calls == 1);
  CHECK_OK(remat_tensor_get_state(rt, t, &state));
  CHECK(state == REMAT_TENSOR_DROPPED);
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(after.allocated_bytes == before.allocated_bytes);
  /* Not pinned by the failed acquire. */
  CHECK_STATUS(remat_tensor_release(rt, t), REMAT_FAILED_PRECONDITION);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_release_and_free_errors(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_runtime* rt = NULL;
  remat_runtime_stats rstats;
  remat_tensor_state state;
  uint64_t t = 0;
  uint64_t id_out = 12345;
  void* p1 = NULL;
  void* p2 = NULL;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_create(a, "dtr", &rt));
  CHECK_OK(remat_tensor_create(rt, 8 * KIB, NULL, 0, &t, &p1));
  CHECK_OK(remat_tensor_release(rt, t));
  /* Released once already: nothing of ours pins it. */
  CHECK_STATUS(remat_tensor_release(rt, t), REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("not pinned");
  CHECK_STATUS(remat_tensor_release(rt, 999999), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_acquire(rt, 999999, 0, &p1), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_free(rt, 999999), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_prefetch(rt, 999999, 0), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_get_state(rt, 999999, &state), REMAT_NOT_FOUND);
  CHECK_STATUS(remat_tensor_create_view(rt, 999999, &id_out), REMAT_NOT_FOUND);
  CHECK(id_out == 12345);

  /* Pins count. */
  CHECK_OK(remat_tensor_acquire(rt, t, 0, &p1));
  CHECK_OK(remat_tensor_acquire(rt, t, 0, &p2));
  CHECK(p1 == p2);
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.pinned_by_api == 2);
  CHECK_OK(remat_tensor_release(rt, t));
  CHECK_OK(remat_tensor_release(rt, t));
  CHECK_STATUS(remat_tensor_release(rt, t), REMAT_FAILED_PRECONDITION);

  /* Freed while pinned: it goes with its last pin. */
  CHECK_OK(remat_tensor_acquire(rt, t, 0, &p1));
  CHECK_OK(remat_tensor_free(rt, t));
  CHECK_STATUS(remat_tensor_free(rt, t), REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_tensor_acquire(rt, t, 0, &p2), REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("freed");
  CHECK_OK(remat_tensor_release(rt, t));
  CHECK_OK(remat_runtime_get_stats(rt, &rstats));
  CHECK(rstats.live_tensors == 0 && rstats.resident_bytes == 0 && rstats.pinned_by_api == 0);

  /* A droppable tensor needs a callback; NULL id_out is refused. */
  {
    remat_tensor_options topts;
    CHECK_OK(remat_tensor_options_init(&topts));
    topts.allow_drop = 1;
    CHECK_STATUS(remat_tensor_create(rt, KIB, &topts, 0, &t, NULL), REMAT_INVALID_ARGUMENT);
    CHECK_ERROR_HAS("recompute");
    CHECK_STATUS(remat_tensor_create(rt, KIB, NULL, 0, NULL, NULL), REMAT_INVALID_ARGUMENT);
    topts.allow_drop = 0;
    topts.num_inputs = 1;
    CHECK_STATUS(remat_tensor_create(rt, KIB, &topts, 0, &t, NULL), REMAT_INVALID_ARGUMENT);
  }
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

static int never_called(void* user_data, void* const* inputs, size_t num_inputs, void* output,
                        size_t bytes, uint64_t stream) {
  (void)user_data;
  (void)inputs;
  (void)num_inputs;
  (void)output;
  (void)bytes;
  (void)stream;
  return 0;
}

static void count_destroy(void* counter) { ++*(int*)counter; }

/* destroy runs exactly once on every path: failed creates, freed tensors,
 * the runtime's end (with pins still held). */
static void test_user_data_destroyed_once(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_runtime* rt = NULL;
  remat_tensor_options topts;
  uint64_t missing = 4242;
  uint64_t t1 = 0;
  uint64_t t2 = 0;
  int destroyed = 0;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_create(a, "lru", &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_drop = 1;
  topts.recompute = never_called;
  topts.user_data = &destroyed;
  topts.destroy = count_destroy;

  CHECK_STATUS(remat_tensor_create(NULL, KIB, &topts, 0, &t1, NULL), REMAT_INVALID_ARGUMENT);
  CHECK(destroyed == 1);
  topts.inputs = &missing;
  topts.num_inputs = 1;
  CHECK_STATUS(remat_tensor_create(rt, KIB, &topts, 0, &t1, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("4242");
  CHECK(destroyed == 2);
  topts.inputs = NULL;
  topts.num_inputs = 0;

  CHECK_OK(remat_tensor_create(rt, KIB, &topts, 0, &t1, NULL));
  CHECK_OK(remat_tensor_create(rt, KIB, &topts, 0, &t2, NULL));
  CHECK(destroyed == 2);
  CHECK_OK(remat_tensor_release(rt, t1));
  CHECK_OK(remat_tensor_free(rt, t1));
  CHECK(destroyed == 3);
  /* t2 still pinned by its create: the runtime's end releases it. */
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK(destroyed == 4);
  CHECK_OK(remat_allocator_destroy(a));
}

/* remat_last_error keeps the last failure across successful calls. */
static void test_last_error_survives_success(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  void* p = NULL;
  CHECK(a != NULL);
  CHECK_STATUS(remat_deallocate(a, &p), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_allocate(a, KIB, 0, &p));
  CHECK_ERROR_HAS("remat_deallocate");
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_allocator_destroy(a));
}

typedef void (*test_fn)(void);
typedef struct test_case {
  const char* name;
  test_fn fn;
} test_case;

/* A call of three 2 MiB outputs: output i is filled with 0x50 + i. */
typedef struct call_state {
  remat_runtime* rt;
  uint64_t side;  /* acquired from inside the callback */
  int runs;
  int side_ok;
} call_state;

static int three_outputs(void* user_data, void* const* inputs, size_t num_inputs,
                         void* const* outputs, const size_t* output_bytes, const int* regenerate,
                         size_t num_outputs, uint64_t stream) {
  call_state* st = (call_state*)user_data;
  size_t i;
  void* p = NULL;
  (void)inputs;
  (void)num_inputs;
  (void)stream;
  ++st->runs;
  /* Back into the API: the callback runs without the runtime's lock. */
  if (remat_tensor_acquire(st->rt, st->side, 0, &p) == REMAT_OK) {
    st->side_ok = remat_tensor_release(st->rt, st->side) == REMAT_OK;
  }
  for (i = 0; i < num_outputs; ++i) {
    if (regenerate[i]) memset(outputs[i], 0x50 + (int)i, output_bytes[i]);
  }
  return 0;
}

/* The runtime of the call tests (lru, 8 MiB live, drops only) over `a`, into
 * *rt_out, with the side tensor the callback acquires, and the call's options. */
static void make_call_runtime(remat_allocator* a, call_state* st, remat_call_options* copts,
                              remat_runtime** rt_out) {
  remat_runtime* rt = NULL;
  remat_runtime_options ro;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_options_init(&ro));
  ro.policy = "lru";
  ro.live_budget = 8 * MIB;
  ro.enable_offload = 0;
  CHECK_OK(remat_runtime_create_with_options(a, &ro, &rt));
  st->rt = rt;
  CHECK_OK(remat_tensor_create(rt, 1 * MIB, NULL, 0, &st->side, NULL));
  CHECK_OK(remat_tensor_release(rt, st->side));
  memset(copts, 0, sizeof(*copts));
  copts->compute_ns = 4000;
  copts->allow_drop = 1;
  copts->recompute = three_outputs;
  copts->user_data = st;
  *rt_out = rt;
}

static void test_a_call_is_recomputed_once(void) {
  remat_allocator* a = make_allocator(GIB, 0, 1);
  remat_runtime* rt = NULL;
  remat_call_options copts;
  call_state st = {0};
  size_t sizes[3] = {2 * MIB, 2 * MIB, 2 * MIB};
  uint64_t ids[3] = {0};
  void* ptrs[3] = {0};
  uint64_t big = 0;
  size_t i;
  make_call_runtime(a, &st, &copts, &rt);
  CHECK(rt != NULL);
  CHECK_STATUS(remat_call_create(rt, 0, sizes, &copts, 0, ids, ptrs), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_call_create(rt, 3, NULL, &copts, 0, ids, ptrs), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("output_bytes");
  CHECK_STATUS(remat_call_create(rt, 3, sizes, &copts, 0, NULL, ptrs), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("ids_out");
  CHECK_STATUS(remat_call_create(NULL, 3, sizes, &copts, 0, ids, ptrs), REMAT_INVALID_ARGUMENT);
  copts.num_inputs = 1; /* inputs NULL */
  CHECK_STATUS(remat_call_create(rt, 3, sizes, &copts, 0, ids, ptrs), REMAT_INVALID_ARGUMENT);
  copts.num_inputs = 0;
  CHECK(ids[0] == 0);
  CHECK_OK(remat_call_create(rt, 3, sizes, &copts, 0, ids, ptrs));
  for (i = 0; i < 3; ++i) {
    memset(ptrs[i], 0x50 + (int)i, 2 * MIB);
    CHECK_OK(remat_tensor_release(rt, ids[i]));
  }
  CHECK_OK(remat_tensor_create(rt, 6 * MIB, NULL, 0, &big, NULL)); /* all three go */
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));
  for (i = 0; i < 3; ++i) {
    void* p = NULL;
    remat_tensor_state state;
    CHECK_OK(remat_tensor_acquire(rt, ids[i], 0, &p));
    CHECK(((unsigned char*)p)[2 * MIB - 1] == 0x50 + i);
    CHECK_OK(remat_tensor_get_state(rt, ids[i], &state));
    CHECK(state == REMAT_TENSOR_RESIDENT);
    CHECK_OK(remat_tensor_release(rt, ids[i]));
  }
  CHECK(st.runs == 1);
  CHECK(st.side_ok == 1);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

/* A call that learns of its second output after it was made: both come back
 * in one run of its callback. */
static void test_an_output_added_later_comes_back_in_the_same_run(void) {
  remat_allocator* a = make_allocator(GIB, 0, 1);
  remat_runtime* rt = NULL;
  remat_call_options copts;
  call_state st = {0};
  size_t one = 2 * MIB;
  uint64_t ids[2] = {0}, big = 0, none = 0;
  void* ptrs[2] = {0};
  void* p = NULL;
  make_call_runtime(a, &st, &copts, &rt);
  CHECK(rt != NULL);
  CHECK_OK(remat_call_create(rt, 1, &one, &copts, 0, &ids[0], &ptrs[0]));
  memset(ptrs[0], 0x50, 2 * MIB);
  CHECK_OK(remat_call_add_output(rt, ids[0], 2 * MIB, 1, 0, 0, &ids[1], &ptrs[1]));
  memset(ptrs[1], 0x51, 2 * MIB);
  CHECK_OK(remat_tensor_release(rt, ids[0]));
  CHECK_OK(remat_tensor_release(rt, ids[1]));
  /* Refused: a tensor made by remat_tensor_create, no id_out, no such id. */
  CHECK_STATUS(remat_call_add_output(rt, st.side, MIB, 1, 0, 0, &none, NULL),
               REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("remat_call_create");
  CHECK_STATUS(remat_call_add_output(rt, ids[0], MIB, 1, 0, 0, NULL, NULL),
               REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_call_add_output(rt, 12345, MIB, 1, 0, 0, &none, NULL), REMAT_NOT_FOUND);
  CHECK(none == 0);
  CHECK_OK(remat_tensor_create(rt, 6 * MIB, NULL, 0, &big, NULL)); /* both go */
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));
  CHECK_OK(remat_tensor_acquire(rt, ids[1], 0, &p));
  CHECK(((unsigned char*)p)[2 * MIB - 1] == 0x51);
  CHECK_OK(remat_tensor_release(rt, ids[1]));
  CHECK_OK(remat_tensor_acquire(rt, ids[0], 0, &p));
  CHECK(((unsigned char*)p)[0] == 0x50);
  CHECK_OK(remat_tensor_release(rt, ids[0]));
  CHECK(st.runs == 1);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

typedef struct event_log {
  int kinds[64];
  uint64_t tensors[64];
  int pressure[64];
  uint64_t streams[64];
  int refill[64];
  int count;
} event_log;

static void log_event(void* user_data, const remat_event* e) {
  event_log* log = (event_log*)user_data;
  if (log->count < 64) {
    log->kinds[log->count] = (int)e->kind;
    log->tensors[log->count] = e->tensor;
    log->pressure[log->count] = e->pressure;
    log->streams[log->count] = e->stream;
    log->refill[log->count] = e->refill;
  }
  ++log->count;
}

static int fill_byte(void* user_data, void* const* inputs, size_t num_inputs, void* output,
                     size_t bytes, uint64_t stream) {
  (void)user_data;
  (void)inputs;
  (void)num_inputs;
  (void)stream;
  memset(output, 0x33, bytes);
  return 0;
}

/* A step that repeats: from the second on, belady goes by the one before. */
static void belady_step(remat_runtime* rt, int* failed, uint64_t* recomputes) {
  uint64_t ids[6], work = 0;
  remat_tensor_options topts;
  remat_runtime_stats before, after;
  void* p = NULL;
  int i;
  CHECK_OK(remat_runtime_get_stats(rt, &before));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_drop = 1;
  topts.recompute = fill_byte;
  topts.compute_ns = 1000;
  for (i = 0; i < 6; ++i) {
    CHECK_OK(remat_tensor_create(rt, 4 * MIB, &topts, 0, &ids[i], &p));
    memset(p, 0x33, 4 * MIB);
    CHECK_OK(remat_tensor_release(rt, ids[i]));
  }
  for (i = 0; i < 6; ++i) {
    remat_tensor_options wopts;
    CHECK_OK(remat_tensor_acquire(rt, ids[i], 0, &p));
    *failed |= ((unsigned char*)p)[4 * MIB - 1] != 0x33;
    CHECK_OK(remat_tensor_release(rt, ids[i]));
    CHECK_OK(remat_tensor_options_init(&wopts));
    wopts.compute_ns = 200000; /* the work between two uses */
    CHECK_OK(remat_tensor_create(rt, 64 * 1024, &wopts, 0, &work, NULL));
    CHECK_OK(remat_tensor_release(rt, work));
    CHECK_OK(remat_tensor_free(rt, work));
  }
  for (i = 0; i < 6; ++i) CHECK_OK(remat_tensor_free(rt, ids[i]));
  CHECK_OK(remat_runtime_end_step(rt));
  CHECK_OK(remat_runtime_get_stats(rt, &after));
  *recomputes = after.recomputes - before.recomputes;
}

static void test_learned_next_uses(void) {
  remat_allocator* a = make_allocator(GIB, 0, 1);
  remat_runtime* rt = NULL;
  remat_runtime_options ro;
  remat_runtime_stats st;
  uint64_t first = 0, second = 0;
  int failed = 0;
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_options_init(&ro));
  CHECK(ro.learn_next_use == 0);
  ro.policy = "belady";
  ro.enable_offload = 0;
  ro.live_budget = 13 * MIB;
  CHECK_OK(remat_runtime_create_with_options(a, &ro, &rt));
  CHECK_STATUS(remat_runtime_end_step(rt), REMAT_FAILED_PRECONDITION);
  CHECK_ERROR_HAS("learn_next_use");
  CHECK_OK(remat_runtime_destroy(rt));
  ro.learn_next_use = 1;
  CHECK_OK(remat_runtime_create_with_options(a, &ro, &rt));
  belady_step(rt, &failed, &first);
  belady_step(rt, &failed, &second);
  CHECK(failed == 0);
  CHECK(second < first);
  CHECK_OK(remat_runtime_get_stats(rt, &st));
  CHECK(st.steps_ended == 2);
  CHECK(st.learned_next_uses > 0);
  CHECK_STATUS(remat_runtime_end_step(NULL), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

/* A framework's trial of two plans through the planner: each plan's runtime
 * runs the same step (a learning step, then a timed one), the caller times
 * it (here by its recomputes, each costing its compute_ns), and the plan
 * whose timed step was quicker is kept; the other's runtime goes. */
static void test_planner_drives_a_trial(void) {
  remat_plan plans[2];
  remat_planner_options po;
  remat_planner* planner = NULL;
  remat_planner_step step;
  remat_planner_state ps;
  remat_plan_state plan_state;
  remat_allocator* allocators[2] = {NULL, NULL};
  remat_runtime* runtimes[2] = {NULL, NULL};
  uint64_t recomputes[2][2] = {{0, 0}, {0, 0}};
  int64_t times[4];
  char* refusal = NULL;
  int failed = 0;
  int i;
  memset(plans, 0, sizeof(plans));
  plans[0].name = "lru";
  plans[0].policy_spec = "lru";
  plans[0].allow_drop = 1;
  plans[1].name = "belady";
  plans[1].policy_spec = "belady";
  plans[1].allow_drop = 1;
  CHECK_OK(remat_planner_options_init(&po));
  CHECK(po.learning_steps == 1 && po.timed_steps == 2);
  po.timed_steps = 1;
  CHECK_OK(remat_planner_create(plans, 2, &po, &planner));
  for (i = 0; i < 4; ++i) {
    remat_runtime_options ro;
    uint64_t n = 0;
    CHECK_OK(remat_planner_step_begin(planner, &step));
    CHECK(step.in_trial && step.plan == (size_t)(i / 2) && step.timed == (i % 2));
    CHECK(!step.fresh_runtime);
    if (runtimes[step.plan] == NULL) {
      allocators[step.plan] = make_allocator(GIB, 0, 1);
      CHECK_OK(remat_runtime_options_init(&ro));
      ro.policy = plans[step.plan].policy_spec;
      ro.enable_offload = plans[step.plan].allow_offload;
      ro.enable_drop = plans[step.plan].allow_drop;
      ro.live_budget = 13 * MIB;
      ro.learn_next_use = 1;
      CHECK_OK(remat_runtime_create_with_options(allocators[step.plan], &ro,
                                                 &runtimes[step.plan]));
    }
    belady_step(runtimes[step.plan], &failed, &n);
    recomputes[step.plan][i % 2] = n;
    CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_FIT, (int64_t)n * 1000 + 1, NULL));
  }
  CHECK(failed == 0);
  /* belady, with the next uses learned from its first step, recomputes less. */
  CHECK(recomputes[1][1] < recomputes[0][1]);
  CHECK_OK(remat_planner_get_state(planner, &ps));
  CHECK(!ps.in_trial && ps.trial_done && ps.kept_plan == 1 && ps.steps_ended == 4);
  CHECK_OK(remat_planner_get_plan(planner, 0, &plan_state, times, 4, &refusal));
  CHECK(!plan_state.live && !plan_state.refused && refusal == NULL);
  CHECK(plan_state.num_times == 1 && times[0] == (int64_t)recomputes[0][1] * 1000 + 1);
  CHECK_OK(remat_planner_get_plan(planner, 1, &plan_state, NULL, 0, NULL));
  CHECK(plan_state.live && plan_state.runtime_steps == 2 && plan_state.learns_fits);
  /* The caller lets the plan not kept go; the next step runs the kept one. */
  CHECK_OK(remat_runtime_destroy(runtimes[0]));
  runtimes[0] = NULL;
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK(step.plan == 1 && !step.in_trial && !step.timed);
  CHECK_STATUS(remat_planner_step_begin(planner, &step), REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_planner_step_end(planner, REMAT_STEP_FIT, -1, NULL),
               REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_planner_step_end(planner, (remat_step_outcome)9, 0, NULL),
               REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("unknown step outcome 9");
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_FIT, 5, NULL));
  CHECK_STATUS(remat_planner_step_end(planner, REMAT_STEP_FIT, 5, NULL),
               REMAT_FAILED_PRECONDITION);
  CHECK_STATUS(remat_planner_get_plan(planner, 2, &plan_state, NULL, 0, NULL),
               REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_planner_runtime_restarted(planner, 2), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_planner_destroy(planner));
  for (i = 0; i < 2; ++i) {
    CHECK_OK(remat_runtime_destroy(runtimes[i]));
    CHECK_OK(remat_allocator_destroy(allocators[i]));
  }

  /* A trial step that does not fit takes its plan out, with its message. */
  CHECK_OK(remat_planner_create(plans, 2, NULL, &planner));
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_TOO_SMALL, 0, "lru did not fit"));
  CHECK_OK(remat_planner_get_plan(planner, 0, &plan_state, NULL, 0, &refusal));
  CHECK(plan_state.refused && !plan_state.live && refusal != NULL &&
        strcmp(refusal, "lru did not fit") == 0);
  remat_string_free(refusal);
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK(step.plan == 1);
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_ABANDONED, 0, NULL));
  CHECK_OK(remat_planner_destroy(planner));

  /* Under a budget of places, a step that did not fit, or was stopped for
   * being slow, runs again meeting each request in one place before its
   * plan leaves the trial. The step says so; the runtime is told. */
  CHECK_OK(remat_planner_options_init(&po));
  CHECK(po.in_one_place_after_failure == 0);
  po.learning_steps = 0;
  po.timed_steps = 1;
  po.in_one_place_after_failure = 1;
  CHECK_OK(remat_planner_create(plans, 2, &po, &planner));
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK(step.plan == 0 && !step.in_one_place);
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_TOO_SMALL, 0, NULL));
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK(step.plan == 0 && step.in_one_place);
  {
    remat_allocator* a = make_allocator(GIB, 0, 0);
    remat_runtime* rt = NULL;
    CHECK_OK(remat_runtime_create(a, "lru", &rt));
    CHECK_OK(remat_runtime_set_retry_in_one_place(rt, step.in_one_place));
    CHECK_STATUS(remat_runtime_set_retry_in_one_place(NULL, 1), REMAT_INVALID_ARGUMENT);
    CHECK_OK(remat_runtime_destroy(rt));
    CHECK_OK(remat_allocator_destroy(a));
  }
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_FIT, 10, NULL));
  CHECK_OK(remat_planner_step_begin(planner, &step));
  CHECK(step.plan == 1 && !step.in_one_place);
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_TOO_SLOW, 0, "beaten"));
  CHECK_OK(remat_planner_step_begin(planner, &step));  /* once more, in one place */
  CHECK(step.plan == 1 && step.in_one_place);
  CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_TOO_SLOW, 0, "beaten"));
  CHECK_OK(remat_planner_get_plan(planner, 1, &plan_state, NULL, 0, NULL));
  CHECK(plan_state.refused);
  CHECK_OK(remat_planner_get_state(planner, &ps));
  CHECK(!ps.in_trial && ps.kept_plan == 0);
  CHECK_OK(remat_planner_destroy(planner));

  /* A step that did not fit in one place either halves its plan's split
   * limit, as many times as asked; the allocator is told. */
  CHECK_OK(remat_planner_options_init(&po));
  CHECK(po.split_limit_halvings_after_failure == 0);
  po.learning_steps = 0;
  po.timed_steps = 1;
  po.in_one_place_after_failure = 1;
  po.split_limit_halvings_after_failure = 7;
  CHECK_STATUS(remat_planner_create(plans, 2, &po, &planner), REMAT_INVALID_ARGUMENT);
  po.split_limit_halvings_after_failure = 1;
  CHECK_OK(remat_planner_create(plans, 2, &po, &planner));
  {
    static const int kInOnePlace[3] = {0, 1, 1};
    static const size_t kHalvings[3] = {0, 0, 1};
    int i;
    for (i = 0; i < 3; ++i) {
      CHECK_OK(remat_planner_step_begin(planner, &step));
      CHECK(step.plan == 0 && step.in_one_place == kInOnePlace[i] &&
            step.split_limit_halvings == kHalvings[i]);
      CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_TOO_SMALL, 0, NULL));
    }
  }
  CHECK_OK(remat_planner_get_plan(planner, 0, &plan_state, NULL, 0, NULL));
  CHECK(plan_state.refused);
  CHECK_OK(remat_planner_destroy(planner));
  {
    remat_allocator* a = make_allocator(GIB, 0, 0);
    uint64_t limit = 1;
    CHECK_OK(remat_get_max_split(a, &limit));
    CHECK(limit == 0);
    CHECK_STATUS(remat_set_max_split(a, MIB), REMAT_INVALID_ARGUMENT);
    CHECK_STATUS(remat_set_max_split(NULL, 64 * MIB), REMAT_INVALID_ARGUMENT);
    CHECK_STATUS(remat_get_max_split(a, NULL), REMAT_INVALID_ARGUMENT);
    CHECK_OK(remat_get_max_split(a, &limit));
    CHECK(limit == 0);  /* unchanged */
    CHECK_OK(remat_set_max_split(a, (64 * MIB) >> 1));
    CHECK_OK(remat_get_max_split(a, &limit));
    CHECK(limit == 32 * MIB);
    CHECK_OK(remat_set_max_split(a, 0));
    CHECK_OK(remat_get_max_split(a, &limit));
    CHECK(limit == 0);
    CHECK_OK(remat_allocator_destroy(a));
  }

  /* What steps learn by kind: a replay seen to fit in the runtime's second
   * step, and pins beside a kind, read by the steps after. */
  {
    remat_kind_seen seen;
    plans[1].policy_spec = "lru";
    CHECK_OK(remat_planner_create(plans, 1, NULL, &planner));
    CHECK_STATUS(remat_planner_kind_seen(planner, 5, 64, &seen), REMAT_FAILED_PRECONDITION);
    CHECK_STATUS(remat_planner_saw_replay(planner, 5, 64, 1), REMAT_FAILED_PRECONDITION);
    for (i = 0; i < 3; ++i) {
      CHECK_OK(remat_planner_step_begin(planner, &step));
      CHECK_OK(remat_planner_kind_seen(planner, 5, 64, &seen));
      CHECK(seen.seen_to_fit == (i == 2) && !seen.seen_to_fail);
      CHECK(seen.pinned_beside == (i == 0 ? 0u : 128u));
      CHECK_OK(remat_planner_saw_replay(planner, 5, 64, 1));
      CHECK_OK(remat_planner_saw_pinned(planner, 5, 64, 128));
      CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_FIT, 1, NULL));
    }
    CHECK_STATUS(remat_planner_kind_seen(planner, 5, 64, NULL), REMAT_INVALID_ARGUMENT);
    CHECK_OK(remat_planner_destroy(planner));
  }

  /* A drop admitted where its replay, as the runtime estimates it, fits. */
  {
    remat_allocator* a = make_allocator(GIB, 0, 0);
    remat_runtime* rt = NULL;
    remat_runtime_options ro;
    remat_tensor_options topts;
    remat_drop_admission verdict;
    uint64_t in = 0, out[REMAT_REPLAY_DEPTH + 1];
    void* p = NULL;
    CHECK_OK(remat_runtime_options_init(&ro));
    CHECK(ro.link_gbps == 25.0 && ro.link_latency_ns == 2000 && !ro.estimate_replays);
    ro.link_gbps = -1;
    CHECK_STATUS(remat_runtime_create_with_options(a, &ro, &rt), REMAT_INVALID_ARGUMENT);
    CHECK_ERROR_HAS("finite positive bandwidth");
    ro.link_gbps = 50;
    CHECK_OK(remat_runtime_create_with_options(a, &ro, &rt));
    CHECK_STATUS(remat_runtime_estimate_replay(rt, NULL, 0, 8, out), REMAT_FAILED_PRECONDITION);
    CHECK_OK(remat_runtime_destroy(rt));
    ro.estimate_replays = 1;
    CHECK_OK(remat_runtime_create_with_options(a, &ro, &rt));
    CHECK_OK(remat_tensor_options_init(&topts));
    CHECK_OK(remat_tensor_create(rt, 1000, &topts, 0, &in, &p));
    CHECK_OK(remat_tensor_release(rt, in));
    CHECK_OK(remat_runtime_estimate_replay(rt, &in, 1, 500, out));
    CHECK(out[0] == 1500 && out[REMAT_REPLAY_DEPTH] == 1500);
    plans[1].policy_spec = "lru";
    plans[0].allow_offload = 1;
    CHECK_OK(remat_planner_create(plans, 1, NULL, &planner));
    CHECK_OK(remat_planner_step_begin(planner, &step));
    CHECK_OK(remat_planner_admit_drop(planner, 1, 500, out, REMAT_REPLAY_DEPTH + 1, 3000,
                                      &verdict));
    CHECK(verdict.verdict == REMAT_DROP && verdict.copy_first);
    CHECK_OK(remat_planner_admit_drop(planner, 1, 500, out, REMAT_REPLAY_DEPTH + 1, 2999,
                                      &verdict));
    CHECK(verdict.verdict == REMAT_OFFLOAD_OVER_SHARE);
    CHECK_STATUS(remat_planner_admit_drop(planner, 1, 500, out, 3, 3000, &verdict),
                 REMAT_INVALID_ARGUMENT);
    CHECK_OK(remat_planner_step_end(planner, REMAT_STEP_FIT, 1, NULL));
    CHECK_OK(remat_planner_destroy(planner));
    plans[0].allow_offload = 0;
    CHECK_OK(remat_runtime_destroy(rt));
    CHECK_OK(remat_allocator_destroy(a));
  }

  /* Bad plans are refused, and nothing is made. */
  planner = NULL;
  plans[1].policy_spec = "no-such-policy";
  CHECK_STATUS(remat_planner_create(plans, 2, NULL, &planner), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("no-such-policy");
  plans[1].policy_spec = "lru";
  plans[1].name = "lru";
  CHECK_STATUS(remat_planner_create(plans, 2, NULL, &planner), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("two plans are named \"lru\"");
  plans[1].name = NULL;
  CHECK_STATUS(remat_planner_create(plans, 2, NULL, &planner), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_planner_create(plans, 0, NULL, &planner), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_planner_create(NULL, 1, NULL, &planner), REMAT_INVALID_ARGUMENT);
  CHECK(planner == NULL);
  CHECK_STATUS(remat_planner_step_begin(NULL, &step), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_planner_destroy(NULL));
}

/* A framework that keeps tensors itself follows the runtime through events:
 * each drop, offload, restore and recompute is told, in order, with its id. */
static void test_events_tell_each_transition(void) {
  remat_allocator* a = make_allocator(GIB, 0, 1);
  remat_runtime* rt = NULL;
  remat_runtime_options ro;
  remat_tensor_options topts;
  event_log log;
  uint64_t dropped = 0, offloaded = 0, big = 0;
  void* p = NULL;
  int i, seen_drop = 0, seen_offload = 0, seen_recompute = 0, seen_restore = 0;
  memset(&log, 0, sizeof(log));
  CHECK(a != NULL);
  CHECK_OK(remat_runtime_options_init(&ro));
  ro.policy = "lru";
  ro.live_budget = 8 * MIB;
  CHECK_STATUS(remat_runtime_create_observed(a, &ro, log_event, &log, NULL),
               REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_runtime_create_observed(a, &ro, log_event, &log, &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_drop = 1;
  topts.recompute = fill_byte;
  CHECK_OK(remat_tensor_create(rt, 4 * MIB, &topts, 0, &dropped, &p));
  memset(p, 0x33, 4 * MIB);
  CHECK_OK(remat_tensor_release(rt, dropped));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_offload = 1;
  CHECK_OK(remat_tensor_create(rt, 4 * MIB, &topts, 0, &offloaded, &p));
  CHECK_OK(remat_tensor_release(rt, offloaded));
  CHECK(log.count == 2 && log.kinds[0] == REMAT_EVENT_CREATED && log.tensors[0] == dropped);
  CHECK_OK(remat_tensor_create(rt, 8 * MIB, NULL, 0, &big, NULL)); /* both go */
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));
  CHECK_OK(remat_tensor_acquire(rt, dropped, 0, &p));
  CHECK_OK(remat_tensor_release(rt, dropped));
  CHECK_OK(remat_tensor_acquire(rt, offloaded, 0, &p));
  CHECK_OK(remat_tensor_release(rt, offloaded));
  CHECK(log.count <= 64);
  for (i = 0; i < log.count && i < 64; ++i) {
    if (log.kinds[i] == REMAT_EVENT_DROPPED && log.tensors[i] == dropped && log.pressure[i]) {
      seen_drop = 1;
    }
    if (log.kinds[i] == REMAT_EVENT_OFFLOADED && log.tensors[i] == offloaded) {
      seen_offload = log.streams[i] != 0; /* the runtime's copy stream, to order after */
    }
    if (log.kinds[i] == REMAT_EVENT_RECOMPUTED && log.tensors[i] == dropped) {
      seen_recompute = seen_drop;
    }
    if (log.kinds[i] == REMAT_EVENT_RESTORED && log.tensors[i] == offloaded) {
      seen_restore = seen_offload && !log.refill[i];
    }
  }
  CHECK(seen_drop && seen_offload && seen_recompute && seen_restore);
  /* Brought back from the program's own copy: RESTORED, with refill set. */
  CHECK_OK(remat_tensor_evict(rt, dropped, REMAT_EVICT_DROP, 0, NULL));
  CHECK_OK(remat_tensor_refill(rt, dropped, 0, &p));
  CHECK(log.count <= 64);
  CHECK(log.kinds[log.count - 1] == REMAT_EVENT_RESTORED);
  CHECK(log.tensors[log.count - 1] == dropped && log.refill[log.count - 1] == 1);
  memset(p, 0x33, 4 * MIB);
  CHECK_OK(remat_tensor_release(rt, dropped));
  CHECK_OK(remat_tensor_free(rt, dropped));
  CHECK(log.kinds[(log.count - 1) % 64] == REMAT_EVENT_COLLECTED);
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
}

/* On the simulated device a stream it never made, or one destroyed, is
 * refused by every call that takes a stream, and nothing changes. */
static void test_unknown_streams_are_refused(void) {
  remat_allocator* a = make_allocator(GIB, 0, 0);
  remat_runtime* rt = NULL;
  uint64_t s1 = 0, id = 0;
  void* p = NULL;
  remat_stats before, after;
  CHECK(a != NULL);
  CHECK_OK(remat_stream_create(a, &s1));
  CHECK_OK(remat_stream_destroy(a, s1));
  CHECK_OK(remat_get_stats(a, &before));
  CHECK_STATUS(remat_allocate(a, 4096, s1, &p), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("not a stream of this device");
  CHECK_STATUS(remat_allocate(a, 4096, 777, &p), REMAT_INVALID_ARGUMENT);
  CHECK(p == NULL);
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(same_stats(&before, &after));
  CHECK_OK(remat_allocate(a, 4096, 0, &p));
  CHECK_STATUS(remat_deallocate_on_stream(a, p, 777), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_record_stream(a, p, s1), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_runtime_create(a, "lru", &rt));
  CHECK_STATUS(remat_tensor_create(rt, 4096, NULL, 777, &id, NULL), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_tensor_create(rt, 4096, NULL, 0, &id, NULL));
  CHECK_OK(remat_tensor_release(rt, id));
  CHECK_STATUS(remat_tensor_acquire(rt, id, 777, &p), REMAT_INVALID_ARGUMENT);
  CHECK_STATUS(remat_tensor_prefetch(rt, id, s1), REMAT_INVALID_ARGUMENT);
  CHECK_OK(remat_tensor_free(rt, id));
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_get_stats(a, &after));
  CHECK(after.allocations == 0);
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_alloc_conf(void) {
  remat_allocator_options options;
  remat_allocator* a = NULL;
  remat_stats stats;
  char* json = NULL;
  void* p = NULL;
  void* q = NULL;
  CHECK_OK(remat_allocator_options_init(&options));
  CHECK(options.alloc_conf == NULL);
  options.sim_capacity_bytes = GIB;
  options.budget_bytes = 40 * MIB;
  /* A bad settings string is refused, naming the key, and makes nothing. */
  options.alloc_conf = "expandable_segments:True,backend:native";
  CHECK_STATUS(remat_allocator_create(&options, &a), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("unknown key 'backend'");
  CHECK(a == NULL);
  options.alloc_conf = "expandable_segments:True";
  CHECK_OK(remat_allocator_create(&options, &a));
  /* Two 10 MiB holes in a full 40 MiB budget serve 20 MiB: the pages move. */
  {
    void* x[4];
    int i;
    for (i = 0; i < 4; ++i) CHECK_OK(remat_allocate(a, 10 * MIB, 0, &x[i]));
    CHECK_OK(remat_deallocate(a, x[0]));
    CHECK_OK(remat_deallocate(a, x[2]));
    CHECK_OK(remat_allocate(a, 20 * MIB, 0, &p));
    CHECK_OK(remat_get_stats(a, &stats));
    CHECK(stats.reserved_bytes <= 40 * MIB);
    CHECK_OK(remat_snapshot_json(a, &json));
    CHECK(json != NULL && strstr(json, "\"is_expandable\":true") != NULL);
    remat_string_free(json);
    CHECK_OK(remat_deallocate(a, x[1]));
    CHECK_OK(remat_deallocate(a, x[3]));
  }
  CHECK_OK(remat_allocate(a, 4096, 0, &q));
  CHECK_OK(remat_deallocate(a, q));
  CHECK_OK(remat_deallocate(a, p));
  CHECK_OK(remat_allocator_destroy(a));
}

static void test_offloaded_tensor_keeps_its_address(void) {
  const size_t bytes = 6 * (size_t)MIB;
  remat_allocator_options aopts;
  remat_allocator* a = NULL;
  remat_runtime* rt = NULL;
  remat_runtime_options ropts;
  remat_tensor_options topts;
  remat_tensor_state state;
  unsigned char* want = (unsigned char*)malloc(bytes);
  uint64_t z = 0;
  uint64_t big = 0;
  void* ptr = NULL;
  void* first = NULL;
  void* big_ptr = NULL;
  kernel z_kernel = {NULL, 43, NULL, NULL};
  CHECK(want != NULL);
  CHECK_OK(remat_allocator_options_init(&aopts));
  aopts.sim_capacity_bytes = GIB;
  aopts.sim_backed = 1;
  aopts.budget_bytes = 12 * MIB;
  /* Without expandable segments there is nothing to keep an address with. */
  CHECK_OK(remat_allocator_create(&aopts, &a));
  CHECK_OK(remat_runtime_options_init(&ropts));
  CHECK(ropts.keep_addresses == 0);
  ropts.keep_addresses = 1;
  CHECK_STATUS(remat_runtime_create_with_options(a, &ropts, &rt), REMAT_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("expandable");
  CHECK_OK(remat_allocator_destroy(a));
  aopts.alloc_conf = "expandable_segments:True";
  CHECK_OK(remat_allocator_create(&aopts, &a));
  z_kernel.allocator = a;
  ropts.policy = "lru";
  ropts.enable_drop = 0;
  ropts.host_pool_bytes = 64 * MIB;
  CHECK_OK(remat_runtime_create_with_options(a, &ropts, &rt));
  CHECK_OK(remat_tensor_options_init(&topts));
  topts.allow_offload = 1;
  fill(want, NULL, bytes, 43);
  CHECK_OK(remat_tensor_create(rt, bytes, &topts, 0, &z, &first));
  CHECK(recompute(&z_kernel, NULL, 0, first, bytes, 0) == 0);
  CHECK_OK(remat_tensor_release(rt, z));
  /* z goes to the host to make room, and comes back where it was. */
  CHECK_OK(remat_tensor_create(rt, 8 * MIB, NULL, 0, &big, &big_ptr));
  CHECK_OK(remat_tensor_get_state(rt, z, &state));
  CHECK(state == REMAT_TENSOR_OFFLOADING || state == REMAT_TENSOR_ON_HOST);
  CHECK_OK(remat_tensor_release(rt, big));
  CHECK_OK(remat_tensor_free(rt, big));
  CHECK_OK(remat_tensor_acquire(rt, z, 0, &ptr));
  CHECK(ptr == first);
  CHECK_OK(remat_stream_synchronize(a, 0));
  CHECK(memcmp(ptr, want, bytes) == 0);
  CHECK_OK(remat_tensor_release(rt, z));
  CHECK_OK(remat_runtime_destroy(rt));
  CHECK_OK(remat_allocator_destroy(a));
  free(want);
}

int main(void) {
  static const test_case tests[] = {
      {"alloc_conf", test_alloc_conf},
      {"learned_next_uses", test_learned_next_uses},
      {"planner_drives_a_trial", test_planner_drives_a_trial},
      {"an_output_added_later_comes_back_in_the_same_run",
       test_an_output_added_later_comes_back_in_the_same_run},
      {"offloaded_tensor_keeps_its_address", test_offloaded_tensor_keeps_its_address},
      {"status_names_and_version", test_status_names_and_version},
      {"null_arguments", test_null_arguments},
      {"cuda_device_or_clean_failure", test_cuda_device_or_clean_failure},
      {"allocate_and_free", test_allocate_and_free},
      {"oom_under_budget", test_oom_under_budget},
      {"end_step", test_end_step},
      {"bad_frees_change_nothing", test_bad_frees_change_nothing},
      {"zero_and_enormous_sizes", test_zero_and_enormous_sizes},
      {"streams_and_host_work", test_streams_and_host_work},
      {"budget_and_snapshot", test_budget_and_snapshot},
      {"unknown_policy_and_one_runtime_per_allocator",
       test_unknown_policy_and_one_runtime_per_allocator},
      {"dropped_tensors_come_back_with_their_bytes",
       test_dropped_tensors_come_back_with_their_bytes},
      {"offloaded_tensor_comes_back_with_its_bytes", test_offloaded_tensor_comes_back_with_its_bytes},
      {"copies_made_ahead", test_copies_made_ahead},
      {"the_caller_evicts_a_tensor", test_the_caller_evicts_a_tensor},
      {"failing_callback_reaches_acquire", test_failing_callback_reaches_acquire},
      {"release_and_free_errors", test_release_and_free_errors},
      {"user_data_destroyed_once", test_user_data_destroyed_once},
      {"last_error_survives_success", test_last_error_survives_success},
      {"a_call_is_recomputed_once", test_a_call_is_recomputed_once},
      {"events_tell_each_transition", test_events_tell_each_transition},
      {"unknown_streams_are_refused", test_unknown_streams_are_refused},
  };
  size_t i;
  /* Nothing has failed on this thread yet. */
  if (strcmp(remat_last_error(), "") != 0) {
    fprintf(stderr, "remat_last_error() is not empty at start: %s\n", remat_last_error());
    return 1;
  }
  for (i = 0; i < sizeof(tests) / sizeof(tests[0]); ++i) {
    const int before = failures;
    printf("[ RUN  ] %s\n", tests[i].name);
    fflush(stdout);
    tests[i].fn();
    printf("[ %s ] %s\n", failures == before ? " OK " : "FAIL", tests[i].name);
  }
  printf("%d of %d tests failed\n", failures, (int)(sizeof(tests) / sizeof(tests[0])));
  return failures == 0 ? 0 : 1;
}
