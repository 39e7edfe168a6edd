#!/usr/bin/env python3
"""Checks a memory snapshot pickle written by remat against PyTorch's layout.

Usage: check_snapshot_pickle.py SNAPSHOT.pickle

Loads it with a class-refusing unpickler (plain data only), checks every key
of every segment, block and trace entry, that blocks tile their segment in
address order and that the segment sizes are the sums of their blocks', then
prints one line per segment, block and trace entry, which the C++ tests
compare with the Snapshot they wrote. Exits 1 with the failed check on stderr.
"""
import pickle
import sys

SNAPSHOT_KEYS = {"segments", "device_traces", "allocator_settings"}
SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id",
                "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected class {module}.{name}")


def check(condition, message):
    if not condition:
        sys.exit(f"check_snapshot_pickle: {message}")


def check_segment(seg):
    check(set(seg) == SEGMENT_KEYS, f"segment keys {sorted(seg)}")
    check(seg["device"] == 0 and seg["segment_pool_id"] == (0, 0), "device or pool id")
    check(seg["is_expandable"] is False and seg["frames"] == [], "is_expandable or frames")
    check(seg["segment_type"] in ("small", "large"), f"segment_type {seg['segment_type']!r}")
    blocks = seg["blocks"]
    end = seg["address"]
    for block in blocks:
        check(set(block) == BLOCK_KEYS and block["frames"] == [], f"block keys {sorted(block)}")
        check(block["state"] in STATES, f"state {block['state']!r}")
        check(block["address"] == end, f"block at {block['address']:#x} does not follow {end:#x}")
        end += block["size"]
    check(end == seg["address"] + seg["total_size"], f"blocks end at {end:#x}, not the segment's")
    active = [b for b in blocks if b["state"] != "inactive"]
    check(seg["allocated_size"] == sum(b["size"] for b in active
                                       if b["state"] == "active_allocated"), "allocated_size")
    check(seg["active_size"] == sum(b["size"] for b in active), "active_size")
    check(seg["requested_size"] == sum(b["requested_size"] for b in active), "requested_size")


def summary_lines(snapshot):
    for seg in snapshot["segments"]:
        yield (f"segment {seg['segment_type']} {seg['address']} {seg['total_size']} "
               f"stream {seg['stream']}")
        for b in seg["blocks"]:
            yield f"  {b['state']} {b['address']} {b['size']} {b['requested_size']}"
    for entry in snapshot["device_traces"][0]:
        yield (f"{entry['action']} {entry['addr']} {entry['size']} {entry['stream']} "
               f"{entry['time_us']}")


def main(path):
    with open(path, "rb") as f:
        snapshot = PlainData(f).load()
    check(isinstance(snapshot, dict) and set(snapshot) == SNAPSHOT_KEYS,
          f"top-level keys {sorted(snapshot) if isinstance(snapshot, dict) else type(snapshot)}")
    check(snapshot["allocator_settings"] == {}, "allocator_settings")
    for seg in snapshot["segments"]:
        check_segment(seg)
    check(len(snapshot["device_traces"]) == 1, "one device trace")
    for entry in snapshot["device_traces"][0]:
        check(set(entry) == TRACE_KEYS and entry["frames"] == [], f"trace keys {sorted(entry)}")
        check(entry["action"] in ACTIONS, f"action {entry['action']!r}")
    for line in summary_lines(snapshot):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
