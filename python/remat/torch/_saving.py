"""Saving: what autograd saves for the backward is handed to the runtime
(a mixin of Engine)."""
import ctypes
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from remat import _capi
from remat.torch._common import _below_python_dispatch, _count, _id_array, _storage
from remat.torch._records import _Handle, _Kept, _NO_TORCH_FUNCTION, _Ref, _Storage, _alias
from remat.torch._session import _Internal


class _Saving:
    """Engine's saved-tensor hooks' pack side, and what decides how each
    saved storage is registered."""

    def pack(self, t):
        # Without the budget's torch-function mode (_Backward): else each
        # metadata read below goes through it, about a microsecond each.
        with _NO_TORCH_FUNCTION():
            return self._pack(t)

    def _pack(self, t):
        if self.closed or self.internal:
            return t
        st = _storage(t)
        if st is None:
            # No strided storage of its own (sparse, nested): kept as
            # autograd keeps it.
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        if self.dead_handles:
            self._free_dead()
        if self.pins:
            self._release_pins()  # a forward again: the last backward node has run
        s = self.storages.get(st._cdata)
        if s is None or s.leaf or s.exported or t.dtype != s.dtype or s.nbytes == 0 or \
                (t.is_leaf and t.requires_grad) or t.is_conj() or t.is_neg():
            # Made before the context, a parameter (wherever it was made), one
            # whose bytes were handed outside autograd (exported), a view of
            # another dtype, or one whose conj/neg bit a view would lose.
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        if s.id is not None and s.freed and not s.pinned_forever:
            # Saved again after the runtime let it go: a new runtime tensor.
            self.by_id.pop(s.id, None)
            s.id = None
            s.freed = False
            s.regions = []
        if s.id is None:
            self._register(s, t)
        elif s.reg_version != s.version and not s.pinned_forever:
            # Saved again after in-place writes that left the views saved so
            # far alone (else it would be pinned): the newer content serves all.
            _, _, why_not = self._frontier(s, s.version)
            if why_not:
                self._pin_forever(s, "written in place after it was saved, then saved again")
            else:
                s.reg_version = s.version
                self._hold_newest(s, t)
        if not s.pinned_forever:
            s.regions.append((tuple(t.size()), tuple(t.stride()), t.storage_offset()))
        if s.pinned_forever:
            self.counts["saved_unmanaged"] += 1
            return _Kept(t)
        s.handles += 1
        self.counts["saved_tensors"] += 1
        return _Handle(self, s, t)

    def _hold_newest(self, s, t):
        """s is saved again with newer content than remat holds for it (a
        write autograd does not see, beside its saved views). A tensor remat
        recomputed or copied back, or its host copy, holds the content it
        was made of: the program's own storage (t's) holds the newer, which
        every saved view of s now reads."""
        if s.tensor is not None and s.tensor_version != s.version:
            s.tensor = t
            s.tensor_version = s.version
        if s.ahead is not None and s.host_version != s.version:
            s.ahead = None  # made of the older content: an offload copies afresh
        if s.host is not None and s.host_version != s.version:
            with _Internal(self):
                s.host = self._copy_out(t)
            s.host_version = s.version
        if s.backup is not None and s.backup_version != s.version:
            s.backup = None  # of the older content: a replay of the newer must do

    def _overlaps(self, s, r):
        """Whether view r of storage s touches an element a saved view of s
        reads (True when unsure: a storage too large to map cheaply)."""
        if not s.regions:
            return False
        itemsize = torch.empty((), dtype=s.dtype).element_size()
        if r.dtype != s.dtype or s.nbytes // itemsize > (1 << 24):
            return True
        with _Internal(self):
            mask = torch.zeros(s.nbytes // itemsize, dtype=torch.bool)
            for size, stride, offset in s.regions:
                mask.as_strided(size, stride, offset).fill_(True)
            return bool(mask.as_strided(r.size, r.stride, r.offset).any())

    def _pin_forever(self, s, why):
        """Brings s back (recomputed from what its inputs are now) and keeps
        it resident to the end (`why`: for the error if the budget cannot
        hold what is kept)."""
        if s.pinned_forever or s.freed:
            return
        self.why_pinned[s.index] = why
        self._acquire(s)
        s.pinned_forever = True
        self.forever_bytes += s.nbytes
        self._drain()

    def _keep_readers(self, leaf, why):
        """A tensor made before the context is about to be written (or its
        bytes handed outside autograd): what a recompute would read from it
        must be brought back now, while it still holds what they read, and
        kept (`why`: for the error if the budget cannot hold what is kept)."""
        if self.pins:
            self._release_pins()
        self._free_dead()
        readers, leaf.readers = leaf.readers, None
        for ref in readers:
            s = ref()
            if s is not None and s.id is not None:
                self._pin_forever(s, why)

    def exported(self, t):
        """t's bytes are handed outside autograd (numpy, DLPack, data_ptr):
        from now on they may be written with no ATen call to record (a
        numpy ufunc's out=, a kernel of another library), so remat cannot
        know what they hold. Its rule: such a storage is never dropped and
        never offloaded (its copy would miss a later write): saved before,
        it stays resident from now on, as the program's own bytes, to the
        step's end; saved after, it is left to autograd. And no replay reads
        it: what was saved before and would is brought back now (while the
        bytes still hold what it read) and kept; what is saved after and
        would is not droppable (offloaded, if at all, as its own bytes)."""
        if self.closed or self.internal:
            return
        st = _storage(t)
        if st is None:
            return
        s = self.storages.get(st._cdata)
        if s is None:
            s = _Storage(len(self.by_index), True, st._cdata, StorageWeakRef(st))
            self.storages[st._cdata] = s
            self.by_index.append(s)
        if s.exported:
            return
        s.exported = True
        if s.readers:
            self._keep_readers(s, "computed from bytes handed outside autograd (numpy, DLPack, "
                                  "data_ptr), which may be written there")
        if not s.leaf and s.id is not None and not s.freed:
            self._pin_forever(s, "its bytes were handed outside autograd (numpy, DLPack, "
                                 "data_ptr)")
            if s.tensor is None or s.tensor.untyped_storage()._cdata != s.key:
                with _below_python_dispatch():
                    whole = torch.empty(0, dtype=s.dtype, device=t.device)
                    s.tensor = whole.set_(st, 0, (s.nbytes // whole.element_size(),), (1,))
            s.tensor_version = s.version

    def data_set(self, t):
        """`t.data = ...` is about to move t onto other bytes. Autograd reads
        what t holds then where it saved t as an input (it holds t itself),
        and the bytes it saved where it saved t as an output (a copy of its
        TensorImpl): remat's own hold of t's present bytes must not follow
        t, and the handles of t saved as an input read t (unpack)."""
        if self.closed:
            return
        st = _storage(t)
        s = self.storages.get(st._cdata) if st is not None else None
        if s is not None and not s.leaf:
            if s.tensor is t:
                s.tensor = _alias(t)
            if s.tensor_ref is not None and s.tensor_ref() is t:
                s.tensor_ref = None  # (no longer a tensor over s)
        self.moved[id(t)] = t

    def _register(self, s, t):
        inputs, cost, why_not = self._frontier(s, s.version)
        s.droppable = not why_not
        s.why_kept = why_not
        if why_not:
            self.counts["kept_not_replayable"] += 1
        allow_drop = 1 if (self.recompute and s.droppable) else 0
        allow_offload = 1 if self.offload else 0
        if self.weigh_replays:
            # (Keyed in the order tensors are handed over, as in every step.)
            self._beside_key(s)
        if allow_drop and allow_offload:
            # Dropped only where its replay can fit: the runtime estimates what
            # the replay holds at once, from its call graph; the planner admits
            # it by that, and by what earlier steps learned of its kind.
            verdict, s.copy_first = self.planner.admit_drop(
                s.beside_key, s.nbytes, self._replay_estimate(inputs, s.nbytes),
                self.replay_room)
            if verdict == _capi.OFFLOAD_OVER_SHARE:
                allow_drop = 0
                self.counts["offload_not_drop"] += 1
            elif verdict == _capi.OFFLOAD_BESIDE_PINNED:
                allow_drop = 0
                self.counts["offload_not_drop_seen"] += 1
            elif verdict == _capi.OFFLOAD_SEEN_TO_FAIL:
                allow_drop = 0
                self.counts["offload_not_drop_failed"] += 1
        s.want_backup = bool(allow_drop and allow_offload) and self._wants_backup(s)
        if allow_drop and self.drop_first:
            allow_offload = 0
        tid = ctypes.c_uint64()
        s.tensor = t
        s.tensor_version = s.version
        s.device = t.device
        s.reg_version = s.version
        call = s.producer[0]
        s.allow_drop = allow_drop
        sibling = self._sibling(s)
        if sibling is not None:
            # One more output of a call the runtime knows: its content is the
            # call's alone (no write since), so the call's run regenerates it.
            status = self.lib.remat_call_add_output(self.runtime, sibling.id, s.nbytes,
                                                    allow_drop, allow_offload, 0,
                                                    ctypes.byref(tid), None)
        else:
            opts = _capi.CallOptions()
            ids = _id_array(max(1, len(inputs)))(*[i.id for i in inputs])
            opts.inputs = ids
            opts.num_inputs = len(inputs)
            opts.compute_ns = max(1, cost)
            opts.allow_drop = allow_drop
            opts.allow_offload = allow_offload
            # A copy made ahead is let go where record() sees a write to the
            # storage, so the runtime may copy ahead what it saved.
            opts.read_only = 1 if self.copy_ahead else 0
            opts.recompute = self.session.recompute_fn if allow_drop else \
                _capi.CALL_RECOMPUTE_FN()
            opts.user_data = len(self.groups)
            size = ctypes.c_size_t(s.nbytes)
            status = self.lib.remat_call_create(self.runtime, 1, ctypes.byref(size),
                                                ctypes.byref(opts), 0, ctypes.byref(tid), None)
        if status != _capi.OK:
            s.tensor = None
            message = self.lib.remat_last_error().decode("utf-8", "replace")
            if status == _capi.OUT_OF_MEMORY:
                raise self._cannot_hold(s, t, call.func)
            raise _capi.RematError(status, message)
        if sibling is not None:
            self.groups[call.group].append(s)
            s.group = call.group
        else:
            self.groups.append([s])
            s.group = len(self.groups) - 1
            if s.reg_version == 0:
                call.group = len(self.groups) - 1  # later outputs may join it
        s.id = tid.value
        self.by_id[s.id] = s
        s.order = len(self.registered)
        self.registered.append(s)
        self.lib.remat_tensor_release(self.runtime, s.id)
        self._drain()

    def _cannot_hold(self, s, t, func):
        """BudgetTooSmall for saved storage s (tensor t, made by func) that
        the runtime could not make room for as it was saved."""
        return self._budget_too_small(self._beside_what(
            s, f"cannot hold a saved tensor of {s.nbytes} bytes ({tuple(t.shape)} {t.dtype}, "
            f"made by {func})"))

    def _beside_what(self, s, what):
        """An error's two lines: the budget `what` (for storage s) beside
        what it held that it could not let go, and why; the ways out."""
        live = [k for k in self.registered if not k.freed and k is not s]
        kept = [k for k in live if k.pinned_forever]
        read_ids = set(self.pins)
        read = [k for k in live if k.id in read_ids and not k.pinned_forever]
        stuck = [k for k in live if not k.pinned_forever and k.id not in read_ids and
                 not k.allow_drop and not self.offload and k.tensor is not None]
        held = []
        fixes = []
        if kept:
            whys = "; ".join(sorted({self.why_pinned.get(k.index, "") for k in kept} - {""}))
            held.append(f"{_count(kept)} ({sum(k.nbytes for k in kept)} bytes) kept to "
                        f"the step's end ({whys})")
            fixes.append("make that write out of place (y = x + 1, not x.add_(1)) or do it "
                         "after the backward")
        if stuck:
            whys = "; ".join(sorted({k.why_kept for k in stuck} - {""}))
            held.append(f"{_count(stuck)} ({sum(k.nbytes for k in stuck)} bytes) that "
                        f"cannot be replayed ({whys}) with offload off")
            fixes.append("pass offload=True")
        if read:
            held.append(f"{_count(read)} ({sum(k.nbytes for k in read)} bytes) the "
                        "backward is reading now")
        need = s.nbytes + sum(k.nbytes for k in kept + stuck + read)
        fixes.append(f"raise the budget to at least {need} bytes" if need > self.budget_bytes
                     else "raise the budget")
        beside = ", ".join(held) if held else "nothing it must keep"
        fix = "; or ".join(fixes)
        return (f"remat.torch.budget({self.budget_bytes} bytes) {what} beside {beside}.\n"
                f"{fix[0].upper()}{fix[1:]}.")

    def _saw_fit(self, s):
        """A drop of s came back by replay, or was never needed again."""
        if s.beside_key is not None:
            self.planner.saw_replay(s.beside_key, s.nbytes, True)

    def _saw_fail(self, s):
        """A replay of dropped s could not fit."""
        if s.beside_key is not None:
            self.planner.saw_replay(s.beside_key, s.nbytes, False)

    def report_unfit(self):
        """The step raised BudgetTooSmall: the replay that failed it (no
        copy to come back from) is one its plan's next steps offload."""
        if self.unfit is not None:
            self._saw_fail(self.unfit)
            self.unfit = None

    def _wants_backup(self, s):
        """Whether a drop of s (its drop and offload both allowed) is copied
        to host memory first: no replay of its kind and size was seen to
        fit in the steps before (the planner's books)."""
        return s.copy_first

    def _beside_key(self, s):
        """s's kind in what steps learn (the planner's books, a 64-bit key):
        its producing op, which output, and how many such this step handed
        to the runtime before it (made once, as s is registered). The same
        tensor of every step of a program gets the same key."""
        if s.beside_key is None:
            call, j = s.producer
            kind = (str(call.func), j)
            n = self.kinds_handed.get(kind, 0)
            self.kinds_handed[kind] = n + 1
            s.beside_key = hash(kind + (n,)) & 0xFFFFFFFFFFFFFFFF
        return s.beside_key

    def _replay_estimate(self, inputs, nbytes):
        """The runtime's estimate of what a replay of a call reading the
        saved storages `inputs` and making `nbytes` holds at once."""
        ids = _id_array(max(1, len(inputs)))(*[i.id for i in inputs])
        out = self._estimate
        _capi.check(self.lib.remat_runtime_estimate_replay(self.runtime, ids, len(inputs), nbytes,
                                                           out),
                    "remat_runtime_estimate_replay")
        return out

    def _sibling(self, s):
        """A live saved output of s's call that s may join in the runtime
        (same content version 0, dropped alike: the runtime's call has a
        recompute closure or not), or None."""
        call = s.producer[0]
        if s.reg_version != 0 or call.group is None:
            return None
        for m in self.groups[call.group]:
            if m.id is not None and not m.freed and m.reg_version == 0 and \
                    m.allow_drop == s.allow_drop:
                return m
        return None

    @staticmethod
    def _brings_back(s, version):
        """Whether what the runtime brings back of saved storage s holds
        its content `version`: the tensor remat holds, its host copy, or a
        recompute (of its registered version). The program's own storage,
        written since it was saved, holds a later one."""
        if s.tensor is not None:
            return s.tensor_version == version
        if s.host is not None:
            return s.host_version == version
        return True

    def _frontier(self, s, version):
        """The saved storages a recompute of (s, version) reads (the runtime
        brings them back first), its cost, and why it cannot be replayed ("")."""
        inputs = []
        seen_inputs = set()
        cost = 0
        visited = set()
        read = set()  # the storages its recompute reads (Engine.exported)
        stack = [(s, version, True)]
        while stack:
            st, ver, top = stack.pop()
            if (st.index, ver) in visited:
                continue
            visited.add((st.index, ver))
            if st.exported:
                return [], 0, "its recompute reads bytes handed outside autograd (numpy, ...)"
            if not top:
                read.add(st)
            if not top and st.id is not None and not st.freed and st.reg_version == ver and \
                    self._brings_back(st, ver):
                if st.id not in seen_inputs:
                    seen_inputs.add(st.id)
                    inputs.append(st)
                continue
            if st.leaf:
                continue
            calls = [st.producer[0]] + st.writers[:ver]
            for call in calls:
                if call.why_not:
                    return [], 0, call.why_not
                cost += call.cost_ns
                for i, r in enumerate(call.leaves):
                    if not isinstance(r, _Ref):
                        continue
                    if r.storage.leaf:
                        if i in call.written:
                            continue  # replayed onto a scratch copy
                        if (r.version is not None and r.leaf_tensor._version != r.version) or \
                                r.storage.version != r.storage_writes:
                            return [], 0, (f"{call.func} read a tensor made before the context "
                                           "that was modified in place since")
                        if r.storage.exported:
                            return [], 0, ("its recompute reads bytes handed outside autograd "
                                           "(numpy, ...)")
                        read.add(r.storage)
                    elif r.storage is not st:  # (st itself: the content being rebuilt)
                        stack.append((r.storage, r.version, False))
        me = weakref.ref(s)
        for st in read:
            if st.readers is None:
                st.readers = []
            st.readers.append(me)
        return inputs, cost, ""

