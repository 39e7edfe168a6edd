"""The host link's rates, measured once per device and process, at which the
runtime prices offloads (remat_runtime_options' link_gbps and
link_latency_ns): a policy that weighs an offload against a recompute must
know what the copy costs on this machine, not on a typical one."""
import math
import threading
import time

import torch

_lock = threading.Lock()
_measured = {}

_BYTES = 32 << 20   # one copy's size for the bandwidth
_SMALL = 4 << 10    # and for the latency
_ROUNDS = 3


def _timed(copy, sync):
    best = math.inf
    for _ in range(_ROUNDS):
        sync()
        start = time.perf_counter()
        copy()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def check(gbps, latency_us):
    """ValueError for a rate or latency budget() cannot take (None: measure)."""
    for name, value in (("link_gbps", gbps), ("link_latency_us", latency_us)):
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float)) or
                                  not math.isfinite(value) or value < 0 or
                                  (name == "link_gbps" and value == 0)):
            raise ValueError(f"{name} must be a finite number above 0 (at least 0 for the "
                             f"latency), or None to measure it, not {value!r}")


def rates(gbps, latency_us, allocator):
    """(GB/s, ns) of the host link, as given where given; else measured on
    the GPU the step's copies go to (CUDA in use, or remat's allocator as
    PyTorch's), or on the CPU the runtime's fixed defaults, so that CPU runs
    decide alike on every machine."""
    if torch.cuda.is_available() and (allocator or torch.cuda.is_initialized()):
        measured = measure(torch.device("cuda", torch.cuda.current_device()))
    else:
        measured = defaults()
    return (measured[0] if gbps is None else float(gbps),
            measured[1] if latency_us is None else int(latency_us * 1000))


def defaults():
    """(GB/s, ns): the runtime's own link, where none is measured."""
    import ctypes
    from remat import _capi
    ro = _capi.RuntimeOptions()
    _capi.check(_capi.lib().remat_runtime_options_init(ctypes.byref(ro)), "runtime options")
    return ro.link_gbps, ro.link_latency_ns


def _rounded(gbps, latency_ns):
    """Two significant figures of the rate and 100 ns of the latency: runs
    of one program on one machine then price alike."""
    digits = 1 - int(math.floor(math.log10(gbps))) if gbps > 0 else 0
    return round(gbps, digits), int(round(latency_ns, -2))


def measure(device):
    """(GB/s each way, ns per copy) between host memory and `device`: a
    pinned copy to and from a CUDA device, a host copy on the CPU (where
    remat's offloads are host copies). The quickest of a few rounds."""
    device = torch.device(device)
    key = str(device)
    with _lock:
        if key in _measured:
            return _measured[key]
        if device.type == "cuda":
            host = torch.empty(_BYTES, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(_BYTES, dtype=torch.uint8, device=device)

            def sync():
                torch.cuda.synchronize(device)

            def both(n):
                def run():
                    dev[:n].copy_(host[:n], non_blocking=True)
                    host[:n].copy_(dev[:n], non_blocking=True)
                return run
            copies = 2
        else:
            host = torch.empty(_BYTES, dtype=torch.uint8)
            dev = torch.empty_like(host)

            def sync():
                pass

            def both(n):
                def run():
                    dev[:n].copy_(host[:n])
                return run
            copies = 1
        both(_BYTES)()  # (first touch of the pages, CUDA's context)
        seconds = _timed(both(_BYTES), sync) / copies
        latency = _timed(both(_SMALL), sync) / copies
        gbps = _BYTES / max(seconds - latency, 1e-9) / 1e9
        figures = _rounded(gbps, max(0, int(latency * 1e9)))
        _measured[key] = figures
        return figures
