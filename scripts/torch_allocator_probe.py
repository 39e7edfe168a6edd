"""On a GPU: runs the benchmark's rows with remat's allocator as PyTorch's
(as `python -m remat.torch.bench --remat-allocator` does) and checks, at
every step's end and after every pressure callback, that the memory of each
model's parameters and gradients, and of every live CUDA tensor, is still
mapped on the device (cuMemGetAddressRange finds it). The first tensor whose
memory is gone is reported with what remat's allocator last did at its
address (its event ring: set REMAT_SNAPSHOT for one), before any kernel
reads it.

  REMAT_SNAPSHOT=/tmp/snap.pickle python3 scripts/torch_allocator_probe.py \
      [--models gpt] [--ratios 0.5] [--methods plain,remat-drop] [--repeat 3]

Exit status 0: every check passed; 1: memory of a live tensor was unmapped.
"""
import argparse
import ctypes
import gc
import os
import pathlib
import pickle
import sys
import warnings
import weakref

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

import torch  # noqa: E402

import remat.torch  # noqa: E402
from remat.torch import _budget, bench  # noqa: E402
from remat.torch.testing import models  # noqa: E402

_range = None       # the driver's cuMemGetAddressRange_v2, once a GPU is found
_models = []        # weak references to every model the rows built
_checks = {"count": 0}


class Unmapped(RuntimeError):
    pass


def mapped(ptr, nbytes):
    """Whether [ptr, ptr + nbytes) lies in one device allocation (None: the
    driver cannot say, on a thread without the context, say)."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = _range(ctypes.byref(base), ctypes.byref(size), ptr)
    if r in (1, 500):  # CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND
        return False
    if r != 0:
        _checks["unknown"] = _checks.get("unknown", 0) + 1
        return None
    return ptr + nbytes <= base.value + size.value


def tensors(everything):
    for ref in _models:
        m = ref()
        if m is None:
            continue
        for name, p in m.named_parameters():
            yield f"parameter {name}", p
            if p.grad is not None:
                yield f"gradient of {name}", p.grad
    if everything:
        with warnings.catch_warnings():  # (isinstance on deprecated aliases warns)
            warnings.simplefilter("ignore")
            objects = gc.get_objects()
            live = [o for o in objects if _is_cuda_tensor(o)]
        for t in live:
            yield "a live tensor", t


def _is_cuda_tensor(o):
    try:
        return isinstance(o, torch.Tensor) and o.is_cuda
    except Exception:  # noqa: BLE001: objects that refuse isinstance
        return False


def check(where, everything=False):
    _checks["count"] += 1
    for what, t in tensors(everything):
        st = t.untyped_storage()
        if st.nbytes() == 0:
            continue
        if mapped(st.data_ptr(), st.nbytes()) is False:
            report(where, what, t, st.data_ptr(), st.nbytes())
            raise Unmapped(f"{where}: {what} {tuple(t.shape)} at {st.data_ptr():#x} "
                           f"({st.nbytes()} bytes) is not mapped")


def report(where, what, t, ptr, nbytes):
    print(f"\nUNMAPPED {where}: {what} {tuple(t.shape)} {t.dtype} storage {ptr:#x} "
          f"+{nbytes}", flush=True)
    path = os.environ.get("REMAT_SNAPSHOT")
    if not path:
        print("(set REMAT_SNAPSHOT for the allocator's events at that address)")
        return
    a = remat.torch._allocator.current()
    fn = a.so.remat_torch_write_snapshot
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p]
    out = path + ".probe"
    if fn(0, out.encode()) != 0:
        print("snapshot:", a.so.remat_torch_last_error().decode())
        return
    with open(out, "rb") as f:
        snap = pickle.load(f)
    for seg in snap.get("segments", []):
        lo, size = seg["address"], seg["total_size"]
        if lo <= ptr < lo + size:
            print(f"in remat's segment {lo:#x} +{size}:")
            for b in seg["blocks"]:
                print(f"  block +{b['address'] - lo:#x} {b['size']} {b['state']}")
            break
    else:
        print("in none of remat's segments")
    events = [e for trace in snap.get("device_traces", []) for e in trace]
    touching = [e for e in events
                if e["addr"] <= ptr < e["addr"] + max(e["size"], 1) or
                e["addr"] <= ptr + nbytes - 1 < e["addr"] + max(e["size"], 1)]
    print(f"{len(events)} events in the ring; the last 40 at this address:")
    for e in touching[-40:]:
        print(f"  {e['action']:<16} {e['addr']:#x} +{e['size']} stream {e.get('stream')}")


def instrument():
    real_gpt = models.gpt

    def gpt(*a, **kw):
        model, step = real_gpt(*a, **kw)
        _models.append(weakref.ref(model))
        return model, step
    bench.MODELS["gpt"] = (gpt,) + bench.MODELS["gpt"][1:]

    real_exit = remat.torch.budget.__exit__

    def exit_(self, *exc):
        try:
            return real_exit(self, *exc)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                check("at a budget's exit", everything=True)
    remat.torch.budget.__exit__ = exit_

    real_pressure = _budget.Engine._on_pressure

    def on_pressure(self, user, pressure):
        r = real_pressure(self, user, pressure)
        try:
            check("after a pressure callback")
        except Unmapped as e:
            self.pressure_error = self.pressure_error or e
        return r
    _budget.Engine._on_pressure = on_pressure


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt")
    parser.add_argument("--ratios", default="0.5")
    parser.add_argument("--methods", default="plain,checkpoint,save_on_cpu,remat-drop")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in bench.METHODS or m.startswith("compile")]
    if unknown or not methods:
        parser.error(f"--methods: not {', '.join(unknown) or '(none given)'}; one or more of "
                     f"{', '.join(m for m in bench.METHODS if not m.startswith('compile'))}")
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 77
    global _range
    _range = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
    _range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.c_uint64]
    _range.restype = ctypes.c_int
    bench._ALLOCATOR = remat.torch.use_allocator()
    instrument()
    try:
        bench.rows(args.models.split(","), [float(r) for r in args.ratios.split(",")],
                   args.repeat, "cuda", sys.stdout, only=methods)
        torch.cuda.synchronize()
        check("at the end", everything=True)
    except Unmapped as e:
        print(f"FAILED: {e}")
        return 1
    print(f"all {_checks['count']} checks passed: every live tensor's memory stayed mapped "
          f"({_checks.get('unknown', 0)} tensors the driver could not place)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
