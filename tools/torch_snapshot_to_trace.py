#!/usr/bin/env python3
"""Turns a PyTorch memory snapshot with recorded history into an RMM replay log.

    python3 tools/torch_snapshot_to_trace.py snapshot.pickle -o trace.csv
    build/bin/remat replay trace.csv

The snapshot is the pickle torch.cuda.memory._dump_snapshot() writes after
torch.cuda.memory._record_memory_history() (or one `remat replay --snapshot`
writes). Its `device_traces` become the CSV `remat replay` reads
(Thread,Time,Action,Pointer,Size,Stream; see trace/rmm_log.h):

* `alloc` is an allocate of the size the caller asked for.
* A free is the `free_completed` of the block (when the allocator could reuse
  it), or its `free_requested` when no completion follows in the trace (the
  snapshot was taken while other streams still used the block).
* Segment events, `oom` and any other action are skipped: the replay's own
  allocator makes its own segments and runs out of memory on its own.
* A free of an address the trace never allocated belongs to an allocation made
  before recording began (or lost from the front of a full history ring): it
  is skipped, and counted on stderr.

Times are time_us modulo a day (the log's clock reads time of day); the
thread column is 0; streams and addresses are written in hex. Only the Python
standard library is needed. The pickle is loaded with an unpickler that
refuses every class but a few plain containers, so an untrusted snapshot
cannot run code.
"""

import argparse
import collections
import os
import pickle
import sys

# Run from a checkout, the package's sources in python/ come first; else the
# installed package. Only its standard-library path check is used.
_CHECKOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
if os.path.isfile(os.path.join(_CHECKOUT, "remat", "_paths.py")):
    sys.path.insert(0, _CHECKOUT)
from remat._paths import OutputPathError, check_output_paths  # noqa: E402

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
US_PER_DAY = 86_400 * 1_000_000
THREAD = 0


class PlainDataUnpickler(pickle.Unpickler):
    """Loads plain data only: builtins' containers and scalars, nothing callable."""

    ALLOWED = {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module, name):
        # Protocols 0-2 name Python 2's module; Unpickler maps it to builtins.
        if ({"__builtin__": "builtins"}.get(module, module), name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a memory snapshot holds plain data only")


class SnapshotError(Exception):
    """The input is not a snapshot this tool can convert."""


def load_snapshot(path):
    with open(path, "rb") as f:
        snapshot = PlainDataUnpickler(f).load()
    if not isinstance(snapshot, dict):
        raise SnapshotError(f"{path}: not a memory snapshot (a {type(snapshot).__name__}, "
                            "not a dict)")
    return snapshot


def device_trace(snapshot, device, path):
    """The trace of `device`, or of the only device that recorded one."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise SnapshotError(f"{path}: no device_traces: record the history first "
                            "(torch.cuda.memory._record_memory_history())")
    recorded = [i for i, trace in enumerate(traces) if trace]
    if device is None:
        if not recorded:
            raise SnapshotError(f"{path}: device_traces are empty: no history was recorded")
        if len(recorded) > 1:
            raise SnapshotError(f"{path}: devices {recorded} recorded history; choose one "
                                "with --device")
        device = recorded[0]
    if not 0 <= device < len(traces):
        raise SnapshotError(f"{path}: no device {device} (the snapshot has {len(traces)})")
    return traces[device]


Row = collections.namedtuple("Row", "time_us action addr size stream")


class Converter:
    """Turns trace entries, in order, into allocate and free rows."""

    def __init__(self):
        self.rows = []           # Row, or None where a free moved to its completion
        self.live = {}           # addr -> size of allocations the trace made
        self.requested = {}      # addr -> index in rows of a free awaiting completion
        self.unknown = set()     # addrs whose free_requested was of an unknown allocation
        self.unknown_frees = 0   # frees of allocations made before the trace began
        self.skipped = collections.Counter()  # other actions, by name

    def add(self, index, entry):
        if not isinstance(entry, dict):
            raise SnapshotError(f"trace entry {index} is not a dict")
        action = entry.get("action")
        handler = {
            "alloc": self.alloc,
            "free_requested": self.free_requested,
            "free_completed": self.free_completed,
        }.get(action)
        if handler is None:
            self.skipped[action] += 1
            return
        # Older snapshots have no time_us; their rows all read midnight.
        fields = [entry.get("addr"), entry.get("size"), entry.get("stream", 0),
                  entry.get("time_us", 0)]
        if not all(isinstance(field, int) and field >= 0 for field in fields):
            raise SnapshotError(f"trace entry {index} ({action}) needs non-negative integers "
                                f"addr, size, stream and time_us: {entry!r}")
        handler(index, *fields)

    def alloc(self, index, addr, size, stream, time_us):
        if addr in self.live:
            raise SnapshotError(f"trace entry {index}: alloc at {addr:#x}, which is already "
                                "allocated and not freed")
        # A free still awaiting completion when the address is reused has completed.
        self.requested.pop(addr, None)
        self.unknown.discard(addr)
        self.live[addr] = size
        self.rows.append(Row(time_us, "allocate", addr, size, stream))

    def free_requested(self, index, addr, size, stream, time_us):
        if addr not in self.live:
            self.unknown_frees += 1
            self.unknown.add(addr)
            return
        self.requested[addr] = len(self.rows)
        self.rows.append(Row(time_us, "free", addr, self.live.pop(addr), stream))

    def free_completed(self, index, addr, size, stream, time_us):
        if addr in self.requested:
            position = self.requested.pop(addr)
            row = self.rows[position]
            self.rows[position] = None
            self.rows.append(row._replace(time_us=time_us, stream=stream))
        elif addr in self.unknown:
            self.unknown.discard(addr)  # counted at its free_requested
        elif addr in self.live:  # no free_requested recorded: the completion is the free
            self.rows.append(Row(time_us, "free", addr, self.live.pop(addr), stream))
        else:
            self.unknown_frees += 1


def format_time(time_us):
    """HH:MM:SS.ffffff of the time of day."""
    seconds, micros = divmod(int(time_us) % US_PER_DAY, 1_000_000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{micros:06d}"


def write_csv(rows, out):
    out.write(HEADER + "\n")
    for row in rows:
        if row is not None:
            out.write(f"{THREAD},{format_time(row.time_us)},{row.action},{row.addr:#x},"
                      f"{row.size},{row.stream:#x}\n")


def convert(snapshot_path, output_path, device=None):
    """Writes the CSV; returns the Converter for its counts."""
    trace = device_trace(load_snapshot(snapshot_path), device, snapshot_path)
    converter = Converter()
    for index, entry in enumerate(trace):
        converter.add(index, entry)
    with open(output_path, "w", newline="") as out:
        write_csv(converter.rows, out)
    return converter


def summary(converter, output_path):
    rows = [row for row in converter.rows if row is not None]
    allocs = sum(row.action == "allocate" for row in rows)
    lines = [f"wrote {output_path}: {allocs} allocations, {len(rows) - allocs} frees"]
    if converter.unknown_frees:
        lines.append(f"skipped {converter.unknown_frees} frees of allocations made before the "
                     "trace began")
    for action, count in sorted(converter.skipped.items(), key=lambda item: str(item[0])):
        lines.append(f"skipped {count} {action} events")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Turn a PyTorch memory snapshot's recorded history into an RMM replay "
                    "log for `remat replay`.")
    parser.add_argument("snapshot", help="snapshot pickle (torch.cuda.memory._dump_snapshot)")
    parser.add_argument("-o", "--output", required=True, help="RMM replay CSV to write")
    parser.add_argument("--device", type=int, default=None,
                        help="device whose trace to convert (default: the only one recorded)")
    args = parser.parse_args(argv)
    try:
        # Before the snapshot is read: the output must never be the snapshot.
        check_output_paths([("the snapshot", args.snapshot)], [("--output", args.output)])
        converter = convert(args.snapshot, args.output, args.device)
    except (OSError, OutputPathError, SnapshotError, pickle.UnpicklingError,
            EOFError) as error:
        print(f"torch_snapshot_to_trace: {error}", file=sys.stderr)
        return 2
    print(summary(converter, args.output), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
