#!/usr/bin/env python3
"""Generates the example allocation logs in examples/traces/ (RMM replay CSV).

The logs are synthetic but shaped like real ones: a first-fit pool hands out
256-byte aligned addresses (as RMM's pool does), so pointers are reused after
their frees and never overlap while live. Everything is deterministic (fixed
seeds), so rerunning the script reproduces the shipped files byte for byte.

    python3 scripts/make_alloc_traces.py [--out examples/traces]

Standard library only.
"""

import argparse
import bisect
import os
import random

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

MAIN_THREAD = 2342727
LOADER_THREAD = 2342781


def round_up(n, to):
    return (n + to - 1) // to * to


class Pool:
    """First-fit over an address-ordered, coalescing free list."""

    ALIGN = 256

    def __init__(self, base, size):
        self.free = [(base, size)]  # (address, length), sorted by address

    def take(self, size):
        size = round_up(max(size, 1), self.ALIGN)
        for i, (addr, length) in enumerate(self.free):
            if length >= size:
                if length == size:
                    del self.free[i]
                else:
                    self.free[i] = (addr + size, length - size)
                return addr
        raise MemoryError(f"pool cannot hold {size} more bytes")

    def give(self, addr, size):
        size = round_up(max(size, 1), self.ALIGN)
        i = bisect.bisect_left(self.free, (addr, 0))
        if i < len(self.free) and addr + size == self.free[i][0]:
            size += self.free[i][1]
            del self.free[i]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == addr:
            addr, size = self.free[i - 1][0], self.free[i - 1][1] + size
            del self.free[i - 1]
            i -= 1
        self.free.insert(i, (addr, size))


class Log:
    """Writes RMM log lines while tracking what is live."""

    def __init__(self, rng, start_seconds, base=0x7F3A00000000, capacity=80 * GIB):
        self.rng = rng
        self.pool = Pool(base, capacity)
        self.now_us = start_seconds * 1_000_000
        self.lines = [HEADER]

    def _emit(self, action, ptr, size, stream, thread, gap_us):
        self.now_us += gap_us if gap_us is not None else self.rng.randint(2, 40)
        us = self.now_us % (24 * 3600 * 1_000_000)
        stamp = "%02d:%02d:%02d.%06d" % (
            us // 3_600_000_000, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000)
        self.lines.append(f"{thread},{stamp},{action},{ptr:#x},{size},{stream:#x}")

    def alloc(self, size, stream=0, thread=MAIN_THREAD, gap_us=None):
        # Zero-byte requests get a null pointer, as RMM's pool returns them.
        ptr = self.pool.take(size) if size > 0 else 0
        self._emit("allocate", ptr, size, stream, thread, gap_us)
        return (ptr, size)

    def free(self, block, stream=0, thread=MAIN_THREAD, gap_us=None):
        ptr, size = block
        if size > 0:
            self.pool.give(ptr, size)
        self._emit("free", ptr, size, stream, thread, gap_us)

    def fail(self, size, stream=0, thread=MAIN_THREAD):
        self._emit("allocate failure", 0, size, stream, thread, None)

    def temporary(self, size, stream=0, thread=MAIN_THREAD):
        self.free(self.alloc(size, stream, thread), stream, thread)

    def text(self):
        return "\n".join(self.lines) + "\n"


def training_step():
    """A GPT-style decoder (12 layers, hidden 1024) trained with AdamW, fp16
    activations and fp32 weights, for six iterations with bucketed sequence
    lengths (so sizes change between iterations, as with dynamic padding)."""
    rng = random.Random(20240611)
    log = Log(rng, start_seconds=14 * 3600 + 2 * 60 + 11)
    layers, hidden, ffn, heads, batch, vocab, max_seq = 12, 1024, 4096, 16, 8, 32000, 512

    # Weights, in the order a module's __init__ creates them (fp32).
    shapes = [vocab * hidden, max_seq * hidden]
    for _ in range(layers):
        shapes += [hidden, hidden, 3 * hidden * hidden, 3 * hidden, hidden * hidden, hidden,
                   hidden, hidden, hidden * ffn, ffn, ffn * hidden, hidden]
    shapes += [hidden, hidden]
    weights = [log.alloc(n * 4) for n in shapes]
    per_layer = 12
    adam_state = None

    # cuBLAS probes for a large workspace, is refused, and settles for less.
    log.fail(24 * GIB)
    log.alloc(32 * MIB)  # the workspace it keeps

    for _ in range(6):
        seq = rng.choice([512, 512, 448, 384])
        tokens = batch * seq
        act = tokens * hidden * 2
        attn = batch * heads * seq * seq
        ids = log.alloc(tokens * 8)
        labels = log.alloc(tokens * 8)
        embedded = log.alloc(act)
        x = embedded
        saved = []  # per layer: tensors kept for backward, in creation order

        for _ in range(layers):
            keep = []
            ln1 = log.alloc(act)
            keep += [ln1, log.alloc(tokens * 4), log.alloc(tokens * 4)]  # LayerNorm mean, rstd
            qkv = log.alloc(3 * act)
            keep.append(qkv)
            k_t = log.alloc(act)  # contiguous transposed keys
            scores = log.alloc(attn * 2)
            probs = log.alloc(attn * 2)
            log.free(scores)
            keep += [probs, log.alloc(attn)]  # softmax output, dropout mask
            dropped = log.alloc(attn * 2)
            ctx = log.alloc(act)
            log.free(dropped)
            log.free(k_t)
            keep.append(ctx)
            for _ in range(rng.randint(1, 3)):  # reductions, index tensors
                log.temporary(rng.choice([4, 8, 64, 512, 2048]) * rng.randint(1, 8))
            proj = log.alloc(act)
            keep += [proj, log.alloc(tokens * hidden)]  # dropout mask
            resid = log.alloc(act)
            keep.append(resid)
            ln2 = log.alloc(act)
            keep += [ln2, log.alloc(tokens * 4), log.alloc(tokens * 4)]
            fc1 = log.alloc(tokens * ffn * 2)
            gelu = log.alloc(tokens * ffn * 2)
            keep += [fc1, gelu]
            fc2 = log.alloc(act)
            keep += [fc2, log.alloc(tokens * hidden)]
            x = log.alloc(act)  # second residual: the next layer's input
            keep.append(x)
            saved.append(keep)

        lnf = log.alloc(act)
        logits = log.alloc(tokens * vocab * 2)
        log_probs = log.alloc(tokens * vocab * 4)
        ignored = log.alloc(0)  # empty ignore-index selection
        loss = log.alloc(4)
        nll_tmp = log.alloc(tokens * 4)
        log.free(nll_tmp)

        # Backward: gradients appear as activations die, in reverse.
        grad = log.alloc(4)
        log.free(loss)
        g_logits = log.alloc(tokens * vocab * 2)
        log.free(log_probs)
        log.free(grad)
        grads = [None] * len(weights)

        def weight_grad(i):
            if grads[i] is None:
                grads[i] = log.alloc(shapes[i] * 4)
            else:  # accumulate: a temporary, then added in place
                log.temporary(shapes[i] * 4)

        weight_grad(0)  # tied embedding, through the LM head
        g = log.alloc(act)
        log.free(g_logits)
        log.free(logits)
        weight_grad(len(weights) - 2)
        weight_grad(len(weights) - 1)
        log.free(lnf)

        for layer in reversed(range(layers)):
            first = 2 + layer * per_layer
            keep = saved.pop()
            # Walk the layer's saved tensors backwards: each step makes the
            # gradient of its input, frees the incoming one and the saved tensor.
            for j, tensor in enumerate(reversed(keep)):
                if tensor[1] >= act and rng.random() < 0.35:
                    log.temporary(rng.choice([1, 2, 4]) * MIB)  # cuBLAS split-k scratch
                g_in = log.alloc(max(act, tensor[1]) if j % 3 == 0 else act)
                log.free(g)
                log.free(tensor)
                g = g_in
                if j % 2 == 0:
                    weight_grad(first + (len(keep) - 1 - j) % per_layer)
            for i in range(first, first + per_layer):
                if grads[i] is None:
                    weight_grad(i)
            if rng.random() < 0.3:
                log.temporary(0)  # an empty tensor from a masked select
        weight_grad(1)
        log.free(g)
        log.free(embedded)
        log.free(ignored)
        log.free(ids)
        log.free(labels)

        # Gradient clipping: per-tensor norms, then the total.
        norms = [log.alloc(4) for _ in weights]
        total = log.alloc(4)
        for n in norms:
            log.free(n)
        log.free(total)

        # AdamW (foreach): state on the first step, per-chunk temporaries after.
        if adam_state is None:
            adam_state = [(log.alloc(n * 4), log.alloc(n * 4)) for n in shapes]
            log.alloc(4)  # the step counter
        for lo in range(0, len(shapes), 16):
            chunk = shapes[lo:lo + 16]
            tmps = [log.alloc(n * 4) for n in chunk]  # bias-corrected denominators
            for t in reversed(tmps):
                log.free(t)
        log.temporary(0)
        # zero_grad(set_to_none=True)
        for gr in grads:
            log.free(gr)

    # The run goes on: weights, optimizer state and the workspace stay live.
    return log.text()


def multistream():
    """An image model fed by a loader thread: the loader copies batches on its
    stream while the trainer computes on another, and gradient buckets are
    reduced on the loader's stream, so the two streams' events interleave."""
    rng = random.Random(7)
    log = Log(rng, start_seconds=9 * 3600 + 30 * 60, base=0x7F80C0000000)
    compute, copy = 0x55D0C8A3F2B0, 0x55D0C8A41C60
    batch_bytes = 32 * 3 * 224 * 224 * 2

    def on_copy(fn, *args):
        return fn(*args, stream=copy, thread=LOADER_THREAD)

    weights = [log.alloc(rng.choice([64, 256, 1024, 2304, 4608]) * KIB, stream=compute)
               for _ in range(40)]
    ahead = [on_copy(log.alloc, batch_bytes), on_copy(log.alloc, 32 * 8)]
    for _ in range(24):
        batch, labels = ahead
        # The loader prefetches the next batch while this one computes.
        ahead = []
        acts = []
        size = 32 * 64 * 112 * 112 * 2
        for stage in range(16):
            if stage in (4, 8) and not ahead:
                ahead = [on_copy(log.alloc, batch_bytes), on_copy(log.alloc, 32 * 8)]
            acts.append(log.alloc(size, stream=compute))
            log.temporary(rng.randint(1, 32) * KIB, stream=compute)
            if stage % 4 == 3:
                size //= 2
        if not ahead:
            ahead = [on_copy(log.alloc, batch_bytes), on_copy(log.alloc, 32 * 8)]
        logits = log.alloc(32 * 1000 * 4, stream=compute)
        log.temporary(0, stream=compute)
        g = log.alloc(32 * 1000 * 4, stream=compute)
        log.free(logits, stream=compute)
        buckets = []
        for stage, a in enumerate(reversed(acts)):
            g_in = log.alloc(a[1], stream=compute)
            log.free(g, stream=compute)
            log.free(a, stream=compute)
            g = g_in
            if stage % 5 == 4:  # a 25 MiB bucket is full: all-reduce it on the side stream
                buckets.append(on_copy(log.alloc, 25 * MIB))
                if len(buckets) > 1:
                    on_copy(log.free, buckets.pop(0))
        log.free(g, stream=compute)
        for b in buckets:
            on_copy(log.free, b)
        on_copy(log.free, batch)
        on_copy(log.free, labels)
        for w in weights[:8]:
            log.temporary(w[1], stream=compute)  # optimizer scratch
    for b in ahead:
        on_copy(log.free, b)
    return log.text()


def tiny():
    """Fifteen lines whose replay numbers are easy to work out by hand (see
    sim/alloc_replay_test.cc): small and large pools, a segment of its own, a
    logged failure, and zero-byte allocations with null and non-null pointers."""
    t = MAIN_THREAD
    rows = [
        ("allocate", 0x7F3A00000000, 1000),
        ("allocate", 0x7F3A00000400, 3000),
        ("allocate", 0x0, 0),
        ("allocate", 0x7F3A00200000, 4 * MIB),
        ("free", 0x7F3A00000000, 1000),
        ("allocate failure", 0x0, 100 * GIB),
        ("allocate", 0x7F3A00000000, 512),
        ("allocate", 0x7F3A01000000, 0),
        ("free", 0x0, 0),
        ("free", 0x7F3A01000000, 0),
        ("allocate", 0x7F3A02000000, 24 * MIB),
        ("free", 0x7F3A00200000, 4 * MIB),
        ("free", 0x7F3A00000400, 3000),
        ("free", 0x7F3A02000000, 24 * MIB),
    ]
    lines = [HEADER]
    for i, (action, ptr, size) in enumerate(rows):
        lines.append(f"{t},10:00:00.{(i + 1) * 125:06d},{action},{ptr:#x},{size},0x0")
    return "\n".join(lines) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(root, "examples", "traces"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, make in [("training_step.csv", training_step), ("multistream.csv", multistream),
                       ("tiny.csv", tiny)]:
        text = make()
        path = os.path.join(args.out, name)
        with open(path, "w", newline="\n") as f:
            f.write(text)
        print(f"{path}: {text.count(chr(10)) - 1} events, {len(text)} bytes")


if __name__ == "__main__":
    main()
