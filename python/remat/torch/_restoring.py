"""Bringing back: unpack, the runtime's recompute callback, and replays
(a mixin of Engine)."""
import ctypes
import time

import torch

from remat import _capi
from remat.torch import _interrupts
from remat.torch._common import (
    BudgetTooSmall, _below_python_dispatch, _flatten_result, _out_of_memory, _unflatten_call)
from remat.torch._records import _Handle, _Kept, _NO_TORCH_FUNCTION, _Ref, _alias, _check_version
from remat.torch._recorder import _rng_states, _set_rng_states
from remat.torch._session import _EVICT_DROP, _Internal


class _Restoring:
    """Engine's unpack side: acquiring, refilling and replaying."""

    def unpack(self, h):
        with _NO_TORCH_FUNCTION():  # (as pack)
            return self._unpack(h)

    def _unpack(self, h):
        if type(h) is _Kept:
            _check_version(h, h.tensor)
            return h.tensor  # left to autograd at pack time
        if not isinstance(h, _Handle):
            return h
        if self.closed:
            raise RuntimeError("a tensor saved under remat.torch.budget was used after the "
                               "context ended: run the backward inside the `with`")
        s = h.storage
        # Before anything moves: a tensor modified in place since it was
        # saved is an error, as in a plain step.
        source = h.source() if h.source is not None else None
        _check_version(h, source, s)
        if source is not None and self.moved.get(id(source)) is source:
            # Saved as an input and moved by `.data =` since: autograd
            # reads what it holds now.
            return _alias(source)
        # Pins last while the autograd node that unpacked them runs: the
        # engine unpacks a node's saved tensors just before applying it, and
        # they all stay until another node (or another backward: autograd's
        # graph task) unpacks. The node's own calls between its unpacks (the
        # detach after each) do not end them: the node still holds them.
        self.backward_read = True
        node = torch._C._current_autograd_node()
        task = torch._C._current_graph_task_id()
        if node is None or node is not self.pin_node or task != self.pin_task:
            self._release_pins()  # the previous backward node has run
            self.pin_node = node  # held: a wrapper's id() could be reused
            self.pin_task = task
        self._free_dead()
        # A storage counts once beside another, however many of its views
        # the node reads (a chunk's halves, q and k of one projection).
        again = s.id in self.pins or s.pinned_forever
        if self.weigh_replays and not again:
            self.planner.saw_pinned(self._beside_key(s), s.nbytes,
                                    self.pin_bytes + self.forever_bytes)
        self._acquire(s)
        self.pins.append(s.id)
        if not again:
            self.pin_bytes += s.nbytes
        self._drain()
        if self.offload:
            self._prefetch_before(s)
        base = s.tensor
        if base is None:
            raise RuntimeError(f"remat: saved storage {s.index} is resident in the runtime but "
                               "has no tensor (a bug)")
        # The view of a plain tensor is remat's own: built below the Python
        # dispatch key, so no mode (this recorder's, or another's) handles it
        # (through the recorder it cost some fifty microseconds on the CPU).
        # A tensor subclass keeps its own dispatch.
        if type(base) is torch.Tensor:
            with _below_python_dispatch():
                return torch.as_strided(base, h.size, h.stride, h.offset)
        with _Internal(self):
            return torch.as_strided(base, h.size, h.stride, h.offset)

    # The backward reads saved tensors about in the reverse order of saving:
    # the next few offloaded ones before this are copied in now, so that the
    # copy (on a side stream, on CUDA) runs behind this node's compute.
    PREFETCH_AHEAD = 2
    PREFETCH_SCAN = 64

    def _prefetch_before(self, s):
        found = 0
        for i in range(s.order - 1, max(-1, s.order - 1 - self.PREFETCH_SCAN), -1):
            t = self.registered[i]
            if t.freed or t.pinned_forever or t.host is None or t.tensor is not None:
                continue
            status = self.lib.remat_tensor_prefetch(self.runtime, t.id, 0)
            if status != _capi.OK:
                break  # no room now: it comes back on access
            found += 1
            if found == self.PREFETCH_AHEAD:
                break
        self._drain()

    def _acquire(self, s):
        """The runtime brings s back and pins it (one release each); where
        its replay cannot fit and a backup of it was made as it was dropped,
        from the backup."""
        p = ctypes.c_void_p()
        # The allocator's failed requests so far, and those the step has seen
        # (a replay's own, seen by check_allocator inside it, are answered below).
        ooms, seen = (self.allocator.num_ooms(self.device), self.ooms) if self.listening else (0, 0)
        replayed = s.tensor is None and s.host is None  # dropped: its acquire replays it
        try:
            self._call_runtime(self.lib.remat_tensor_acquire, s.id, 0, ctypes.byref(p))
        except (BudgetTooSmall, RuntimeError) as e:
            if id(e) in self.callback_errors or \
                    not (isinstance(e, BudgetTooSmall) or _out_of_memory(e)):
                raise
            if not self._refill(s):
                # No copy to come back from: unless a replay this one runs
                # inside comes back from its own copy, the step fails, and
                # where s was dropped (not offloaded: no room for it alone),
                # the next steps of its plan offload its kind (report_unfit,
                # the planner's saw_replay).
                self.unfit = s if replayed else None
                raise
            if self.listening:
                # The replay's failed requests are answered: not the step's
                # error (others before it still are).
                self.ooms = seen + self.allocator.num_ooms(self.device) - ooms
        # Back: a replay that failed inside this one (rebuilt, or refilled)
        # is not the step's failure.
        self.unfit = None

    def _refill(self, s):
        """Brings dropped s back, pinned, from the copy made as it was
        dropped (_Storage.want_backup): room for s alone, no replay. False
        where there is no such copy, or no room even for s."""
        if s.backup is None or s.backup_version != s.reg_version or s.tensor is not None or \
                s.freed:
            return False
        self._drain()
        p = ctypes.c_void_p()
        if self.lib.remat_tensor_refill(self.runtime, s.id, 0, ctypes.byref(p)) != _capi.OK:
            return False
        try:
            with _Internal(self):
                s.tensor = self._copy_in(s.backup, s.device)
        except BaseException:
            # Dropped again, as Python has it (the block was never written).
            self.lib.remat_tensor_release(self.runtime, s.id)
            self.lib.remat_tensor_evict(self.runtime, s.id, _EVICT_DROP, 0, None)
            self._drain()
            raise
        s.tensor_version = s.reg_version
        self.counts["backups_used"] += 1  # (the copy is kept for a later drop of it)
        self._saw_fail(s)
        return True

    def _call_runtime(self, fn, *args):
        self.error = None
        status = fn(self.runtime, *args)
        if self.error is not None:
            error, self.error = self.error, None
            try:
                raise error
            finally:
                del error  # no cycle through this frame: the collector waits out the step
        _interrupts.deliver()  # one that landed in a callback the call made
        if status != _capi.OK:
            message = self.lib.remat_last_error().decode("utf-8", "replace")
            if status == _capi.OUT_OF_MEMORY:
                s = self.by_id.get(args[0]) if fn is self.lib.remat_tensor_acquire else None
                if s is None:
                    raise self._budget_too_small(
                        f"remat.torch.budget({self.budget_bytes} bytes): {message}")
                raise self._budget_too_small(self._beside_what(
                    s, f"cannot make room to bring back a saved tensor of {s.nbytes} bytes "
                    f"(made by {s.producer[0].func})"))
            raise _capi.RematError(status, message)

    def _on_recompute(self, user_data, _inputs, _n, _outs, _bytes, regenerate, num_outputs,
                      _stream):
        group = self.groups[user_data or 0]
        done = []
        start = time.perf_counter()
        outer = not self.in_replay  # (a replay may ask for another: counted once)
        self.in_replay = True
        with _Internal(self):
            try:
                _interrupts.deliver()  # one that landed in the library: the replay stops
                self._drain()
                memo = {}  # one run of the call serves every output it regenerates
                # Below autograd (no graph, outputs that need no grad), each call
                # in the grad mode it was recorded in.
                with torch._C._AutoDispatchBelowAutograd():
                    for i in range(num_outputs):
                        if regenerate[i]:
                            s = group[i]
                            done.append(s)
                            s.tensor = self._materialize(s, s.reg_version, memo, top=True)
                            s.tensor_version = s.reg_version
                self._drain()
                for s in done:
                    self._saw_fit(s)  # (its copy is kept for a later drop of it)
                return 0
            except BaseException as e:  # noqa: BLE001: carried to the caller
                for s in done:
                    # The runtime gives their blocks back: still dropped.
                    s.tensor = None
                self.error = e
                self.lib.remat_recompute_set_error(str(e).encode("utf-8", "replace")[:1000])
                return 1
            finally:
                if outer:
                    self.in_replay = False
                    self.recompute_seconds += time.perf_counter() - start

    def _materialize(self, s, version, memo, top=False):
        """A tensor over a storage holding (s, version)'s content, recomputed
        where nothing holds it. `top`: the storage the runtime is
        recomputing now (not to be asked of the runtime)."""
        k = (s.index, version)
        if k in memo:
            return memo[k]
        managed = not top and s.id is not None and s.reg_version == version
        rebuilt = False
        if managed and s.tensor is not None and s.tensor_version == version:
            return s.tensor
        if managed and s.tensor is None and not s.freed:
            # Saved since this recompute's inputs were listed: the runtime
            # brings it (or its backup does).
            try:
                self._acquire(s)
            except BudgetTooSmall:
                # No room for it beside the outputs the runtime is
                # regenerating now. Where the runtime may drop it (its
                # replay was judged to fit), it is rebuilt below from its
                # own call, a temporary of this replay as the replay's
                # unsaved intermediates are; the runtime keeps it as it was.
                # (Under the allocator's pressure a request that does not
                # fit raises out of memory, not this.)
                self._drain()
                if not (s.droppable and s.allow_drop):
                    raise
                rebuilt = True
            else:
                try:
                    self._drain()
                    if s.tensor is not None and s.tensor_version == version:
                        return s.tensor
                finally:
                    self.lib.remat_tensor_release(self.runtime, s.id)
        if managed and not s.droppable:
            # What remat holds was written since it was saved (through an
            # alias autograd does not track, else it would be pinned), and
            # what it held before cannot be replayed.
            raise RuntimeError(
                f"remat cannot recompute what storage {s.index} held when it was saved (made by "
                f"{s.producer[0].func}): it was written since, and its content cannot be "
                f"replayed ({s.why_kept})")
        t0 = s.tensor_ref() if s.tensor_ref is not None else None
        if t0 is not None and s.version == version:
            return t0  # still alive (the user holds it): nothing to run
        call, j = s.producer
        if version == 0:
            # Its call's content: one run serves all its outputs (a call's
            # outputs regenerated together, or read by one replay).
            out = memo.get(call)
            if out is None:
                out = memo[call] = _flatten_result(self._run(call, memo, rebuild=None))
        else:
            # Written over below: a run of its own, so that no one else
            # sees the writes.
            out = _flatten_result(self._run(call, memo, rebuild=None))
        base = out[j]
        for w in s.writers[:version]:
            self._run(w, memo, rebuild=(s, base))
        memo[k] = base
        if rebuilt:
            self.counts["rebuilt_in_replay"] += 1
        return base

    def _run(self, call, memo, rebuild):
        """Runs a recorded call again. `rebuild` = (storage, tensor): that
        storage's arguments become views of `tensor` (an in-place call
        replayed onto fresh content); other written arguments are scratch
        copies, so a replay changes nothing outside what it rebuilds."""
        args = []
        for i, r in enumerate(call.leaves):
            if not isinstance(r, _Ref):
                args.append(r)
                continue
            if rebuild is not None and r.storage is rebuild[0]:
                base = rebuild[1]
            elif r.storage.leaf:
                if ((r.version is not None and r.leaf_tensor._version != r.version) or
                        r.storage.version != r.storage_writes) and i not in call.written:
                    raise RuntimeError(
                        f"remat cannot recompute {call.func}: an input made before the context "
                        f"({tuple(r.leaf_tensor.shape)} {r.leaf_tensor.dtype}) was modified "
                        "in place after the forward used it")
                base = r.leaf_tensor
            else:
                base = self._materialize(r.storage, r.version, memo)
            v = torch.as_strided(base, r.size, r.stride, r.offset)
            if i in call.written and (rebuild is None or r.storage is not rebuild[0]):
                v = v.clone()
            args.append(v)
        a, kw = _unflatten_call(args, call.spec)
        self.counts["recomputed_calls"] += 1
        with torch.set_grad_enabled(call.grad):
            return self._run_in_rng(call, a, kw)

    @staticmethod
    def _run_in_rng(call, a, kw):
        """call.func(*a, **kw) in the random-number state it first ran in."""
        if call.rng is None:
            return call.func(*a, **kw)
        # The live states, as the recorded ones cover (a generator= of the
        # user's own included), are put back after the replay.
        live = _rng_states(False, call.rng[1], [g for g, _ in call.rng[2]],
                           call.rng[3] is not None)
        _set_rng_states(call.rng)
        try:
            return call.func(*a, **kw)
        finally:
            _set_rng_states(live)


