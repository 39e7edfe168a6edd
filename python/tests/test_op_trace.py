"""remat.op_trace: the package's one op-trace reader."""
import io

import pytest

from remat import op_trace


def _records(text, cap=None):
    return list(op_trace.records(io.StringIO(text), "t.jsonl", cap))


def test_records_in_order_with_their_lines_and_blank_lines_skipped():
    got = _records('{"op": "constant", "id": "x", "bytes": 4}\n\n'
                   '{"op": "use", "ids": ["x"]}\r\n')
    assert [(n, op) for n, _, op, _ in got] == [(1, "constant"), (3, "use")]
    assert got[1][1] == '{"op": "use", "ids": ["x"]}' and got[0][3]["bytes"] == 4


@pytest.mark.parametrize("line, why", [
    ("not json", "not an op record"), ("[1, 2]", "not an op record"),
    ('{"id": "x"}', "not an op record"), ('{"op": "launch"}', "unknown op 'launch'")])
def test_what_is_not_a_record_is_refused_by_its_line(line, why):
    with pytest.raises(ValueError, match=f"t.jsonl:2: {why}"):
        _records('{"op": "phase", "name": "forward"}\n' + line + "\n")


def test_a_line_past_the_cap_is_refused_without_reading_it_whole():
    with pytest.raises(ValueError, match="t.jsonl:1: the line is longer than 10"):
        _records('{"op": "phase", "name": "forward"}', cap=10)
