"""The runtime a budget keeps across its steps (one per plan), and the
Engine's internal-work guard."""
import ctypes


from remat import _capi
from remat.torch import _interrupts


class _Session:
    """The runtime a budget keeps across its steps (each `with`): it learns
    from each step what the next will do. Its callbacks go to the step now
    running."""

    def __init__(self, budget_bytes, policy, offload, recompute, copy_ahead=False,
                 live_budget=True, link=None):
        self.lib = _capi.lib()
        self.engine = None
        self.allocator = None
        self.runtime = None
        self._event_fn = _capi.EVENT_FN(self._on_event)
        self.recompute_fn = _capi.CALL_RECOMPUTE_FN(self._on_recompute)
        lib = self.lib
        ao = _capi.AllocatorOptions()
        _capi.check(lib.remat_allocator_options_init(ctypes.byref(ao)), "allocator options")
        ao.device = _capi.DEVICE_SIM
        ao.sim_backed = 0
        # Addresses only: the runtime's bookkeeping of the saved bytes. The
        # budget that matters is the live budget below.
        ao.sim_capacity_bytes = 16 << 40  # the most SimDevice models
        allocator = ctypes.c_void_p()
        _capi.check(lib.remat_allocator_create(ctypes.byref(ao), ctypes.byref(allocator)),
                    "remat_allocator_create")
        self.allocator = allocator
        ro = _capi.RuntimeOptions()
        _capi.check(lib.remat_runtime_options_init(ctypes.byref(ro)), "runtime options")
        ro.policy = policy.encode()
        ro.enable_drop = 1 if recompute else 0
        ro.enable_offload = 1 if offload else 0
        # With the allocator's pressure driving evictions, the runtime keeps
        # no budget of its own: it evicts when the allocator asks.
        ro.live_budget = budget_bytes if live_budget else 0
        self.live_budget = live_budget
        ro.host_pool_bytes = 16 << 40
        ro.learn_next_use = 1
        ro.copy_ahead = 1 if (offload and copy_ahead) else 0
        if link is not None:  # (GB/s, ns): what offloads are priced at
            ro.link_gbps, ro.link_latency_ns = link
        # A drop is admitted by what its replay needs, as the runtime estimates it.
        ro.estimate_replays = 1 if (offload and recompute) else 0
        runtime = ctypes.c_void_p()
        status = lib.remat_runtime_create_observed(allocator, ctypes.byref(ro), self._event_fn,
                                                   None, ctypes.byref(runtime))
        if status != _capi.OK:
            message = lib.remat_last_error().decode()
            lib.remat_allocator_destroy(allocator)
            self.allocator = None
            raise ValueError(message)
        self.runtime = runtime

    # The library's callbacks: an exception cannot cross it, and an
    # interrupt that lands in them waits (_interrupts).
    @_interrupts.critical
    def _on_event(self, user, event_p):
        if self.engine is not None:
            self.engine._on_event(user, event_p)

    @_interrupts.critical
    def _on_recompute(self, *args):
        engine = self.engine
        try:
            if engine is None:  # cannot happen: a step frees all it made
                self.lib.remat_recompute_set_error(b"remat: a recompute outside a step")
                return 1
            return engine._on_recompute(*args)
        except BaseException as e:  # noqa: BLE001: carried across the library
            if engine is not None:
                engine.error = e
            self.lib.remat_recompute_set_error(str(e).encode("utf-8", "replace")[:1000])
            return 1

    def raw_stats(self):
        st = _capi.RuntimeStats()
        _capi.check(self.lib.remat_runtime_get_stats(self.runtime, ctypes.byref(st)), "stats")
        return st

    def close(self):
        lib = self.lib
        if self.runtime is not None:
            lib.remat_runtime_destroy(self.runtime)
            self.runtime = None
        if self.allocator is not None:
            lib.remat_allocator_destroy(self.allocator)
            self.allocator = None


# A pending event of remat's own (Engine.pending): copy a tensor the runtime
# dropped to host memory (_Storage.want_backup).
_BACKUP = -1
_EVICT_DROP = 0  # REMAT_EVICT_DROP

# Runtime counters reported per step (the difference over the step).
_STEP_COUNTERS = ("drops", "recomputes", "offloads", "prefetches", "offloaded_bytes",
                  "restored_bytes", "recompute_ns", "pressure_events", "learned_next_uses",
                  "copies_ahead", "ahead_offloads")




class _Internal:
    """`with _Internal(engine):` marks the calls inside as remat's own (its
    copies, views and replays), which the recorder passes through, and
    restores the mark as it was on the way out (such blocks nest)."""

    __slots__ = ("engine", "was")

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        self.was = self.engine.internal
        self.engine.internal = True

    def __exit__(self, *exc):
        self.engine.internal = self.was
        return False


