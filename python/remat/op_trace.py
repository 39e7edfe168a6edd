"""Reading remat's op traces (JSON Lines; trace/README.md) in Python.

The one reader the package's tools share: remat.optimal builds its program
from it, and scripts/dtr_log.py and scripts/op_trace_to_alloc_log.py convert
with it. It checks what every reader needs (a line within the cap, a JSON
object, a known op) and names the line it refuses; what each op's fields mean
is the caller's.

    with open(path, encoding="utf-8") as f:
        for number, text, op, record in op_trace.records(f, path):
            ...
"""
import json

# The longest line a trace may have, as the C++ readers cap it
# (base/line_reader.h): a file with no newline is refused at the cap, not read
# whole into memory first.
MAX_LINE = 16 << 20

# The record kinds of trace/op_trace.h.
OPS = ("constant", "call", "use", "release", "evict", "prefetch", "phase")


def lines(f, path="<trace>", cap=None):
    """(number, text) of each line of the open text file `f`, refusing one
    longer than `cap` characters (MAX_LINE by default) with a ValueError."""
    cap = MAX_LINE if cap is None else cap
    number = 0
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        number += 1
        if len(line) > cap:
            raise ValueError(f"{path}:{number}: the line is longer than {cap} characters "
                             "(a trace's lines are short: is this an op trace?)")
        yield number, line


def records(f, path="<trace>", cap=None):
    """(line number, text without its newline, op, record) for each record
    of the op trace in the open text file `f`; blank lines are skipped. A
    ValueError names the line of one that is too long, not a JSON object
    with an "op", or of an op not in OPS."""
    for number, line in lines(f, path, cap):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            op = record["op"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{number}: not an op record ({e})") from None
        if op not in OPS:
            raise ValueError(f"{path}:{number}: unknown op {op!r}")
        yield number, line.rstrip("\r\n"), op, record
