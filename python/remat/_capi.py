"""ctypes declarations of remat's C ABI (integrations/c_api/remat.h).

ctypes, not a compiled extension: the C ABI is already the library's stable,
exported surface (libremat.so exports remat_* and nothing else), so the
package needs no compiler of its own, no Python headers and no rebuild per
Python version; the cost of a call through ctypes (about a microsecond) is
small next to the tensor operations it accompanies.
"""
import ctypes
import os
import pathlib

# The struct layouts below mirror remat.h at this REMAT_ABI_VERSION; lib()
# refuses a library with another one rather than misread its structs.
ABI_VERSION = 9

OK = 0
INVALID_ARGUMENT = 1
OUT_OF_MEMORY = 2
NOT_FOUND = 3
FAILED_PRECONDITION = 4
INTERNAL = 5

EVENT_CREATED = 0
EVENT_DROPPED = 1
EVENT_OFFLOADED = 2
EVENT_RESTORED = 3
EVENT_RECOMPUTED = 4
EVENT_COLLECTED = 5
EVENT_COPIED_AHEAD = 6
# remat_tensor_state
TENSOR_RESIDENT = 0
TENSOR_OFFLOADING = 1
TENSOR_ON_HOST = 2
TENSOR_PREFETCHING = 3
TENSOR_DROPPED = 4
TENSOR_FREED = 5

DEVICE_SIM = 0


class AllocatorOptions(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("cuda_device", ctypes.c_int),
                ("budget_bytes", ctypes.c_uint64), ("max_split_bytes", ctypes.c_uint64),
                ("history_events", ctypes.c_uint64), ("sim_capacity_bytes", ctypes.c_uint64),
                ("sim_backed", ctypes.c_int), ("alloc_conf", ctypes.c_char_p)]


class RuntimeOptions(ctypes.Structure):
    _fields_ = [("policy", ctypes.c_char_p), ("enable_drop", ctypes.c_int),
                ("enable_offload", ctypes.c_int), ("host_pool_bytes", ctypes.c_uint64),
                ("live_budget", ctypes.c_uint64), ("keep_addresses", ctypes.c_int),
                ("learn_next_use", ctypes.c_int), ("copy_ahead", ctypes.c_int),
                ("link_gbps", ctypes.c_double), ("link_latency_ns", ctypes.c_int64),
                ("estimate_replays", ctypes.c_int)]

# REMAT_REPLAY_DEPTH: levels of dropped inputs a replay estimate follows.
REPLAY_DEPTH = 8


RECOMPUTE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64)
DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class TensorOptions(ctypes.Structure):
    _fields_ = [("inputs", ctypes.POINTER(ctypes.c_uint64)), ("num_inputs", ctypes.c_size_t),
                ("compute_ns", ctypes.c_int64), ("allow_drop", ctypes.c_int),
                ("allow_offload", ctypes.c_int), ("recompute", RECOMPUTE_FN),
                ("user_data", ctypes.c_void_p), ("destroy", DESTROY_FN),
                ("read_only", ctypes.c_int)]


# One run regenerates every output of a call it lost (remat_call_recompute_fn).
CALL_RECOMPUTE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.POINTER(ctypes.c_int), ctypes.c_size_t,
                                     ctypes.c_uint64)


class CallOptions(ctypes.Structure):
    _fields_ = [("inputs", ctypes.POINTER(ctypes.c_uint64)), ("num_inputs", ctypes.c_size_t),
                ("compute_ns", ctypes.c_int64), ("allow_drop", ctypes.c_int),
                ("allow_offload", ctypes.c_int), ("recompute", CALL_RECOMPUTE_FN),
                ("user_data", ctypes.c_void_p), ("destroy", DESTROY_FN),
                ("read_only", ctypes.c_int)]


class Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("tensor", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("pressure", ctypes.c_int), ("prefetch", ctypes.c_int),
                ("cost_ns", ctypes.c_int64), ("stream", ctypes.c_uint64), ("ahead", ctypes.c_int),
                ("directed", ctypes.c_int), ("refill", ctypes.c_int)]


EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Event))


class RuntimeStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "tensors_created", "live_tensors", "pressure_events", "drops", "released_drops",
        "offloads", "recomputes")] + [("recompute_ns", ctypes.c_int64)] + [
        (name, ctypes.c_uint64) for name in (
            "offloaded_bytes", "restored_bytes", "prefetches", "resident_bytes",
            "peak_resident_bytes", "pinned_by_api", "learned_next_uses", "steps_ended",
            "copies_ahead", "ahead_offloads", "refills")]


class Plan(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("policy_spec", ctypes.c_char_p),
                ("allow_drop", ctypes.c_int), ("allow_offload", ctypes.c_int),
                ("drop_first", ctypes.c_int)]


class PlannerOptions(ctypes.Structure):
    _fields_ = [("learning_steps", ctypes.c_size_t), ("timed_steps", ctypes.c_size_t),
                ("in_one_place_after_failure", ctypes.c_int),
                ("split_limit_halvings_after_failure", ctypes.c_size_t)]


class PlannerStep(ctypes.Structure):
    _fields_ = [("plan", ctypes.c_size_t), ("timed", ctypes.c_int), ("in_trial", ctypes.c_int),
                ("fresh_runtime", ctypes.c_int), ("in_one_place", ctypes.c_int),
                ("split_limit_halvings", ctypes.c_size_t)]


# remat_step_outcome
STEP_FIT = 0
STEP_TOO_SMALL = 1
STEP_ABANDONED = 2
STEP_TOO_SLOW = 3


class PlannerState(ctypes.Structure):
    _fields_ = [("num_plans", ctypes.c_size_t), ("in_trial", ctypes.c_int),
                ("trial_done", ctypes.c_int), ("kept_plan", ctypes.c_size_t),
                ("steps_ended", ctypes.c_uint64)]


class PlanState(ctypes.Structure):
    _fields_ = [("live", ctypes.c_int), ("refused", ctypes.c_int), ("blind", ctypes.c_int),
                ("learns_fits", ctypes.c_int), ("runtime_steps", ctypes.c_uint64),
                ("num_times", ctypes.c_size_t)]


class KindSeen(ctypes.Structure):
    _fields_ = [("seen_to_fit", ctypes.c_int), ("seen_to_fail", ctypes.c_int),
                ("pinned_beside", ctypes.c_uint64)]


class DropAdmission(ctypes.Structure):
    _fields_ = [("verdict", ctypes.c_int), ("copy_first", ctypes.c_int)]


# remat_drop_verdict
DROP = 0
OFFLOAD_OVER_SHARE = 1
OFFLOAD_BESIDE_PINNED = 2
OFFLOAD_SEEN_TO_FAIL = 3


class RematError(RuntimeError):
    """A call into libremat failed; `status` is its remat_status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _candidates(name, env):
    path = os.environ.get(env)
    if path:
        yield pathlib.Path(path)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "lib" / name                         # an installed package
    root = here.parent.parent                         # a checkout: python/remat/..
    for build in ("build", "build-release"):
        yield root / build / "lib" / name


def find_library(name="libremat.so", env="REMAT_LIBRARY"):
    """The path of one of remat's libraries (libremat.so by default): $env,
    the package's own copy, or a checkout's build/lib."""
    tried = []
    for path in _candidates(name, env):
        if path.is_file():
            # Absolute: a relative $env must not change meaning when a build
            # (the native recorder's link line) runs in another directory.
            return str(path.resolve())
        tried.append(str(path))
    raise ImportError(f"{name} not found (tried " + ", ".join(tried) +
                      f"); install the package with `pip install .` or set {env}")


_lib = None


def lib():
    """libremat.so, loaded once, with its functions' signatures declared."""
    global _lib
    if _lib is not None:
        return _lib
    path = find_library()
    so = ctypes.CDLL(path)
    abi = getattr(so, "remat_abi_version", None)
    found = abi() if abi is not None else 1
    if found != ABI_VERSION:
        raise ImportError(f"{path} has C ABI version {found}, this package needs {ABI_VERSION}: "
                          "install the package and its library together (`pip install .`)")
    vp, u64, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
    sigs = {
        "remat_last_error": (ctypes.c_char_p, []),
        "remat_version": (ctypes.c_char_p, []),
        "remat_allocator_options_init": (ctypes.c_int, [ctypes.POINTER(AllocatorOptions)]),
        "remat_allocator_create": (ctypes.c_int, [ctypes.POINTER(AllocatorOptions),
                                                  ctypes.POINTER(vp)]),
        "remat_allocator_destroy": (ctypes.c_int, [vp]),
        "remat_runtime_options_init": (ctypes.c_int, [ctypes.POINTER(RuntimeOptions)]),
        "remat_runtime_create_observed": (ctypes.c_int, [vp, ctypes.POINTER(RuntimeOptions),
                                                         EVENT_FN, vp, ctypes.POINTER(vp)]),
        "remat_runtime_destroy": (ctypes.c_int, [vp]),
        "remat_runtime_end_step": (ctypes.c_int, [vp]),
        "remat_runtime_set_retry_in_one_place": (ctypes.c_int, [vp, ctypes.c_int]),
        "remat_recompute_set_error": (ctypes.c_int, [ctypes.c_char_p]),
        "remat_tensor_create": (ctypes.c_int, [vp, sz, ctypes.POINTER(TensorOptions), u64,
                                               ctypes.POINTER(u64), ctypes.POINTER(vp)]),
        "remat_call_create": (ctypes.c_int, [vp, sz, ctypes.POINTER(sz),
                                             ctypes.POINTER(CallOptions), u64,
                                             ctypes.POINTER(u64), ctypes.POINTER(vp)]),
        "remat_call_add_output": (ctypes.c_int, [vp, u64, sz, ctypes.c_int, ctypes.c_int, u64,
                                                 ctypes.POINTER(u64), ctypes.POINTER(vp)]),
        "remat_tensor_acquire": (ctypes.c_int, [vp, u64, u64, ctypes.POINTER(vp)]),
        "remat_tensor_refill": (ctypes.c_int, [vp, u64, u64, ctypes.POINTER(vp)]),
        "remat_tensor_release": (ctypes.c_int, [vp, u64]),
        "remat_tensor_free": (ctypes.c_int, [vp, u64]),
        "remat_tensor_prefetch": (ctypes.c_int, [vp, u64, u64]),
        "remat_tensor_evict": (ctypes.c_int, [vp, u64, ctypes.c_int, u64,
                                              ctypes.POINTER(ctypes.c_int)]),
        "remat_tensor_get_state": (ctypes.c_int, [vp, u64, ctypes.POINTER(ctypes.c_int)]),
        "remat_runtime_evict_bytes": (ctypes.c_int, [vp, u64, u64, ctypes.POINTER(u64)]),
        "remat_runtime_get_stats": (ctypes.c_int, [vp, ctypes.POINTER(RuntimeStats)]),
        "remat_string_free": (None, [vp]),
        "remat_planner_create": (ctypes.c_int, [ctypes.POINTER(Plan), sz,
                                                ctypes.POINTER(PlannerOptions),
                                                ctypes.POINTER(vp)]),
        "remat_planner_destroy": (ctypes.c_int, [vp]),
        "remat_planner_step_begin": (ctypes.c_int, [vp, ctypes.POINTER(PlannerStep)]),
        "remat_planner_step_end": (ctypes.c_int, [vp, ctypes.c_int, ctypes.c_int64,
                                                  ctypes.c_char_p]),
        "remat_planner_runtime_restarted": (ctypes.c_int, [vp, sz]),
        "remat_planner_saw_replay": (ctypes.c_int, [vp, u64, u64, ctypes.c_int]),
        "remat_planner_saw_pinned": (ctypes.c_int, [vp, u64, u64, u64]),
        "remat_planner_kind_seen": (ctypes.c_int, [vp, u64, u64, ctypes.POINTER(KindSeen)]),
        "remat_planner_admit_drop": (ctypes.c_int, [vp, u64, u64, ctypes.POINTER(u64), sz, u64,
                                                    ctypes.POINTER(DropAdmission)]),
        "remat_runtime_estimate_replay": (ctypes.c_int, [vp, ctypes.POINTER(u64), sz, u64,
                                                         ctypes.POINTER(u64)]),
        "remat_planner_get_state": (ctypes.c_int, [vp, ctypes.POINTER(PlannerState)]),
        "remat_planner_get_plan": (ctypes.c_int, [vp, sz, ctypes.POINTER(PlanState),
                                                  ctypes.POINTER(ctypes.c_int64), sz,
                                                  ctypes.POINTER(vp)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(so, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = so
    return so


def check(status, what):
    """Raises RematError with the library's message unless status is OK."""
    if status != OK:
        message = lib().remat_last_error().decode("utf-8", "replace")
        raise RematError(status, message or f"{what} failed ({status})")
