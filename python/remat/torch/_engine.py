"""The state of one step under a budget: the runtime, its callbacks,
pressure, copies and statistics. Saving and bringing back are its mixins
(_saving, _restoring), recording is _recorder's.

How it works. Inside the context two things watch the step:

- A TorchDispatchMode records every ATen call of the forward: the function,
  its arguments (each tensor described by the storage under it, its view
  (size, stride, offset) and the storage's content version at the call), the
  RNG state before a random call, and what it costs (FLOPs and bytes at a
  device's rates). Each new storage a call returns is known by the call and
  output index that made it; a call that writes into an argument (in place,
  `out=`) moves that storage's content to its next version. Views, and calls
  that neither write nor make a storage, pass through unrecorded (a replay
  rebuilds views from the storage), and the backward runs with the recorder
  set aside (_Backward).
- saved_tensors_hooks see each tensor autograd saves for the backward. One
  whose storage a recorded call made is handed to remat's runtime (the C
  library, through its C ABI) as a tensor of that storage's bytes, and only a
  handle goes into the graph. Tensors made before the context (parameters,
  inputs, buffers) are left to autograd: never dropped, never counted.

The runtime keeps the resident saved bytes within the budget (its live
budget) by choosing, with its policy, what to drop or offload; its events say
which. A dropped storage's tensor is let go; an offloaded one is copied to
host memory and let go. When the backward unpacks a handle the runtime
brings the storage back: a restore copies it in; a recompute re-runs the
recorded calls that made that content (with their recorded RNG state), from
their recorded inputs, recursively through storages nobody saved, taking
saved ones from the runtime (which brings them back first).

A storage is droppable only when every call its recompute would run can be
replayed exactly: a random call with its RNG state captured, no call with
data-dependent output shapes, no call that wrote a tensor made before the
context unless its outputs do not read it (batch norm's running statistics),
and on CUDA no kernel PyTorch marks nondeterministic unless the user allows
it, and none that reads bytes handed outside autograd (Engine.exported).
Other storages may still be offloaded.

What a plain step would check or read, the budget does too: a saved tensor
modified in place raises at its unpack as autograd raises (_check_version:
PyTorch skips its check under saved-tensor hooks), a custom op's replay draws
what it drew (_rng_states), and a tensor moved by `.data =` is read as
autograd reads it (Engine.data_set).
"""
import ctypes
import threading
import time

import torch

from remat import _capi
from remat.torch import _allocator, _interrupts
from remat.torch._common import BudgetTooSmall, _out_of_memory
from remat.torch._recorder import _Recording
from remat.torch._session import _BACKUP, _Internal, _STEP_COUNTERS
from remat.torch._saving import _Saving
from remat.torch._restoring import _Restoring


class Engine(_Recording, _Saving, _Restoring):
    """The state of one step under a budget (one `with`)."""

    def __init__(self, budget_bytes, policy, offload, recompute, allow_nondeterministic,
                 cost_model, copy_ahead=False, allocator=None, device=0, drop_first=False,
                 planner=None):
        self.budget_bytes = budget_bytes
        # What a replay must fit in: the budget, less (where it counts what
        # the GPU holds) what the device held as the step began.
        self.replay_room = budget_bytes
        # The budget's step planner (remat._planner): what earlier steps
        # learned by tensor kind (replays that fit or failed, what a backward
        # pinned beside each), and where this step's observations go.
        self.planner = planner
        self.kinds_handed = {}        # (op, output) -> how many handed over (_beside_key)
        # Only a step that may both drop and offload weighs each replay (a
        # tensor it could not bring back is offloaded instead).
        self.weigh_replays = bool(offload and recompute)
        self._estimate = (ctypes.c_uint64 * (_capi.REPLAY_DEPTH + 1))()
        self.pin_bytes = 0            # the bytes of the pins below
        self.forever_bytes = 0        # and of the storages pinned to the step's end
        # Offload only what cannot be dropped (the offload guard's plan that
        # drops wherever a drop can come back).
        self.drop_first = drop_first
        # The dropped tensor whose replay failed the step (no copy to come
        # back from): the outermost such acquire, as the error left it.
        self.unfit = None
        self.backward_read = False    # a backward has read a saved tensor of the step
        # remat's allocator (libremat_torch.so) whose pressure drives the
        # evictions, capped at the budget on `device` while the step runs;
        # None: the runtime's live budget over the saved bytes does.
        self.allocator = allocator
        self.device = device
        self.listening = False
        self.pressure_fn = None
        self.pressure_error = None    # an exception raised inside the pressure callback
        self.callback_errors = set()  # ids of such exceptions raised since
        self.device_stats = None
        self.allocator_pressure = 0
        # The allocator's failed requests so far (remat_torch_num_ooms), and
        # the last pressure it reported: (bytes, allocated, budget). The call
        # whose request failed (remat_malloc raised in it) raises
        # BudgetTooSmall instead.
        self.ooms = 0
        self.last_pressure = None
        self.thread = None
        self.policy = policy
        self.offload = offload
        self.copy_ahead = copy_ahead
        self.recompute = recompute
        self.allow_nondeterministic = allow_nondeterministic
        self.cost_model = cost_model
        self.storages = {}            # storage key -> _Storage
        self.by_index = []            # index -> _Storage (the callback's user_data)
        self.by_id = {}               # runtime id -> _Storage
        self.internal = False
        self.registered = []          # saved storages in the order they were saved
        self.pins = []                # ids pinned for the backward node being run
        self.pin_node = None          # that node
        self.pin_task = -1            # and its backward (autograd's graph task)
        self.pending = []             # (kind, storage, tensor) events to act on outside the lock
        self.dead_handles = []
        self.error = None             # an exception raised inside a callback
        self.too_small = None         # the last BudgetTooSmall the step raised
        self.why_pinned = {}          # storage index -> why it is kept to the step's end
        self.counts = {"saved_tensors": 0, "saved_unmanaged": 0, "kept_not_replayable": 0,
                       "recomputed_calls": 0, "backwards_outside_recorder": 0,
                       "offload_not_drop": 0, "offload_not_drop_seen": 0,
                       "offload_not_drop_failed": 0, "keep_saved_blocks": 0,
                       "rebuilt_in_replay": 0, "backups": 0, "backup_bytes": 0,
                       "backups_used": 0, "backups_skipped": 0}
        self.lib = _capi.lib()
        self.session = None
        self.runtime = None
        self.start = None             # the runtime's counters when the step began
        # A runtime call per recorded call whose outputs are saved: its saved
        # storages, in the runtime's output order (autograd saves a call's
        # outputs one by one: layer norm's mean and rstd as it returns, its
        # output when the next op runs; each joins the call's runtime call, so
        # one run brings back all it lost).
        self.groups = []
        self.side_stream = None
        self.closed = False
        self.restores = 0
        # Host seconds in replays (the copies they make included) and in
        # copies out and in.
        self.recompute_seconds = 0.0
        self.copy_seconds = 0.0
        self.in_replay = False
        # Tensors moved onto other bytes by `.data =` (data_set), by id: held
        # to the step's end, as autograd holds a tensor it saved as an input.
        self.moved = {}

    # --- the runtime ------------------------------------------------------------------

    def open(self, session):
        self.session = session
        self.runtime = session.runtime
        self.start = session.raw_stats()
        session.engine = self
        if self.allocator is not None:
            try:
                self._listen()
            except BaseException:
                session.engine = None
                raise

    def _listen(self):
        """Caps remat's allocator at the budget and takes its pressure."""
        a, d = self.allocator, self.device
        other = _allocator._listening.get(d)
        if other is not None and not other.closed:
            raise RuntimeError(f"another remat.torch.budget takes device {d}'s memory pressure "
                               "now: one budget per device at a time")
        held = a.memory_stats(d)["allocated"]
        if held >= self.budget_bytes:
            raise self._budget_too_small(
                f"remat.torch.budget({self.budget_bytes} bytes) counts what the GPU holds "
                f"(remat's allocator serves PyTorch), and device {d} holds {held} bytes "
                "before the step begins (parameters, gradients, optimizer state, inputs): "
                "nothing would be left for the step")
        self.old_budget = a.budget(d)
        # A budget beyond the device caps nothing: the device's capacity.
        a.set_budget(d, 0)
        try:
            a.set_budget(d, min(self.budget_bytes, a.budget(d)))
            # Parameters, gradients, optimizer state and inputs stay through
            # the step: a replay has the rest.
            self.replay_room = max(0, a.budget(d) - held)
            a.reset_peak(d)
            self.ooms = a.num_ooms(d)
            self.thread = threading.get_ident()
            self.pressure_fn = _allocator.PRESSURE_FN(self._on_pressure)
            a.set_pressure_fn(d, self.pressure_fn)
        except BaseException:
            a.set_budget(d, self.old_budget)
            raise
        _allocator._listening[d] = self
        self.listening = True

    def _stop_listening(self):
        if not self.listening:
            return
        self.listening = False
        a, d = self.allocator, self.device
        try:
            a.set_pressure_fn(d, None)
            if _allocator._listening.get(d) is self:
                del _allocator._listening[d]
            self.device_stats = a.memory_stats(d)
            self.device_stats["ooms"] = a.num_ooms(d)
            a.end_step(d)
        finally:
            a.set_budget(d, self.old_budget)

    def check_allocator(self, func, exc=None):
        """After a call (`exc`: what it raised): raises what went wrong in
        the allocator's pressure callback, or BudgetTooSmall where a request
        failed (the call raised it: remat_malloc throws). Another error the
        call raised (a CUDA error, say) is not hidden behind BudgetTooSmall:
        the caller raises it as it was."""
        if self.pressure_error is not None:
            error, self.pressure_error = self.pressure_error, None
            self.callback_errors.add(id(error))  # not a replay's want of room (_acquire)
            raise error from exc
        ooms = self.allocator.num_ooms(self.device)
        if ooms != self.ooms:
            self.ooms = ooms
            if exc is None or _out_of_memory(exc):
                raise self._too_small(func) from exc

    def _too_small(self, func):
        """BudgetTooSmall for a request remat's allocator could not meet:
        two lines, what did not fit and the least budget that would have
        held it beside what could not be evicted (where the request is
        known: a request larger than the whole budget asks no pressure)."""
        st = self.read_stats()
        asked, fix = "", "Raise the budget."
        if self.last_pressure is not None:
            nbytes, allocated, _ = self.last_pressure
            asked = f" for {nbytes} bytes with {allocated} allocated"
            if allocated + nbytes > self.budget_bytes:
                fix = f"Raise the budget to at least {allocated + nbytes} bytes."
        return self._budget_too_small(
            f"remat.torch.budget({self.budget_bytes} bytes) on device {self.device}: {func} "
            f"asked remat's allocator{asked}, and the runtime had nothing left to evict "
            f"({st['drops']} drops and {st['offloads']} offloads in this step; what the "
            "backward reads now, the parameters, gradients and optimizer state stay).\n" + fix)

    def exit_error(self):
        """What the step's end must raise, if anything: an error of the
        pressure callback, or BudgetTooSmall for a request that failed
        where no call after it saw."""
        if self.pressure_error is not None:
            return self.pressure_error
        if self.device_stats is not None and self.device_stats["ooms"] != self.ooms:
            return self._too_small("the step")
        return None

    def _budget_too_small(self, message):
        """A BudgetTooSmall for the step to raise, kept so that the
        budget's exit can raise it again where something wrapped it
        (TorchScript's interpreter)."""
        self.too_small = BudgetTooSmall(message)
        return self.too_small

    @_interrupts.critical
    def _on_pressure(self, _user, pressure):
        """remat's allocator cannot serve a request within the budget, its
        cache released: the runtime evicts saved activations by its policy,
        the bytes the request lacks (all of it, where the budget has room
        that is not in one place). Nonzero: something went."""
        try:
            _interrupts.deliver()  # raised by the call that asked, as its error
            if self.closed or self.runtime is None:
                return 0
            if threading.get_ident() != self.thread and \
                    torch._C._current_graph_task_id() == -1:
                return 0  # another thread's request, not this step's (nor its backward's)
            p = pressure.contents
            self.last_pressure = (p.bytes, p.allocated, p.budget)
            over = p.allocated + p.bytes - p.budget
            need = over if p.allocated + p.bytes > p.budget else p.bytes
            self.allocator_pressure += 1
            freed = ctypes.c_uint64()
            status = self.lib.remat_runtime_evict_bytes(self.runtime, max(1, need), 0,
                                                        ctypes.byref(freed))
            if status != _capi.OK:
                raise _capi.RematError(status, self.lib.remat_last_error().decode())
            self._drain()  # the offloads' copies out; a drop let its tensor go already
            return 1 if freed.value else 0
        except BaseException as e:  # noqa: BLE001: the step raises it on its way out
            if self.pressure_error is None:
                self.pressure_error = e
            return 0

    def close(self):
        """Ends the step: everything it holds goes, and the runtime learns
        from it what the next step will do."""
        if self.closed:
            return
        self.closed = True
        lib = self.lib
        error = None
        try:
            # Whatever fails (a copy out of host memory, say), every tensor of
            # the step still goes and the step still ends: the runtime is
            # kept for the next one.
            for release in (self._release_pins, self._free_dead):
                try:
                    release()
                except BaseException as e:  # noqa: BLE001: raised below
                    error = error or e
            self.pending.clear()  # copies the step no longer needs
            for s in self.registered:
                if s.pinned_forever and not s.freed:
                    s.pinned_forever = False
                    lib.remat_tensor_release(self.runtime, s.id)
                self._free(s)
            self.pending.clear()
            _capi.check(lib.remat_runtime_end_step(self.runtime), "remat_runtime_end_step")
            self.stats = self.read_stats()
            if error is not None:
                raise error
        finally:
            self._stop_listening()
            self.session.engine = None
            # The step's records go by reference counting as the step ends:
            # a call and the storages it made refer to each other, so the
            # links go first (else each step would leave thousands of
            # objects in cycles for the garbage collector to find).
            for s in self.by_index:
                s.tensor = None
                s.host = None
                s.ahead = None
                s.backup = None
                s.producer = None
                s.writers = None
                s.readers = None
            self.by_index = []
            self.registered = []
            self.groups = []
            self.moved = {}
            self.storages.clear()
            self.by_id.clear()
            self.runtime = None

    def read_stats(self):
        st = self.session.raw_stats()
        step = {name: getattr(st, name) - getattr(self.start, name) for name in _STEP_COUNTERS}
        return {
            "budget_bytes": self.budget_bytes,
            # The runtime's peak over the budget's steps so far.
            "peak_saved_bytes": st.peak_resident_bytes,
            "saved_bytes": st.resident_bytes,
            "drops": step["drops"],
            "recomputes": step["recomputes"],
            "offloads": step["offloads"],
            "restores": self.restores,
            "recompute_seconds": self.recompute_seconds,
            "copy_seconds": self.copy_seconds,
            "prefetches": step["prefetches"],
            "offloaded_bytes": step["offloaded_bytes"],
            "restored_bytes": step["restored_bytes"],
            "recompute_ns_estimate": step["recompute_ns"],
            "pressure_events": step["pressure_events"],
            # Next uses estimated from the step before (the second step on).
            "learned_next_uses": step["learned_next_uses"],
            # Copies out made ahead (copy_ahead), and the offloads that used one.
            "copies_ahead": step["copies_ahead"],
            "ahead_offloads": step["ahead_offloads"],
            "step": st.steps_ended + (0 if self.closed else 1),
            **self.counts,
            **self._device_figures(),
        }

    def _device_figures(self):
        if self.allocator is None:
            return {"pressure": "saved"}
        figures = self.device_stats if self.device_stats is not None else \
            self.allocator.memory_stats(self.device)
        return {
            "pressure": "allocator",
            # What remat's allocator held on the device over the step: all
            # of the process's memory there, not the saved bytes alone.
            "device_peak_bytes": figures["peak_reserved"],
            "device_peak_allocated_bytes": figures["peak_allocated"],
            "allocator_pressure_events": self.allocator_pressure,
        }

    def _on_event(self, _user, event_p):
        # Under the runtime's lock: let go of a dropped tensor, queue the rest.
        e = event_p.contents
        s = self.by_id.get(e.tensor)
        if s is None:
            return
        if e.kind == _capi.EVENT_DROPPED or e.kind == _capi.EVENT_COLLECTED:
            if s.want_backup and e.kind == _capi.EVENT_DROPPED and e.pressure and \
                    s.tensor is not None and s.tensor_version == s.reg_version and \
                    (s.backup is None or s.backup_version != s.reg_version):
                # (A copy made at an earlier drop still serves.)
                self.pending.append((_BACKUP, s, (s.tensor, s.reg_version)))  # out of the lock
            s.tensor = None
            s.ahead = None
            s.host = None
            s.gen += 1
        elif e.kind == _capi.EVENT_OFFLOADED or e.kind == _capi.EVENT_COPIED_AHEAD:
            if e.kind == _capi.EVENT_OFFLOADED:
                s.gen += 1
            self.pending.append((e.kind, s, None))
        elif e.kind == _capi.EVENT_RESTORED:
            if e.refill:
                return  # from the copy made as it was dropped: _refill copies it in
            self.restores += 1
            self.pending.append((e.kind, s, None))

    def _drain(self):
        """Acts on the queued offloads and restores: the copies themselves."""
        while self.pending:
            kind, s, t = self.pending.pop(0)
            with _Internal(self):
                if kind == _BACKUP:
                    t, version = t
                    # Still dropped, and saved at the content copied.
                    if not s.freed and s.tensor is None and s.reg_version == version:
                        try:
                            s.backup = self._copy_backup(t)
                        except (RuntimeError, MemoryError) as e:
                            if not (isinstance(e, MemoryError) or _out_of_memory(e)):
                                raise
                            # No host memory for it (pinned memory runs out
                            # first): the drop goes on without a copy, as
                            # before there were any.
                            self.counts["backups_skipped"] += 1
                            continue
                        s.backup_version = version
                        self.counts["backups"] += 1
                        self.counts["backup_bytes"] += s.nbytes
                elif kind == _capi.EVENT_COPIED_AHEAD and s.tensor is not None:
                    s.ahead = self._copy_out(s.tensor)  # it stays resident
                    s.host_version = s.tensor_version
                elif kind == _capi.EVENT_OFFLOADED and s.tensor is not None:
                    # The copy made ahead, if no write came since (record()
                    # lets it go on a write), else a copy now.
                    if s.ahead is None:
                        s.host = self._copy_out(s.tensor)
                        s.host_version = s.tensor_version
                    else:
                        s.host = s.ahead  # (host_version: set when it was made)
                    s.ahead = None
                    s.tensor = None
                elif kind == _capi.EVENT_RESTORED and s.host is not None:
                    gen = s.gen
                    t = self._copy_in(s.host, s.device)
                    # Evicted again while the copy in asked for memory (the
                    # allocator's pressure): the runtime's later events rule.
                    if s.gen == gen:
                        s.tensor = t
                        s.tensor_version = s.host_version
                        s.host = None

    def _copy_backup(self, t):
        """A copy of a tensor being dropped (_Storage.want_backup)."""
        return self._copy_out(t)

    def _copy_out(self, t):
        start = time.perf_counter()
        try:
            return self._copy_out_timed(t)
        finally:
            self.copy_seconds += time.perf_counter() - start

    def _copy_out_timed(self, t):
        # The whole storage, flat (no allocation: it may run inside the
        # allocator's pressure callback).
        base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        if t.device.type != "cuda":
            return base.clone()
        host = torch.empty(base.shape, dtype=t.dtype, pin_memory=True)
        if self.allocator is not None and not self.allocator.records_streams:
            # This PyTorch cannot tell remat's allocator of a use on another
            # stream: the copy runs on the step's own, and is waited for.
            host.copy_(base)
            return host
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream(t.device)
        self.side_stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(self.side_stream):
            host.copy_(base, non_blocking=True)
        base.record_stream(self.side_stream)
        return host

    def _copy_in(self, host, device):
        start = time.perf_counter()
        try:
            return self._copy_in_timed(host, device)
        finally:
            self.copy_seconds += time.perf_counter() - start

    def _copy_in_timed(self, host, device):
        if device.type == "cuda":
            if self.side_stream is not None:
                torch.cuda.current_stream(device).wait_stream(self.side_stream)
            return host.to(device, non_blocking=True)
        return host.clone()

    def _free_dead(self):
        while self.dead_handles:
            s = self.dead_handles.pop()
            s.handles -= 1
            if s.handles == 0 and s.id is not None and self.runtime is not None:
                if s.id in self.pins:
                    continue  # freed when its pin goes
                self._free(s)

    def _free(self, s):
        if not s.freed and not s.pinned_forever:
            s.freed = True
            if s.backup is not None:
                if s.tensor is None and self.backward_read:
                    # Dropped, and not needed again by the step's backward:
                    # such a drop did no harm. (A step with no backward says
                    # nothing of what one would need.)
                    self._saw_fit(s)
                s.backup = None
            self.lib.remat_tensor_free(self.runtime, s.id)

    def _release_pins(self):
        self.pin_node = None
        pins, self.pins = self.pins, []
        self.pin_bytes = 0
        for id_ in pins:
            self.lib.remat_tensor_release(self.runtime, id_)
        self._drain()
        for id_ in pins:
            s = self.by_id.get(id_)
            if s is not None and s.handles == 0 and id_ not in self.pins:
                self._free(s)

