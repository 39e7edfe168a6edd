/* remat.h: the C ABI of remat.
 *
 * A plain C99 header over remat's caching device allocator and its runtime
 * (tensors evicted under pressure by dropping them for recompute or offloading
 * them to host memory, brought back byte for byte on their next use). Link
 * with -lremat (pkg-config remat, or CMake find_package(remat) and the target
 * remat::remat).
 *
 * Errors. Every function that can fail returns a remat_status; on failure it
 * records a message, read with remat_last_error() on the same thread, and
 * leaves its out-parameters and the objects it was given as they were. A
 * successful call leaves the last message alone. No C++ exception crosses this
 * interface.
 *
 * Streams are uint64_t values: on the CUDA device, the cudaStream_t itself; on
 * the simulated device, a handle from remat_stream_create. 0 is the device's
 * default stream everywhere.
 *
 * Threads. Allocator and runtime functions may be called from any number of
 * threads at once, except the *_destroy functions, which must not race with
 * other calls on the object they destroy.
 */
#ifndef REMAT_REMAT_H_
#define REMAT_REMAT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define REMAT_API __attribute__((visibility("default")))
#else
#define REMAT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Every enum has a *_MAX_ENUM member so that it is 32 bits wide and any int
 * value the caller stores in it is a valid value in C and C++ alike (the
 * library rejects the ones it does not know). */

/* ------------------------------------------------------------------------ */
/* Status                                                                    */

typedef enum remat_status {
  REMAT_OK = 0,
  REMAT_INVALID_ARGUMENT = 1,    /* a bad pointer, id, size, option or spec */
  REMAT_OUT_OF_MEMORY = 2,       /* the budget or the device cannot hold it */
  REMAT_NOT_FOUND = 3,           /* no such tensor */
  REMAT_FAILED_PRECONDITION = 4, /* not now: no GPU, built without CUDA, object in use */
  REMAT_INTERNAL = 5,            /* a device fault, a failing callback, a bug */
  REMAT_STATUS_MAX_ENUM = 0x7FFFFFFF
} remat_status;

/* The message of the last failing call on this thread ("" if none). Valid
 * until the next failing call on this thread. */
REMAT_API const char* remat_last_error(void);
/* "REMAT_OK", "REMAT_OUT_OF_MEMORY", ...; "REMAT_UNKNOWN" for other values. */
REMAT_API const char* remat_status_name(remat_status status);
/* The library's version, "MAJOR.MINOR.PATCH". */
REMAT_API const char* remat_version(void);
/* The layout of this header's structs. It goes up whenever one of them
 * changes (a field added, say), and the library's file name changes with it
 * (libremat.so.MAJOR.MINOR), so a program built against another header does
 * not load the new library by accident. A program that loads the library by
 * path should check remat_abi_version() == REMAT_ABI_VERSION first. */
#define REMAT_ABI_VERSION 9
REMAT_API int remat_abi_version(void);
/* Frees a string this library returned (remat_snapshot_json, a plan's refusal from
 * remat_planner_get_plan). NULL is fine. */
REMAT_API void remat_string_free(char* str);

/* ------------------------------------------------------------------------ */
/* Allocator                                                                 */

typedef struct remat_allocator remat_allocator;

typedef enum remat_device_kind {
  REMAT_DEVICE_SIM = 0, /* a simulated GPU: runs anywhere, deterministic time */
  REMAT_DEVICE_CUDA = 1, /* a CUDA GPU (needs a build with the CUDA toolkit) */
  REMAT_DEVICE_KIND_MAX_ENUM = 0x7FFFFFFF
} remat_device_kind;

typedef struct remat_allocator_options {
  remat_device_kind device;
  int cuda_device;             /* the GPU's ordinal (REMAT_DEVICE_CUDA) */
  uint64_t budget_bytes;       /* cap on reserved bytes; 0: the device's capacity */
  uint64_t max_split_bytes;    /* blocks above it are never split; 0: no limit */
  uint64_t history_events;     /* allocator events kept for snapshots; 0: none */
  uint64_t sim_capacity_bytes; /* the simulated device's memory */
  int sim_backed;              /* nonzero: real host memory behind every pointer
                                * (dereferenceable); zero: addresses only */
  const char* alloc_conf;      /* allocator settings with PyTorch's keys, e.g.
                                * "expandable_segments:True,max_split_size_mb:256"
                                * (applied after max_split_bytes); NULL or "": none */
} remat_allocator_options;

/* Defaults: the simulated device, unbacked, 80 GiB, no budget. */
REMAT_API remat_status remat_allocator_options_init(remat_allocator_options* options);
/* options NULL: the defaults. */
REMAT_API remat_status remat_allocator_create(const remat_allocator_options* options,
                                              remat_allocator** out);
/* Fails (REMAT_FAILED_PRECONDITION) while a runtime uses the allocator.
 * Allocations still live are released with it. NULL is fine. */
REMAT_API remat_status remat_allocator_destroy(remat_allocator* allocator);

/* bytes of device memory usable on `stream`; *out = NULL for 0 bytes.
 * REMAT_OUT_OF_MEMORY when the budget cannot hold it (after the cache has been
 * released and the runtime, if any, has evicted what it could);
 * REMAT_INVALID_ARGUMENT for a size beyond the device. */
REMAT_API remat_status remat_allocate(remat_allocator* allocator, size_t bytes, uint64_t stream,
                                      void** out);
/* Frees on the stream the block was allocated on. NULL is fine. A pointer
 * this allocator did not return, or one already freed, is
 * REMAT_INVALID_ARGUMENT and changes nothing. */
REMAT_API remat_status remat_deallocate(remat_allocator* allocator, void* ptr);
/* Frees on `stream` (as cudaFreeAsync): the block is reusable on it at once. */
REMAT_API remat_status remat_deallocate_on_stream(remat_allocator* allocator, void* ptr,
                                                  uint64_t stream);
/* Marks that `stream` also uses the block: its free waits for that stream. */
REMAT_API remat_status remat_record_stream(remat_allocator* allocator, void* ptr,
                                           uint64_t stream);
/* Returns every whole free segment to the device. */
REMAT_API remat_status remat_empty_cache(remat_allocator* allocator);
/* 0: the device's capacity. Below 2 MiB or beyond the device is invalid. */
REMAT_API remat_status remat_set_budget(remat_allocator* allocator, uint64_t budget_bytes);
/* From the next allocation on, no free block above max_split_bytes is split
 * for a smaller request (0: no limit); blocks split before stay so. A
 * planner's step may ask for a lower limit after steps that did not fit
 * (remat_planner_step.split_limit_halvings). 1 MiB or less (the small pool's
 * requests) is REMAT_INVALID_ARGUMENT and changes nothing. */
REMAT_API remat_status remat_set_max_split(remat_allocator* allocator, uint64_t max_split_bytes);
/* The split limit in force (0: none). */
REMAT_API remat_status remat_get_max_split(remat_allocator* allocator, uint64_t* out);

typedef struct remat_stats {
  uint64_t allocated_bytes;      /* live allocations (rounded sizes) */
  uint64_t allocated_bytes_peak;
  uint64_t reserved_bytes;       /* device segments held */
  uint64_t reserved_bytes_peak;
  uint64_t active_bytes;         /* allocated, or freed and waiting for streams */
  uint64_t active_bytes_peak;
  uint64_t requested_bytes;      /* what callers asked for, before rounding */
  uint64_t requested_bytes_peak;
  uint64_t inactive_split_bytes; /* free blocks inside split segments */
  uint64_t allocations;          /* live allocations (count) */
  uint64_t allocations_peak;
  uint64_t segments;             /* device segments held (count) */
  uint64_t segments_peak;
  uint64_t num_alloc_retries;    /* rounds that released cache or asked the runtime */
  uint64_t num_ooms;
  uint64_t num_device_alloc;     /* segments reserved from the device */
  uint64_t num_device_free;      /* segments returned to it */
  uint64_t budget_bytes;         /* the budget in force */
  uint64_t device_capacity_bytes;
} remat_stats;

REMAT_API remat_status remat_get_stats(remat_allocator* allocator, remat_stats* out);
/* Peaks start again from the current values (and expandable segments give
 * back their free pages before passing what is reserved now). */
REMAT_API remat_status remat_reset_peak_stats(remat_allocator* allocator);
/* Ends a step of a program whose steps repeat (a training loop): with
 * expandable segments, the next step places its small blocks by what this one
 * did (those not live at its peak apart from those that were), and keeps doing
 * so only where that step held fewer pages at its peak than the plain step it
 * learned from (pages holding blocks: reserved bytes less free whole pages
 * cached). Call it once before the loop and after every step; without
 * expandable segments it does nothing (CachingAllocator::EndStep). */
REMAT_API remat_status remat_end_step(remat_allocator* allocator);
/* Segments, blocks, recent events and statistics as JSON; free *out with
 * remat_string_free. */
REMAT_API remat_status remat_snapshot_json(remat_allocator* allocator, char** out);

/* Streams and stream-ordered host work of the allocator's device. On CUDA,
 * these are cudaStreamCreate/Destroy/Synchronize and cudaLaunchHostFunc. */
REMAT_API remat_status remat_stream_create(remat_allocator* allocator, uint64_t* out);
REMAT_API remat_status remat_stream_destroy(remat_allocator* allocator, uint64_t stream);
/* Blocks until all work enqueued on `stream` has completed. */
REMAT_API remat_status remat_stream_synchronize(remat_allocator* allocator, uint64_t stream);
/* Enqueues fn(user_data) on `stream`, after its earlier work and before its
 * later work (on the simulated device, this is how a "kernel" writes memory
 * in stream order; cost_ns is the time it takes there, ignored on CUDA).
 * fn must not call into remat. */
REMAT_API remat_status remat_launch_host_func(remat_allocator* allocator, uint64_t stream,
                                              void (*fn)(void* user_data), void* user_data,
                                              int64_t cost_ns);

/* ------------------------------------------------------------------------ */
/* Runtime                                                                   */

typedef struct remat_runtime remat_runtime;

typedef struct remat_runtime_options {
  const char* policy;        /* an eviction-policy spec: "dtr", "lru", "largest",
                              * "dtr:staleness_exp=2"; NULL: "dtr" */
  int enable_drop;           /* nonzero: tensors may be dropped for recompute */
  int enable_offload;        /* nonzero: tensors may be offloaded to host */
  uint64_t host_pool_bytes;  /* pinned host memory for offloads */
  uint64_t live_budget;      /* cap on resident tensor bytes; 0: none */
  int keep_addresses;        /* nonzero: an offloaded tensor keeps its device address
                              * (its pages go and come back under it); needs an
                              * allocator made with "expandable_segments:True" */
  int learn_next_use;        /* nonzero: a program whose steps repeat calls
                              * remat_runtime_end_step after each, and from the
                              * second step on each tensor's next use is
                              * estimated from the step before (the k-th tensor
                              * made in a step uses as the k-th did), for the
                              * policies that read next uses (belady, hybrid)
                              * and hybrid's prefetches */
  int copy_ahead;            /* nonzero: once the budget has bound, whenever the
                              * link has time, the next read_only tensor the
                              * policy would offload is copied out while it
                              * stays resident, so that its eviction later
                              * frees it with no copy to wait for */
  double link_gbps;          /* the host link's bandwidth each way, in GB/s, that
                              * transfers are priced at for the policy (measure
                              * it on the machine: a PCIe 4 x16 link gives about
                              * 25, an H100's PCIe 5 about 50); 0: the default */
  int64_t link_latency_ns;   /* and its latency per copy (0 is none) */
  int estimate_replays;      /* nonzero: each tensor keeps an estimate of what
                              * its replay holds resident at once
                              * (remat_runtime_estimate_replay) */
} remat_runtime_options;

/* Defaults: "dtr", drop and offload enabled, 64 GiB of host pool, a link of
 * 25 GB/s and 2 us. */
REMAT_API remat_status remat_runtime_options_init(remat_runtime_options* options);
/* One runtime per allocator: it relieves the allocator's memory pressure by
 * evicting its tensors. An unknown policy is REMAT_INVALID_ARGUMENT with a
 * message listing the known ones. The allocator must outlive the runtime. */
REMAT_API remat_status remat_runtime_create(remat_allocator* allocator, const char* policy_spec,
                                            remat_runtime** out);
REMAT_API remat_status remat_runtime_create_with_options(remat_allocator* allocator,
                                                         const remat_runtime_options* options,
                                                         remat_runtime** out);
/* Ends a step of a repeating program (a training step) made with
 * learn_next_use: what its tensors did is what the next step's are expected
 * to do; tensors that outlive it lose their estimates. Call it once after
 * setting up as well (weights made before the loop would otherwise take the
 * first step's first places). REMAT_FAILED_PRECONDITION without
 * learn_next_use. */
REMAT_API remat_status remat_runtime_end_step(remat_runtime* runtime);
/* Nonzero: from the next pressure event on, an allocation the policy's plan
 * would meet with bytes freed in scattered places (none covering it) is met
 * in one place instead: the cheapest run of neighbouring blocks that covers
 * it, or as much of the policy's ranking as makes room. Zero (the default):
 * the plan is carried out and the allocator asks again. A planner's step
 * says which (remat_planner_step.in_one_place). */
REMAT_API remat_status remat_runtime_set_retry_in_one_place(remat_runtime* runtime, int on);
/* What happened to a tensor, as remat_runtime_create_observed tells it.
 * `tensor` names the storage by the id it was created with (views of it are
 * not named). A storage's events follow its states: CREATED, then
 * RECOMPUTED or RESTORED interleaved with DROPPED or OFFLOADED, then
 * COLLECTED when it is gone for good. */
typedef enum remat_event_kind {
  REMAT_EVENT_CREATED = 0,
  REMAT_EVENT_DROPPED = 1,    /* bytes freed; pressure != 0: a policy chose it */
  REMAT_EVENT_OFFLOADED = 2,  /* copied out to host memory under pressure */
  REMAT_EVENT_RESTORED = 3,   /* copied back; prefetch != 0: ahead of use; refill != 0:
                               * resident again for the owner's own copy, nothing copied */
  REMAT_EVENT_RECOMPUTED = 4, /* regenerated by its callback */
  REMAT_EVENT_COLLECTED = 5,  /* no owner and no callback needs it: gone */
  REMAT_EVENT_COPIED_AHEAD = 6, /* copied out ahead while resident (copy_ahead) */
  REMAT_EVENT_KIND_MAX_ENUM = 0x7FFFFFFF
} remat_event_kind;

typedef struct remat_event {
  remat_event_kind kind;
  uint64_t tensor;
  uint64_t bytes;
  int pressure;
  int prefetch;
  int64_t cost_ns;   /* RECOMPUTED: the run's estimated cost (first output only) */
  uint64_t stream;   /* OFFLOADED, RESTORED, RECOMPUTED, COPIED_AHEAD: the stream the
                      * work went on (order a copy of your own after it); a refill's: the
                      * stream it was asked on */
  int ahead;         /* OFFLOADED: no copy now, the one made ahead holds the bytes */
  int directed;      /* DROPPED, OFFLOADED: asked for by remat_tensor_evict (pressure is
                      * then set too: an eviction, not a release) */
  int refill;        /* RESTORED: brought back by remat_tensor_refill (the owner writes the
                      * bytes; nothing was copied or recomputed) */
} remat_event;

/* Called with the runtime's lock held, on the thread whose call caused the
 * event: it must be quick and must not call this API. */
typedef void (*remat_event_fn)(void* user_data, const remat_event* event);

/* As remat_runtime_create_with_options, and every tensor event is told to
 * on_event(user_data, event) (on_event NULL: as without). A framework that
 * keeps tensors' memory itself follows the runtime's choices this way: it
 * frees a dropped tensor, copies out an offloaded one. */
REMAT_API remat_status remat_runtime_create_observed(remat_allocator* allocator,
                                                     const remat_runtime_options* options,
                                                     remat_event_fn on_event, void* user_data,
                                                     remat_runtime** out);
/* Releases every pin still held through this API, then the runtime and all
 * its tensors. NULL is fine. */
REMAT_API remat_status remat_runtime_destroy(remat_runtime* runtime);

/* Regenerates a dropped tensor: enqueue, on `stream`, the work that writes
 * `bytes` bytes at `output` from `inputs` (the device pointers of the
 * tensor's inputs, in order, pinned during the call). Return 0 on success,
 * anything else on failure (then remat_recompute_set_error may say why).
 * It runs inside remat_tensor_acquire, on that thread, without the runtime's
 * lock: it may call this API (acquire other tensors, create and free
 * temporaries; pressure meanwhile never evicts its inputs or its output),
 * but acquiring its own tensor fails with REMAT_FAILED_PRECONDITION.
 * remat_launch_host_func and the device's own API (CUDA kernel launches) are
 * fine too. */
typedef int (*remat_recompute_fn)(void* user_data, void* const* inputs, size_t num_inputs,
                                  void* output, size_t bytes, uint64_t stream);

/* From inside a failing remat_recompute_fn: the message the failing call
 * reports after "the recompute callback returned N". */
REMAT_API remat_status remat_recompute_set_error(const char* message);

typedef struct remat_tensor_options {
  const uint64_t* inputs;      /* tensors the callback reads, in order */
  size_t num_inputs;
  int64_t compute_ns;          /* what one recompute costs (for the policy) */
  int allow_drop;              /* needs `recompute` */
  int allow_offload;
  remat_recompute_fn recompute;
  void* user_data;             /* given to recompute */
  /* Called once with user_data when it is no longer needed: when the tensor
   * can never be recomputed again, when the runtime is destroyed, or before
   * remat_tensor_create returns if it fails. NULL: nothing to do. */
  void (*destroy)(void* user_data);
  int read_only;               /* nonzero: its bytes never change after they are
                                * first written (acquires only read it); only
                                * such tensors are copied ahead (copy_ahead) */
} remat_tensor_options;

typedef enum remat_tensor_state {
  REMAT_TENSOR_RESIDENT = 0,
  REMAT_TENSOR_OFFLOADING = 1, /* device-to-host copy in flight */
  REMAT_TENSOR_ON_HOST = 2,
  REMAT_TENSOR_PREFETCHING = 3, /* host-to-device copy in flight */
  REMAT_TENSOR_DROPPED = 4,
  REMAT_TENSOR_FREED = 5,
  REMAT_TENSOR_STATE_MAX_ENUM = 0x7FFFFFFF
} remat_tensor_state;

/* Defaults: no inputs, neither drop nor offload, no callback. */
REMAT_API remat_status remat_tensor_options_init(remat_tensor_options* options);
/* Allocates and registers a tensor of `bytes` (options NULL: the defaults).
 * It is returned pinned, at *ptr_out (ptr_out may be NULL): write its first
 * contents, then remat_tensor_release it. */
REMAT_API remat_status remat_tensor_create(remat_runtime* runtime, size_t bytes,
                                           const remat_tensor_options* options, uint64_t stream,
                                           uint64_t* id_out, void** ptr_out);
/* A call with several outputs (batch norm's, an LSTM cell's): one run of the
 * callback regenerates every output it lost, charged compute_ns once. It
 * writes outputs[i] where regenerate[i] != 0; outputs[i] is NULL where that
 * output is not on the device (leave it), and an output still resident may be
 * rewritten with the same bytes. Callbacks run without the runtime's lock:
 * they may call this API (acquire other tensors, create temporaries), but
 * acquiring an output of their own call fails with REMAT_FAILED_PRECONDITION. */
typedef int (*remat_call_recompute_fn)(void* user_data, void* const* inputs, size_t num_inputs,
                                       void* const* outputs, const size_t* output_bytes,
                                       const int* regenerate, size_t num_outputs,
                                       uint64_t stream);

typedef struct remat_call_options {
  const uint64_t* inputs;
  size_t num_inputs;
  int64_t compute_ns;          /* what one run of the call costs */
  int allow_drop;              /* needs `recompute` */
  int allow_offload;
  remat_call_recompute_fn recompute;
  void* user_data;
  void (*destroy)(void* user_data);  /* as in remat_tensor_options */
  int read_only;                     /* as in remat_tensor_options; outputs added
                                      * later take the call's */
} remat_call_options;

/* Creates the call's num_outputs tensors (sizes output_bytes[i]) together,
 * each pinned as by remat_tensor_create (release each): ids_out[i] and, when
 * ptrs_out is not NULL, ptrs_out[i]. On failure nothing is created. */
REMAT_API remat_status remat_call_create(remat_runtime* runtime, size_t num_outputs,
                                         const size_t* output_bytes,
                                         const remat_call_options* options, uint64_t stream,
                                         uint64_t* ids_out, void** ptrs_out);
/* One more output of the call that made `sibling` (with remat_call_create),
 * made after it: a framework may learn of a call's outputs one by one. It
 * becomes the call's last output (the callback's outputs[num_outputs - 1]
 * from then on), shares the call's callback, inputs and cost, and comes back
 * in the same run as the others. It may be dropped only where allow_drop is
 * set and the sibling may be, and offloaded only where allow_offload is set
 * and the sibling may be. Returned
 * pinned, as by remat_tensor_create. REMAT_FAILED_PRECONDITION for a tensor
 * made by remat_tensor_create (its callback writes one output) and while the
 * call is being regenerated. */
REMAT_API remat_status remat_call_add_output(remat_runtime* runtime, uint64_t sibling,
                                             size_t bytes, int allow_drop, int allow_offload,
                                             uint64_t stream, uint64_t* id_out, void** ptr_out);
/* A second tensor over `base`'s storage: evicted and restored with it. */
REMAT_API remat_status remat_tensor_create_view(remat_runtime* runtime, uint64_t base,
                                                uint64_t* id_out);
/* Brings the tensor back if it was evicted (recomputing or copying in on
 * `stream`) and pins it: its device pointer stays valid until the matching
 * remat_tensor_release. Pins count: each acquire needs its own release.
 * On the simulated device, synchronize the stream before reading the bytes. */
REMAT_API remat_status remat_tensor_acquire(remat_runtime* runtime, uint64_t id, uint64_t stream,
                                            void** ptr_out);
/* Brings a dropped tensor back without running its call, for an owner that
 * kept a copy of its bytes: room is made as for a recompute, the tensor is
 * pinned as by remat_tensor_acquire, and the owner writes its copy into
 * *ptr_out (on `stream`) before anything reads it. For when an acquire's
 * recompute does not fit (REMAT_OUT_OF_MEMORY) but the tensor alone may.
 * REMAT_FAILED_PRECONDITION unless the tensor is dropped (and not being
 * recomputed); REMAT_OUT_OF_MEMORY when even its own bytes find no room (it
 * stays dropped; others may have been evicted on the way, as by a failed
 * acquire). Released with remat_tensor_release. An observer is told RESTORED
 * with `refill` set; remat_runtime_stats counts it in `refills`. */
REMAT_API remat_status remat_tensor_refill(remat_runtime* runtime, uint64_t id, uint64_t stream,
                                           void** ptr_out);
/* Undoes one remat_tensor_create, remat_tensor_acquire or remat_tensor_refill.
 * A tensor this API holds no pin on is REMAT_FAILED_PRECONDITION
 * (REMAT_NOT_FOUND when there is no such tensor). */
REMAT_API remat_status remat_tensor_release(remat_runtime* runtime, uint64_t id);
/* The owner's reference goes. A pinned tensor goes when its last pin does; a
 * tensor another one's callback reads stays (evictable) while that needs it. */
REMAT_API remat_status remat_tensor_free(remat_runtime* runtime, uint64_t id);
/* Starts copying an offloaded tensor back ahead of its use (no-op otherwise). */
REMAT_API remat_status remat_tensor_prefetch(remat_runtime* runtime, uint64_t id, uint64_t stream);
REMAT_API remat_status remat_tensor_get_state(remat_runtime* runtime, uint64_t id,
                                              remat_tensor_state* out);

typedef enum remat_evict_action {
  REMAT_EVICT_DROP = 0,     /* free its bytes; its callback regenerates them */
  REMAT_EVICT_OFFLOAD = 1,  /* copy it to pinned host memory and back on use */
  REMAT_EVICT_ACTION_MAX_ENUM = 0x7FFFFFFF
} remat_evict_action;

/* Evicts the tensor's storage now, as pressure would, because the caller
 * knows it will not need it for a while (a plan made ahead, a checkpointing
 * choice of its own). The next acquire brings it back. *evicted_out (may be
 * NULL): 1 when evicted now, 0 when it was not resident (dropped, on the host
 * or on its way), which changes nothing. REMAT_FAILED_PRECONDITION when it
 * is pinned or does not allow `action`; REMAT_RESOURCE_EXHAUSTED when the
 * host pool has no room for an offload; REMAT_INVALID_ARGUMENT for an
 * unknown action. The block goes back to the allocator on `stream`. */
REMAT_API remat_status remat_tensor_evict(remat_runtime* runtime, uint64_t id,
                                          remat_evict_action action, uint64_t stream,
                                          int* evicted_out);

/* Pressure from outside: memory the runtime does not allocate is short (a
 * framework's allocator could not serve a request, and the framework's
 * tensors include the ones registered here). The policy evicts, as at any
 * pressure event, until `bytes` of resident tensor storage are freed or
 * nothing more can go; the observer hears each eviction (not `directed`).
 * *freed_out (may be NULL): the bytes freed, 0 when nothing could be evicted
 * (and nothing changed). REMAT_INVALID_ARGUMENT for 0 bytes;
 * REMAT_FAILED_PRECONDITION from an event callback (which must not call this
 * API). May be called from inside a recompute callback. */
REMAT_API remat_status remat_runtime_evict_bytes(remat_runtime* runtime, uint64_t bytes,
                                                 uint64_t stream, uint64_t* freed_out);

typedef struct remat_runtime_stats {
  uint64_t tensors_created;
  uint64_t live_tensors;
  uint64_t pressure_events;
  uint64_t drops;            /* evictions that dropped */
  uint64_t released_drops;   /* freed by the owner, bytes dropped, kept for a callback */
  uint64_t offloads;
  uint64_t recomputes;
  int64_t recompute_ns;      /* estimated cost of the recomputes run */
  uint64_t offloaded_bytes;
  uint64_t restored_bytes;
  uint64_t prefetches;
  uint64_t resident_bytes;   /* tensor storage on the device now */
  uint64_t peak_resident_bytes;
  uint64_t pinned_by_api;    /* pins held through this API now */
  uint64_t learned_next_uses; /* next uses estimated from the step before */
  uint64_t steps_ended;       /* remat_runtime_end_step calls */
  uint64_t copies_ahead;      /* copies out made ahead (copy_ahead) */
  uint64_t ahead_offloads;    /* offloads that used one */
  uint64_t refills;           /* dropped tensors brought back by remat_tensor_refill */
} remat_runtime_stats;

REMAT_API remat_status remat_runtime_get_stats(remat_runtime* runtime, remat_runtime_stats* out);

/* Levels of dropped inputs a replay estimate follows (out has one more). */
#define REMAT_REPLAY_DEPTH 8

/* What a replay of a call reading `inputs` (live tensors, in the call's
 * order, each once) and making an output of `bytes` would hold resident at
 * once, were its droppable inputs dropped: out[k] follows dropped inputs k
 * levels deep (out[0]: the inputs resident), up to out[REMAT_REPLAY_DEPTH].
 * Regeneration brings a call's dropped inputs back first, one by one, each by
 * its own call's run (which brings that call's other live outputs with it),
 * then pins the resident inputs and makes the outputs beside them all.
 * REMAT_FAILED_PRECONDITION unless the runtime was made with
 * estimate_replays; REMAT_INVALID_ARGUMENT for an input not live or given
 * twice. */
REMAT_API remat_status remat_runtime_estimate_replay(remat_runtime* runtime,
                                                     const uint64_t* inputs, size_t num_inputs,
                                                     uint64_t bytes,
                                                     uint64_t out[REMAT_REPLAY_DEPTH + 1]);

/* ------------------------------------------------------------------------ */
/* Step planner                                                              */
/*
 * Which plan each training step runs under a budget, and which plan the
 * budget keeps. A budget may be met several ways (a policy's mixed plan of
 * drops and offloads, drops first, other policies); which is quickest depends
 * on the model, the budget and the link. So the first steps are a trial: each
 * plan in turn runs learning_steps untimed steps (its runtime learns the
 * step's next uses), then timed_steps timed ones, and the plan whose quickest
 * timed step was quickest is kept (a tie keeps the plan listed first). A
 * trial step that did not fit takes its plan out of the trial while another
 * is left; the last plan left stays. After the trial, a step that did not fit
 * on a runtime that had learned from earlier steps makes its plan blind:
 * each later step starts the plan's runtime afresh.
 *
 * The caller runs the steps and owns one runtime per plan (create it with the
 * plan's policy, allow_drop and allow_offload; with drop_first, offload only
 * what cannot be dropped):
 *
 *   remat_planner_step step;
 *   remat_planner_step_begin(planner, &step);      which plan, timed or not
 *   ... run the step on plans[step.plan]'s runtime (a new one where
 *       step.fresh_runtime; meeting requests in one place where
 *       step.in_one_place), timing it where step.timed ...
 *   remat_planner_step_end(planner, REMAT_STEP_FIT, elapsed_ns, NULL);
 *
 * then destroys the runtimes of plans remat_planner_get_plan says are no
 * longer live. One step at a time per planner. */

typedef struct remat_planner remat_planner;

typedef struct remat_plan {
  const char* name;        /* shown to users; non-empty and unique (copied) */
  const char* policy_spec; /* the policy its runtime runs; checked (copied) */
  int allow_drop;
  int allow_offload;
  int drop_first;          /* with both allowed: drop before offloading */
} remat_plan;

typedef struct remat_planner_options {
  size_t learning_steps; /* per plan in the trial, first, untimed (default 1) */
  size_t timed_steps;    /* per plan in the trial, at least 1 (default 2) */
  int in_one_place_after_failure; /* nonzero, for a budget of reserved bytes
                          * (places): a step that did not fit makes its
                          * plan's next steps (the same trial step again, in
                          * a trial) meet each request in one place, once,
                          * before the plan is refused or made blind
                          * (default 0) */
  size_t split_limit_halvings_after_failure; /* for a budget of reserved bytes
                          * on fixed segments with a split limit: a step that
                          * did not fit after its try in one place (any step
                          * that did not fit, without
                          * in_one_place_after_failure), or a trial step too
                          * slow, halves its plan's split limit for the next
                          * steps, up to this many times (at most 5; the
                          * limit halved must stay above 1 MiB), before
                          * the plan is refused or made blind: a small tensor
                          * put in a large free block can leave a large
                          * request no room (default 0) */
} remat_planner_options;

REMAT_API remat_status remat_planner_options_init(remat_planner_options* options);
/* options may be NULL (the defaults). With one plan there is no trial.
 * REMAT_INVALID_ARGUMENT for no plans, a NULL, empty or repeated name, a plan
 * that allows neither drops nor offloads, a policy spec the runtime refuses. */
REMAT_API remat_status remat_planner_create(const remat_plan* plans, size_t num_plans,
                                            const remat_planner_options* options,
                                            remat_planner** out);
REMAT_API remat_status remat_planner_destroy(remat_planner* planner);

typedef struct remat_planner_step {
  size_t plan;       /* index into the plans given */
  int timed;         /* its elapsed time counts in the trial */
  int in_trial;      /* the trial has not yet decided */
  int fresh_runtime; /* start the plan's runtime afresh (the plan is blind) */
  int in_one_place;  /* run it meeting each request in one place
                      * (remat_runtime_set_retry_in_one_place) */
  size_t split_limit_halvings; /* run it with the allocator's split limit
                      * halved this many times from the one it was made with
                      * (remat_set_max_split) */
} remat_planner_step;

/* REMAT_FAILED_PRECONDITION while a step is open. */
REMAT_API remat_status remat_planner_step_begin(remat_planner* planner, remat_planner_step* out);

typedef enum remat_step_outcome {
  REMAT_STEP_FIT = 0,       /* ran through under the budget */
  REMAT_STEP_TOO_SMALL = 1, /* the budget could not hold what it needed */
  REMAT_STEP_ABANDONED = 2, /* raised something else or was interrupted: nothing learned */
  REMAT_STEP_TOO_SLOW = 3,  /* stopped once past the quickest step that fit: it leaves the
                             * trial as a step that did not fit does (with
                             * in_one_place_after_failure, after one more try in one
                             * place; with split_limit_halvings_after_failure, after
                             * tries at the lower limits), teaching nothing */
  REMAT_STEP_OUTCOME_MAX_ENUM = 0x7FFFFFFF
} remat_step_outcome;

/* elapsed_ns counts for a timed step that fit; message (may be NULL) is kept
 * as the refusal of a plan the step takes out of the trial.
 * REMAT_FAILED_PRECONDITION with no step open; REMAT_INVALID_ARGUMENT for an
 * unknown outcome or a negative time (the step stays open). */
REMAT_API remat_status remat_planner_step_end(remat_planner* planner, remat_step_outcome outcome,
                                              int64_t elapsed_ns, const char* message);
/* The caller started the plan's runtime afresh for reasons of its own (an
 * interrupted step): it has learned nothing from the steps before. */
REMAT_API remat_status remat_planner_runtime_restarted(remat_planner* planner, size_t plan);

typedef struct remat_planner_state {
  size_t num_plans;
  int in_trial;
  int trial_done;        /* the trial decided after timing its plans */
  size_t kept_plan;      /* the plan kept, once !in_trial */
  uint64_t steps_ended;
} remat_planner_state;

REMAT_API remat_status remat_planner_get_state(remat_planner* planner, remat_planner_state* out);

typedef struct remat_plan_state {
  int live;              /* the planner may still run it: keep its runtime */
  int refused;           /* taken out of the trial: a step did not fit */
  int blind;             /* each step starts its runtime afresh */
  int learns_fits;       /* replays seen to fit in its steps hold for later ones */
  uint64_t runtime_steps; /* steps that fit on its current runtime */
  size_t num_times;      /* timed trial steps that fit */
} remat_plan_state;

/* times_ns (may be NULL): up to times_capacity of its timed steps' times.
 * refusal (may be NULL): its refusal's message, to free with
 * remat_string_free (NULL when not refused). REMAT_INVALID_ARGUMENT for a
 * plan out of range. */
REMAT_API remat_status remat_planner_get_plan(remat_planner* planner, size_t plan,
                                              remat_plan_state* out, int64_t* times_ns,
                                              size_t times_capacity, char** refusal);

/* What steps learn, by tensor kind: the caller's key for "the same tensor in
 * every step" (say, a hash of the op that made it, which of its outputs, and
 * how many such the step had made before it). A plan that may both drop and
 * offload reads it to admit a drop: a kind whose replay was seen to fail is
 * offloaded, a drop of a kind not yet seen to come back is copied to host
 * memory first, and a replay must fit beside what the backward will hold
 * pinned as it reads the tensor. What the open step saw joins the books when
 * it ends: a step that fit teaches replays (from its runtime's second step)
 * and pins; one that did not fit teaches its plan its failed replays.
 * All three need an open step (else REMAT_FAILED_PRECONDITION). */

/* The open step brought back a dropped tensor of this kind by replay (fit),
 * or its replay could not fit. */
REMAT_API remat_status remat_planner_saw_replay(remat_planner* planner, uint64_t kind,
                                                uint64_t bytes, int fit);
/* The open step's backward read a tensor of this kind with pinned_bytes held
 * pinned beside it. */
REMAT_API remat_status remat_planner_saw_pinned(remat_planner* planner, uint64_t kind,
                                                uint64_t bytes, uint64_t pinned_bytes);

typedef struct remat_kind_seen {
  int seen_to_fit;         /* one of its kind, this size or larger, came back by replay */
  int seen_to_fail;        /* one of its kind, this size or smaller, could not fit */
  uint64_t pinned_beside;  /* bytes the backward will hold pinned as it reads it */
} remat_kind_seen;

/* What the steps before the open one learned of a tensor of this kind and
 * size, under the open step's plan. */
REMAT_API remat_status remat_planner_kind_seen(remat_planner* planner, uint64_t kind,
                                               uint64_t bytes, remat_kind_seen* out);

typedef enum remat_drop_verdict {
  REMAT_DROP = 0,                   /* dropped */
  REMAT_OFFLOAD_OVER_SHARE = 1,     /* its replay needs more than its share of the room */
  REMAT_OFFLOAD_BESIDE_PINNED = 2,  /* its replay cannot fit beside what the backward pins */
  REMAT_OFFLOAD_SEEN_TO_FAIL = 3,   /* a replay of its kind and size did not fit */
  REMAT_DROP_VERDICT_MAX_ENUM = 0x7FFFFFFF
} remat_drop_verdict;

typedef struct remat_drop_admission {
  remat_drop_verdict verdict;
  int copy_first; /* dropped, but first copied to host memory: no replay of its
                   * kind and size has yet been seen to fit */
} remat_drop_admission;

/* Whether a tensor that may be both dropped and offloaded is dropped under
 * the open step's plan: replay_bytes is remat_runtime_estimate_replay's
 * figure for it (REMAT_REPLAY_DEPTH + 1 entries), room what a replay must fit
 * in (the budget, less what the device held as the step began where the
 * budget counts everything). A drop is refused where its replay, inputs
 * resident, needs more than a share of the room (half; all of it for a
 * drop_first plan), where its replay, dropped inputs followed, does not fit
 * the room beside what earlier steps' backwards pinned as they read its
 * kind, or where a replay of its kind and size was seen to fail. */
REMAT_API remat_status remat_planner_admit_drop(remat_planner* planner, uint64_t kind,
                                                uint64_t bytes, const uint64_t* replay_bytes,
                                                size_t num_replay_bytes, uint64_t room,
                                                remat_drop_admission* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* REMAT_REMAT_H_ */
