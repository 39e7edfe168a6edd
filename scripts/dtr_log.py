#!/usr/bin/env python3
"""Converts a remat op trace (JSON Lines, trace/README.md) into the log
format the DTR simulator (`simrd`, github.com/uwsampl/dtr-prototype) parses:
one JSON object per line, keyed by "INSTRUCTION".

    python3 scripts/dtr_log.py TRACE.jsonl [-o LOG.jsonl] [--keep-live]

The mapping, record by record:

- The log opens with `ANNOTATE START` (simrd skips everything before it).
- `constant` -> `CONSTANT name`, then `MEMORY name bytes`. simrd computes
  a constant at no cost and pins it: never evicted.
- `call` -> `CALL` (RESULT: the output ids, NAME: the call's name, ARGS:
  its input ids, TIME: `cost_ns`), then for each output, in order,
  `MEMORY id bytes` and `ALIAS id k`, where k is -1 for an output with
  bytes of its own and, for a view (`alias_of`), the position of the
  viewed tensor among the call's inputs. A view of a tensor that is not
  an input of its call has it appended to ARGS (so simrd's graph gains
  that edge; none of the shipped traces has one).
- `use` -> a call `use` of no cost reading the ids, with one output of no
  bytes, released at once: simrd has no access outside an operator, and
  this one stamps the ids' last access and brings them back if evicted,
  as remat's acquire does.
- `release` -> `RELEASE id`.
- `phase` named `backward` -> `ANNOTATE BACKWARD` (simrd only labels ops
  with it); other phases are dropped.
- `evict` and `prefetch` (a plan made ahead) have no counterpart and are
  dropped; the number dropped is printed on stderr.
- At the end, every tensor the trace left live (not a constant) is
  released, unless --keep-live: simrd rematerializes and pins whatever
  is still referenced when the log ends, remat's replay does not.

What does not carry over, and how each simulator then differs:

- Views. simrd makes an alias a tensor of the viewed storage, with the
  view's call as its producer; remat's views are runtime views of the
  root's storage. Both count the bytes once and evict a storage with all
  its views; simrd also recomputes an alias's call (cost included) when
  the alias is needed again.
- Multi-output calls. simrd counts every output against the budget while
  the call (re)runs, resident ones too, and frees the duplicates after;
  remat regenerates only the lost outputs. Both charge the call's cost
  once per run.
- Outputs of no bytes. simrd makes each a storage of size 0: LRU may
  evict one (freeing nothing), and a call reading it then recomputes it.
- Costs. TIME is the trace's `cost_ns` as is; simrd's clock advances by
  it, as remat's virtual clock does (with swapping off).
- Constants and parameters. simrd pins constants; its eager runtime (the
  one the paper's figures use) never frees a pinned storage, so a
  released constant stays resident there, while remat frees it.
- Budget and ordering details (ties, staleness at the instant of an
  access, the evicted neighbourhood) belong to the runtimes, not to the
  log: scripts/dtr_fidelity.py and bench/results/dtr_fidelity_*.md.
"""
import argparse
import io
import json
import os
import sys

# The package's op-trace reader (python/remat/op_trace.py), from the checkout.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from remat import op_trace  # noqa: E402


def convert(lines, keep_live=False):
    """Yields simrd log lines (str, no newline) for remat trace lines."""
    stats = {"dropped": 0}

    def emit(**fields):
        return json.dumps(fields, separators=(",", ":"))

    yield emit(INSTRUCTION="ANNOTATE", ANNOTATION="START")
    constants = set()
    live = {}  # id -> None, in order of definition
    uses = 0
    if not hasattr(lines, "readline"):
        lines = io.StringIO("".join(line if line.endswith("\n") else line + "\n"
                                    for line in lines))
    for _, _, op, rec in op_trace.records(lines):
        if op == "constant":
            constants.add(rec["id"])
            live[rec["id"]] = None
            yield emit(INSTRUCTION="CONSTANT", NAME=rec["id"])
            yield emit(INSTRUCTION="MEMORY", NAME=rec["id"],
                       MEMORY=str(int(rec["bytes"])))
        elif op == "call":
            args = list(rec["inputs"])
            outputs = rec["outputs"]
            pairs = []
            for out in outputs:
                alias = -1
                if "alias_of" in out:
                    if out["alias_of"] not in args:
                        args.append(out["alias_of"])
                    alias = args.index(out["alias_of"])
                size = 0 if alias != -1 else int(out.get("bytes", 0))
                pairs.append(emit(INSTRUCTION="MEMORY", NAME=out["id"],
                                  MEMORY=str(size)))
                pairs.append(emit(INSTRUCTION="ALIAS", NAME=out["id"],
                                  ALIAS=str(alias)))
            yield emit(INSTRUCTION="CALL",
                       RESULT=[o["id"] for o in outputs],
                       NAME=rec["name"], ARGS=args,
                       TIME=str(int(rec["cost_ns"])))
            yield from pairs
            for out in outputs:
                live[out["id"]] = None
        elif op == "use":
            uses += 1
            name = "__use%d" % uses
            while name in live:
                name += "_"
            yield emit(INSTRUCTION="CALL", RESULT=[name], NAME="use",
                       ARGS=list(rec["ids"]), TIME="0")
            yield emit(INSTRUCTION="MEMORY", NAME=name, MEMORY="0")
            yield emit(INSTRUCTION="ALIAS", NAME=name, ALIAS="-1")
            yield emit(INSTRUCTION="RELEASE", NAME=name)
        elif op == "release":
            live.pop(rec["id"], None)
            yield emit(INSTRUCTION="RELEASE", NAME=rec["id"])
        elif op == "phase":
            if rec["name"] == "backward":
                yield emit(INSTRUCTION="ANNOTATE", ANNOTATION="BACKWARD")
        elif op in ("evict", "prefetch"):
            stats["dropped"] += 1
    if not keep_live:
        for name in live:
            if name not in constants:
                yield emit(INSTRUCTION="RELEASE", NAME=name)
    if stats["dropped"]:
        print("dtr_log: %d evict/prefetch records dropped"
              % stats["dropped"], file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="remat op trace (JSON Lines)")
    parser.add_argument("-o", "--output", help="simrd log (default: stdout)")
    parser.add_argument("--keep-live", action="store_true",
                        help="leave the tensors live at the end referenced "
                             "(simrd then rematerializes and pins them)")
    args = parser.parse_args()
    if args.output and os.path.exists(args.output):
        parser.error(f"{args.output} exists; nothing is overwritten")
    with open(args.trace) as f:
        out_lines = list(convert(f, keep_live=args.keep_live))
    text = "\n".join(out_lines) + "\n"
    if args.output:
        with open(args.output, "x") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
