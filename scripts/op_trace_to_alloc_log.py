#!/usr/bin/env python3
"""Writes the allocation log (RMM replay CSV) of an op trace run as written.

Every storage the trace creates (a constant, or a call output that is not a
view) is allocated when it is made and freed when its last reference goes (its
root and every view of it released). `remat replay` then measures what a
caching allocator makes of the step, e.g. its fragmentation with and without
expandable segments:

    python3 scripts/op_trace_to_alloc_log.py examples/traces/densenet121_b8.jsonl -o d.csv
    remat replay d.csv --alloc-conf expandable_segments:True

Pointers are fresh 256-byte aligned addresses (never reused), times 10 us
apart, one stream and one thread. Reads with remat.op_trace (from the checkout).
"""

import argparse
import os
import sys

# The package's op-trace reader (python/remat/op_trace.py), from the checkout.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from remat import op_trace  # noqa: E402

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
THREAD = 1


def convert(lines):
    out = [HEADER]
    storage_of = {}   # tensor id -> storage key (its root's id)
    refs = {}         # storage key -> live references (root and views)
    address = {}      # storage key -> (pointer, bytes)
    next_ptr = [0x7F0000000000]
    clock = [0]

    def emit(action, ptr, size):
        clock[0] += 10
        us = clock[0]
        stamp = "%02d:%02d:%02d.%06d" % (
            us // 3_600_000_000 % 24, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000)
        out.append(f"{THREAD},{stamp},{action},{ptr:#x},{size},0x0")

    def create(tid, size):
        ptr = next_ptr[0]
        next_ptr[0] += max(256, (size + 255) // 256 * 256)
        storage_of[tid] = tid
        refs[tid] = 1
        address[tid] = (ptr, size)
        emit("allocate", ptr, size)

    for _, _, op, rec in op_trace.records(lines):
        if op == "constant":
            create(rec["id"], int(rec["bytes"]))
        elif op == "call":
            for o in rec["outputs"]:
                if "alias_of" in o:
                    root = storage_of[o["alias_of"]]
                    storage_of[o["id"]] = root
                    refs[root] += 1
                else:
                    create(o["id"], int(o["bytes"]))
        elif op == "release":
            root = storage_of.pop(rec["id"])
            refs[root] -= 1
            if refs[root] == 0:
                ptr, size = address.pop(root)
                del refs[root]
                emit("free", ptr, size)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="op trace (JSON Lines)")
    parser.add_argument("-o", "--output", required=True, help="the CSV to write")
    args = parser.parse_args()
    with open(args.trace) as f:
        out = convert(f)
    if args.output == args.trace:
        raise SystemExit("the output would overwrite the trace")
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{args.output}: {len(out) - 1} events", file=sys.stderr)


if __name__ == "__main__":
    main()
