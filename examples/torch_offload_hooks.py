#!/usr/bin/env python3
"""Activations saved for backward live in remat, which offloads them under a
budget and brings them back byte for byte; the gradients are checked against
a plain run.

torch.autograd.graph.saved_tensors_hooks packs every tensor autograd saves
into a remat tensor (libremat.so's C ABI, through ctypes) that may be
offloaded, and unpacks it by acquiring it again. The runtime's budget is
smaller than the activations, so some are offloaded and restored.

  python3 examples/torch_offload_hooks.py                # simulated device: CPU tensors
  python3 examples/torch_offload_hooks.py --device cuda  # a GPU: CUDA tensors

With --device sim (the default) remat's device is host memory (a backed
simulated GPU) and the model runs on the CPU, so this runs without a GPU.
Needs PyTorch; the library is build/lib/libremat.so (or REMAT_LIB).
"""
import argparse
import ctypes
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIB = os.environ.get("REMAT_LIB", str(ROOT / "build" / "lib" / "libremat.so"))
# The C structs as ctypes declares them, from the package (python/remat), so
# that they follow remat.h; the library's ABI version is checked against them.
sys.path.insert(0, str(ROOT / "python"))
from remat._capi import ABI_VERSION, AllocatorOptions, RuntimeStats, TensorOptions  # noqa: E402


class CudaArray:
    """A raw device pointer torch.as_tensor can read (__cuda_array_interface__)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3}


class Remat:
    def __init__(self, device, budget):
        self.lib = lib = ctypes.CDLL(LIB)
        lib.remat_last_error.restype = ctypes.c_char_p
        if lib.remat_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{LIB} has C ABI version {lib.remat_abi_version()}, this example "
                               f"declares {ABI_VERSION}: rebuild the library from this checkout")
        options = AllocatorOptions()
        self.check(lib.remat_allocator_options_init(ctypes.byref(options)))
        options.device = 1 if device == "cuda" else 0
        options.budget_bytes = budget
        options.sim_backed = 1
        options.sim_capacity_bytes = 4 << 30
        self.alloc = ctypes.c_void_p()
        self.check(lib.remat_allocator_create(ctypes.byref(options), ctypes.byref(self.alloc)))
        self.rt = ctypes.c_void_p()
        self.check(lib.remat_runtime_create(self.alloc, b"lru", ctypes.byref(self.rt)))
        self.device = device
        self.stream = 0  # the default stream (on CUDA: torch's legacy default stream too)

    def check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.remat_last_error().decode())

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
        else:
            self.check(self.lib.remat_stream_synchronize(self.alloc, ctypes.c_uint64(self.stream)))

    def view(self, ptr, nbytes):
        if self.device == "cuda":
            return torch.as_tensor(CudaArray(ptr, nbytes), device="cuda")
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)

    def pack(self, t):
        t = t.detach()
        # Autograd saves views too (a Linear saves its weight transposed).
        # Restoring the same strides, not only the same values, keeps the
        # backward's kernels, and so their rounding, those of a plain run: a
        # dense view is saved as the block under it, in memory order, and
        # permuted back on the way out.
        order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.size(d)))
        undo = None
        if t.dim() and not t.is_contiguous() and t.permute(*order).is_contiguous():
            t, undo = t.permute(*order), [order.index(d) for d in range(t.dim())]
        t = t.contiguous()
        raw = t.view(torch.uint8).reshape(-1) if t.numel() else torch.empty(0, dtype=torch.uint8)
        options = TensorOptions()
        self.check(self.lib.remat_tensor_options_init(ctypes.byref(options)))
        options.allow_offload = 1
        tid, ptr = ctypes.c_uint64(), ctypes.c_void_p()
        self.check(self.lib.remat_tensor_create(self.rt, ctypes.c_size_t(raw.numel()),
                                                ctypes.byref(options), ctypes.c_uint64(self.stream),
                                                ctypes.byref(tid), ctypes.byref(ptr)))
        if raw.numel():
            self.sync()  # nothing queued may still touch the block
            self.view(ptr.value, raw.numel()).copy_(raw)
            self.sync()
        self.check(self.lib.remat_tensor_release(self.rt, tid))
        return (tid.value, t.shape, t.dtype, t.device, raw.numel(), undo)

    def unpack(self, packed):
        tid, shape, dtype, device, nbytes, undo = packed
        ptr = ctypes.c_void_p()
        self.check(self.lib.remat_tensor_acquire(self.rt, ctypes.c_uint64(tid),
                                                 ctypes.c_uint64(self.stream), ctypes.byref(ptr)))
        self.sync()
        data = self.view(ptr.value, nbytes).clone() if nbytes else torch.empty(0, dtype=torch.uint8)
        self.check(self.lib.remat_tensor_release(self.rt, ctypes.c_uint64(tid)))
        self.check(self.lib.remat_tensor_free(self.rt, ctypes.c_uint64(tid)))
        out = data.to(device).view(dtype).reshape(shape)
        return out.permute(*undo) if undo is not None else out

    def stats(self):
        stats = RuntimeStats()
        self.check(self.lib.remat_runtime_get_stats(self.rt, ctypes.byref(stats)))
        return stats


def step(model, x, hooks=None):
    model.zero_grad(set_to_none=True)
    if hooks is None:
        loss = model(x).square().mean()
    else:
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["sim", "cuda"], default="sim")
    parser.add_argument("--budget-mib", type=int, default=16)
    args = parser.parse_args()
    if not os.path.exists(LIB):
        sys.exit(f"{LIB} not found: build remat first (./scripts/test.sh) or set REMAT_LIB")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda needs a GPU and a CUDA build of PyTorch")
    where = "cuda" if args.device == "cuda" else "cpu"
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(where)
    x = torch.randn(512, 1024, device=where)

    plain_loss, plain_grads = step(model, x)
    # A second plain run: where the kernels are not bitwise reproducible the
    # comparison below cannot be either, and says so.
    again_loss, again_grads = step(model, x)
    reproducible = torch.equal(again_loss, plain_loss) and all(
        torch.equal(a, b) for a, b in zip(again_grads, plain_grads))
    remat = Remat(args.device, args.budget_mib << 20)
    loss, grads = step(model, x, remat)
    same = torch.equal(loss, plain_loss) and all(
        torch.equal(a, b) for a, b in zip(grads, plain_grads))
    if not same:
        worst = max((a - b).abs().max().item() for a, b in zip(grads, plain_grads))
        print(f"largest gradient difference {worst:.3g}; two plain runs "
              f"{'agree bitwise' if reproducible else 'differ too'}")
    st = remat.stats()
    mib = 1 << 20
    print(f"remat: {st.tensors_created} saved tensors, peak {st.peak_resident_bytes / mib:.1f} MiB "
          f"on the device under a {args.budget_mib} MiB budget; {st.offloads} offloaded "
          f"({st.offloaded_bytes / mib:.1f} MiB), {st.restored_bytes / mib:.1f} MiB restored")
    print(f"loss {loss.item():.6f} (plain {plain_loss.item():.6f}); gradients "
          f"{'identical' if same else 'DIFFER'} to the plain run's")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
