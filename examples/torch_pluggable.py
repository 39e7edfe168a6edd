#!/usr/bin/env python3
"""remat's caching allocator inside PyTorch, both ways in.

  --mode process   the process-wide CUDA allocator (change_current_allocator,
                   before the first CUDA allocation)
  --mode mempool   only what runs inside `with torch.cuda.use_mem_pool(pool)`
                   (torch.cuda.MemPool, PyTorch 2.5 and later)

Trains a small MLP for a few steps and prints peak memory as PyTorch sees it
and as remat counts it. Needs a CUDA build of PyTorch and a GPU; the library
is build/lib/libremat_torch.so (or REMAT_TORCH_LIB). Try REMAT_BUDGET=2GiB
and REMAT_STATS=1 in the environment.
"""
import argparse
import ctypes
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIB = os.environ.get("REMAT_TORCH_LIB", str(ROOT / "build" / "lib" / "libremat_torch.so"))


def remat_stats(lib, device=0):
    out = (ctypes.c_uint64 * 4)()
    if lib.remat_torch_memory_stats(device, out) != 0:
        raise RuntimeError(lib.remat_torch_last_error().decode())
    return {"allocated": out[0], "peak_allocated": out[1], "reserved": out[2],
            "peak_reserved": out[3]}


def train(steps, width, batch):
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(batch, width, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["process", "mempool"], default="process")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_pluggable.py needs a GPU and a CUDA build of PyTorch")
    if not os.path.exists(LIB):
        sys.exit(f"{LIB} not found: build remat first (./scripts/test.sh) or set REMAT_TORCH_LIB")

    # As the process's allocator, remat_malloc (it raises when it cannot serve
    # a request); under a MemPool, PyTorch's caching allocator calls it and
    # checks for NULL, releasing its own cache and retrying: remat_try_malloc.
    symbol = "remat_malloc" if args.mode == "process" else "remat_try_malloc"
    alloc = torch.cuda.memory.CUDAPluggableAllocator(LIB, symbol, "remat_free")
    lib = ctypes.CDLL(LIB)
    lib.remat_torch_last_error.restype = ctypes.c_char_p
    if args.mode == "process":
        torch.cuda.memory.change_current_allocator(alloc)
        loss = train(args.steps, args.width, args.batch)
    else:
        if not hasattr(torch.cuda, "MemPool"):
            sys.exit("this PyTorch has no torch.cuda.MemPool (2.5 or later): use --mode process")
        pool = torch.cuda.MemPool(alloc.allocator())
        with torch.cuda.use_mem_pool(pool):
            loss = train(args.steps, args.width, args.batch)

    stats = remat_stats(lib)
    gib = 1 << 30
    print(f"mode {args.mode}: final loss {loss:.4f}")
    print(f"remat: peak allocated {stats['peak_allocated'] / gib:.3f} GiB, "
          f"peak reserved {stats['peak_reserved'] / gib:.3f} GiB")
    if args.mode == "mempool":
        print(f"torch (its own allocator, outside the pool): max allocated "
              f"{torch.cuda.max_memory_allocated() / gib:.3f} GiB")


if __name__ == "__main__":
    main()
