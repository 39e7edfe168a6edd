#!/usr/bin/env python3
"""Generates the example op traces in examples/traces/ (JSON Lines, trace/op_trace.h).

    python3 scripts/make_op_traces.py [--out examples/traces]

chain_100.jsonl          a homogeneous chain of 100 layers, forward and backward
transformer_small.jsonl  one GPT-2 style training step (fp16), forward and backward

Costs come from a roofline: max(FLOPs / 100 TFLOP/s, bytes read and written /
2 TB/s, a 1 us launch floor); views cost nothing. Everything is deterministic,
so rerunning the script reproduces the shipped files byte for byte. It also
prints each trace's peak live bytes, worked out here independently of the C++
parser (trace/op_trace_test.cc checks that both agree).

Standard library only.
"""

import argparse
import json
import math
import os

KIB = 1 << 10
MIB = 1 << 20

FLOPS_PER_S = 100e12  # matmuls
BYTES_PER_S = 2e12  # memory-bound ops
LAUNCH_NS = 1000


def roofline_ns(flops=0, moved=0):
    return max(
        LAUNCH_NS,
        math.ceil(flops / FLOPS_PER_S * 1e9),
        math.ceil(moved / BYTES_PER_S * 1e9),
    )


class Trace:
    """Writes records and replays them as the parser does, for the peak."""

    def __init__(self):
        self.lines = []
        self.bytes = {}  # id -> bytes of its storage (views: their root's)
        self.storage = {}  # id -> root id
        self.refs = {}  # root id -> live tensors sharing it
        self.live_bytes = 0
        self.peak = 0
        self.records = 0

    def _emit(self, record):
        self.lines.append(json.dumps(record, separators=(",", ":")))
        self.records += 1
        self.peak = max(self.peak, self.live_bytes)

    def _define(self, tid, nbytes=None, alias_of=None):
        assert tid not in self.storage, tid
        if alias_of is None:
            self.storage[tid] = tid
            self.refs[tid] = 1
            self.bytes[tid] = nbytes
            self.live_bytes += nbytes
        else:
            root = self.storage[alias_of]
            assert self.refs[root] > 0, alias_of
            self.storage[tid] = root
            self.refs[root] += 1
            self.bytes[tid] = self.bytes[root]

    def constant(self, tid, nbytes):
        self._define(tid, nbytes)
        self._emit({"op": "constant", "id": tid, "bytes": nbytes})

    def call(self, name, inputs, outputs, cost_ns):
        """outputs: [(id, bytes)] or [(id, None, alias_of)]."""
        out = []
        for o in outputs:
            if len(o) == 3:
                self._define(o[0], alias_of=o[2])
                out.append({"id": o[0], "alias_of": o[2]})
            else:
                self._define(o[0], o[1])
                out.append({"id": o[0], "bytes": o[1]})
        self._emit(
            {"op": "call", "name": name, "inputs": list(inputs), "outputs": out, "cost_ns": cost_ns}
        )

    def view(self, name, src, tid):
        self.call(name, [src], [(tid, None, src)], 0)

    def use(self, ids):
        self._emit({"op": "use", "ids": list(ids)})

    def release(self, *ids):
        for tid in ids:
            root = self.storage[tid]
            self.refs[root] -= 1
            if self.refs[root] == 0:
                self.live_bytes -= self.bytes[root]
            self._emit({"op": "release", "id": tid})

    def phase(self, name):
        self._emit({"op": "phase", "name": name})

    def write(self, path):
        with open(path, "w", newline="\n") as f:
            f.write("\n".join(self.lines) + "\n")


# --- chain_100 -------------------------------------------------------------


def make_chain(n=100, act_bytes=4 * MIB, weight_bytes=1 * MIB, fwd_ns=50_000, bwd_ns=100_000):
    """x_i = f(w_i, x_{i-1}); backward g_{i-1}, dw_i = df(g_i, w_i, x_{i-1})."""
    t = Trace()
    t.constant("x0", act_bytes)
    for i in range(1, n + 1):
        t.constant(f"w{i}", weight_bytes)
    t.phase("forward")
    for i in range(1, n + 1):
        t.call("f", [f"w{i}", f"x{i - 1}"], [(f"x{i}", act_bytes)], fwd_ns)
    t.call("loss", [f"x{n}"], [("loss", 4)], 5_000)
    t.use(["loss"])
    t.phase("backward")
    t.call("loss_backward", ["loss", f"x{n}"], [(f"g{n}", act_bytes)], 5_000)
    t.release("loss", f"x{n}")
    for i in range(n, 0, -1):
        t.call(
            "f_backward",
            [f"g{i}", f"w{i}", f"x{i - 1}"],
            [(f"g{i - 1}", act_bytes), (f"dw{i}", weight_bytes)],
            bwd_ns,
        )
        t.release(f"g{i}", f"x{i - 1}")  # x0, a constant, goes too
    t.release("g0")
    t.phase("optimizer")
    t.use([f"dw{i}" for i in range(1, n + 1)])
    t.release(*[f"dw{i}" for i in range(1, n + 1)])
    return t


# --- transformer_small -------------------------------------------------------

LAYERS = 4
HIDDEN = 512
HEADS = 8
HEAD_DIM = HIDDEN // HEADS
SEQ = 512
BATCH = 4  # per micro-batch
MICRO_BATCHES = 4
VOCAB = 8192
FP16 = 2
FP32 = 4
INT64 = 8


def make_transformer():
    t = Trace()
    B, S, H, NH, HD, V = BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM, VOCAB
    BS = B * S
    act = BS * H * FP16  # one [B, S, H] activation
    att = B * NH * S * S * FP16  # one [B, heads, S, S] attention matrix
    stats = BS * 2 * FP32  # layer norm mean and rstd

    # Parameters, fp16. The output head is tied to the token embedding.
    params = {"wte": V * H, "wpe": S * H}
    for l in range(LAYERS):
        p = f"L{l}."
        params.update(
            {
                p + "ln1.w": H,
                p + "ln1.b": H,
                p + "attn.w_qkv": H * 3 * H,
                p + "attn.b_qkv": 3 * H,
                p + "attn.w_o": H * H,
                p + "attn.b_o": H,
                p + "ln2.w": H,
                p + "ln2.b": H,
                p + "mlp.w_fc": H * 4 * H,
                p + "mlp.b_fc": 4 * H,
                p + "mlp.w_proj": 4 * H * H,
                p + "mlp.b_proj": H,
            }
        )
    params.update({"lnf.w": H, "lnf.b": H})
    for name, elems in params.items():
        t.constant(name, elems * FP16)
    t.constant("causal_mask", S * S)  # bool

    grads = {}  # param -> id of its accumulated gradient

    def grad(param, tid, nbytes, mb):
        """Accumulates `tid`, the micro-batch's gradient of `param` (grad += in place)."""
        if param not in grads:
            grads[param] = tid
            return
        new = f"{param}.grad.{mb}"
        t.call("add_", [grads[param], tid], [(new, nbytes)], roofline_ns(moved=3 * nbytes))
        t.release(grads[param], tid)
        grads[param] = new

    def mm(m, n, k, extra_moved=0):
        return roofline_ns(flops=2 * m * n * k, moved=(m * k + k * n + m * n) * FP16 + extra_moved)

    def ew(moved):  # elementwise, memory-bound
        return roofline_ns(moved=moved)

    for mb in range(MICRO_BATCHES):
        m = f"mb{mb}."
        t.constant(m + "tokens", BS * INT64)
        t.constant(m + "targets", BS * INT64)
        t.phase("forward")
        t.call("arange", [], [(m + "pos", S * INT64)], ew(S * INT64))
        t.call("embedding", ["wte", m + "tokens"], [(m + "tok_emb", act)], ew(2 * act))
        t.call("embedding", ["wpe", m + "pos"], [(m + "pos_emb", S * H * FP16)],
               ew(2 * S * H * FP16))
        t.call("add", [m + "tok_emb", m + "pos_emb"], [(m + "x0", act)], ew(3 * act))
        t.release(m + "tok_emb", m + "pos_emb")

        for l in range(LAYERS):
            p, a = f"L{l}.", f"{m}L{l}."
            x = f"{m}x{l}"
            t.call("layer_norm", [x, p + "ln1.w", p + "ln1.b"],
                   [(a + "ln1", act), (a + "ln1_stats", stats)], ew(2 * act + stats))
            t.call("addmm", [a + "ln1", p + "attn.w_qkv", p + "attn.b_qkv"],
                   [(a + "qkv", 3 * act)], mm(BS, 3 * H, H))
            t.call("split", [a + "qkv"],
                   [(a + c, None, a + "qkv") for c in ("q", "k", "v")], 0)
            for c in ("q", "k", "v"):
                t.view("view", a + c, a + c + "4")  # [B, S, heads, head_dim]
                t.view("transpose", a + c + "4", a + c + "h")  # [B, heads, S, head_dim]
                t.release(a + c, a + c + "4")
            t.view("transpose", a + "kh", a + "kT")
            # Only the views autograd saves (qh, kT, vh) keep qkv's storage now.
            t.release(a + "kh", a + "qkv")
            t.call("bmm", [a + "qh", a + "kT"], [(a + "scores", att)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            t.call("mul", [a + "scores"], [(a + "scaled", att)], ew(2 * att))
            t.release(a + "scores")
            t.call("masked_fill", [a + "scaled", "causal_mask"], [(a + "masked", att)],
                   ew(2 * att + S * S))
            t.release(a + "scaled")
            t.call("softmax", [a + "masked"], [(a + "probs", att)], ew(2 * att))
            t.release(a + "masked")
            t.call("bmm", [a + "probs", a + "vh"], [(a + "attn", act)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            t.view("transpose", a + "attn", a + "attn_t")
            t.call("contiguous", [a + "attn_t"], [(a + "attn_c", act)], ew(2 * act))
            t.release(a + "attn", a + "attn_t")
            t.view("view", a + "attn_c", a + "attn_m")  # [B, S, H]
            t.release(a + "attn_c")
            t.call("addmm", [a + "attn_m", p + "attn.w_o", p + "attn.b_o"],
                   [(a + "attn_out", act)], mm(BS, H, H))
            t.call("add", [x, a + "attn_out"], [(a + "x_mid", act)], ew(3 * act))
            t.release(a + "attn_out")
            t.call("layer_norm", [a + "x_mid", p + "ln2.w", p + "ln2.b"],
                   [(a + "ln2", act), (a + "ln2_stats", stats)], ew(2 * act + stats))
            t.call("addmm", [a + "ln2", p + "mlp.w_fc", p + "mlp.b_fc"],
                   [(a + "h", 4 * act)], mm(BS, 4 * H, H))
            t.call("gelu", [a + "h"], [(a + "gelu", 4 * act)], ew(8 * act))
            t.call("addmm", [a + "gelu", p + "mlp.w_proj", p + "mlp.b_proj"],
                   [(a + "mlp_out", act)], mm(BS, H, 4 * H))
            t.call("add", [a + "x_mid", a + "mlp_out"], [(f"{m}x{l + 1}", act)], ew(3 * act))
            t.release(a + "mlp_out")

        xl = f"{m}x{LAYERS}"
        logits = BS * V * FP16
        t.call("layer_norm", [xl, "lnf.w", "lnf.b"],
               [(m + "xf", act), (m + "lnf_stats", stats)], ew(2 * act + stats))
        t.view("t", "wte", m + "wteT")  # a view of a constant
        t.call("mm", [m + "xf", m + "wteT"], [(m + "logits", logits)], mm(BS, V, H))
        t.call("log_softmax", [m + "logits"], [(m + "logp", logits)], ew(2 * logits))
        t.release(m + "logits")
        t.call("nll_loss", [m + "logp", m + "targets"], [(m + "loss", FP32)], ew(logits // V))
        t.use([m + "loss"])

        t.phase("backward")
        t.call("ones_like", [m + "loss"], [(m + "dloss", FP32)], ew(FP32))
        t.call("nll_loss_backward", [m + "dloss", m + "targets"], [(m + "dlogp", logits)],
               ew(logits))
        t.release(m + "dloss", m + "loss", m + "targets")
        t.call("log_softmax_backward", [m + "dlogp", m + "logp"], [(m + "dlogits", logits)],
               ew(3 * logits))
        t.release(m + "dlogp", m + "logp")
        t.call("mm", [m + "dlogits", "wte"], [(m + "dxf", act)], mm(BS, H, V))
        t.view("t", m + "dlogits", m + "dlogitsT")
        t.call("mm", [m + "dlogitsT", m + "xf"], [(m + "dwte_head", V * H * FP16)],
               mm(V, H, BS))
        t.release(m + "dlogitsT", m + "dlogits", m + "xf", m + "wteT")
        t.call("layer_norm_backward", [m + "dxf", xl, m + "lnf_stats", "lnf.w", "lnf.b"],
               [(m + "dx", act), (m + "dlnf.w", H * FP16), (m + "dlnf.b", H * FP16)],
               ew(3 * act + stats))
        t.release(m + "dxf", xl, m + "lnf_stats")
        grad("lnf.w", m + "dlnf.w", H * FP16, mb)
        grad("lnf.b", m + "dlnf.b", H * FP16, mb)

        dx = m + "dx"
        for l in reversed(range(LAYERS)):
            p, a = f"L{l}.", f"{m}L{l}."
            x = f"{m}x{l}"
            # x_{l+1} = x_mid + mlp_out: dx flows to both unchanged.
            t.call("mm", [dx, p + "mlp.w_proj"], [(a + "dgelu", 4 * act)], mm(BS, 4 * H, H))
            t.call("mm", [a + "gelu", dx], [(a + "dw_proj", 4 * H * H * FP16)], mm(4 * H, H, BS))
            t.call("sum", [dx], [(a + "db_proj", H * FP16)], ew(act))
            t.release(a + "gelu")
            t.call("gelu_backward", [a + "dgelu", a + "h"], [(a + "dh", 4 * act)], ew(12 * act))
            t.release(a + "dgelu", a + "h")
            t.call("mm", [a + "dh", p + "mlp.w_fc"], [(a + "dln2", act)], mm(BS, H, 4 * H))
            t.call("mm", [a + "ln2", a + "dh"], [(a + "dw_fc", H * 4 * H * FP16)],
                   mm(H, 4 * H, BS))
            t.call("sum", [a + "dh"], [(a + "db_fc", 4 * H * FP16)], ew(4 * act))
            t.release(a + "dh", a + "ln2")
            t.call("layer_norm_backward",
                   [a + "dln2", a + "x_mid", a + "ln2_stats", p + "ln2.w", p + "ln2.b"],
                   [(a + "dx_mid_ln", act), (a + "dln2.w", H * FP16), (a + "dln2.b", H * FP16)],
                   ew(3 * act + stats))
            t.release(a + "dln2", a + "x_mid", a + "ln2_stats")
            t.call("add", [dx, a + "dx_mid_ln"], [(a + "dx_mid", act)], ew(3 * act))
            t.release(dx, a + "dx_mid_ln")
            t.call("mm", [a + "dx_mid", p + "attn.w_o"], [(a + "dattn_m", act)], mm(BS, H, H))
            t.call("mm", [a + "attn_m", a + "dx_mid"], [(a + "dw_o", H * H * FP16)],
                   mm(H, H, BS))
            t.call("sum", [a + "dx_mid"], [(a + "db_o", H * FP16)], ew(act))
            t.release(a + "attn_m")
            t.view("view", a + "dattn_m", a + "dattn4")
            t.view("transpose", a + "dattn4", a + "dattn_h")
            t.release(a + "dattn4")
            t.call("bmm", [a + "dattn_h", a + "vh"], [(a + "dprobs", att)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            t.call("bmm", [a + "probs", a + "dattn_h"], [(a + "dvh", act)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            t.release(a + "dattn_h", a + "dattn_m", a + "vh")
            t.call("softmax_backward", [a + "dprobs", a + "probs"], [(a + "dmasked", att)],
                   ew(3 * att))
            t.release(a + "dprobs", a + "probs")
            t.call("masked_fill", [a + "dmasked", "causal_mask"], [(a + "dscaled", att)],
                   ew(2 * att + S * S))
            t.release(a + "dmasked")
            t.call("mul", [a + "dscaled"], [(a + "dscores", att)], ew(2 * att))
            t.release(a + "dscaled")
            t.call("bmm", [a + "dscores", a + "kT"], [(a + "dqh", act)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            t.call("bmm", [a + "qh", a + "dscores"], [(a + "dkT", act)],
                   roofline_ns(flops=2 * B * NH * S * S * HD, moved=2 * act + att))
            # The last views of qkv go, and with them its storage.
            t.release(a + "dscores", a + "qh", a + "kT")
            t.call("cat", [a + "dqh", a + "dkT", a + "dvh"], [(a + "dqkv", 3 * act)],
                   ew(6 * act))
            t.release(a + "dqh", a + "dkT", a + "dvh")
            t.call("mm", [a + "dqkv", p + "attn.w_qkv"], [(a + "dln1", act)], mm(BS, H, 3 * H))
            t.call("mm", [a + "ln1", a + "dqkv"], [(a + "dw_qkv", H * 3 * H * FP16)],
                   mm(H, 3 * H, BS))
            t.call("sum", [a + "dqkv"], [(a + "db_qkv", 3 * H * FP16)], ew(3 * act))
            t.release(a + "dqkv", a + "ln1")
            t.call("layer_norm_backward",
                   [a + "dln1", x, a + "ln1_stats", p + "ln1.w", p + "ln1.b"],
                   [(a + "dx_ln", act), (a + "dln1.w", H * FP16), (a + "dln1.b", H * FP16)],
                   ew(3 * act + stats))
            t.release(a + "dln1", x, a + "ln1_stats")
            t.call("add", [a + "dx_mid", a + "dx_ln"], [(a + "dx", act)], ew(3 * act))
            t.release(a + "dx_mid", a + "dx_ln")
            dx = a + "dx"
            for param, tid, nbytes in (
                (p + "mlp.w_proj", a + "dw_proj", 4 * H * H * FP16),
                (p + "mlp.b_proj", a + "db_proj", H * FP16),
                (p + "mlp.w_fc", a + "dw_fc", H * 4 * H * FP16),
                (p + "mlp.b_fc", a + "db_fc", 4 * H * FP16),
                (p + "ln2.w", a + "dln2.w", H * FP16),
                (p + "ln2.b", a + "dln2.b", H * FP16),
                (p + "attn.w_o", a + "dw_o", H * H * FP16),
                (p + "attn.b_o", a + "db_o", H * FP16),
                (p + "attn.w_qkv", a + "dw_qkv", H * 3 * H * FP16),
                (p + "attn.b_qkv", a + "db_qkv", 3 * H * FP16),
                (p + "ln1.w", a + "dln1.w", H * FP16),
                (p + "ln1.b", a + "dln1.b", H * FP16),
            ):
                grad(param, tid, nbytes, mb)

        t.call("embedding_backward", [dx, m + "tokens"], [(m + "dwte_emb", V * H * FP16)],
               ew(act + V * H * FP16))
        t.call("embedding_backward", [dx, m + "pos"], [(m + "dwpe", S * H * FP16)],
               ew(act + S * H * FP16))
        t.release(dx, m + "tokens", m + "pos")
        t.call("add", [m + "dwte_head", m + "dwte_emb"], [(m + "dwte", V * H * FP16)],
               ew(3 * V * H * FP16))
        t.release(m + "dwte_head", m + "dwte_emb")
        grad("wte", m + "dwte", V * H * FP16, mb)
        grad("wpe", m + "dwpe", S * H * FP16, mb)

    # The optimizer reads every gradient, then zero_grad(set_to_none=True).
    t.phase("optimizer")
    t.use(sorted(grads.values()))
    t.release(*sorted(grads.values()))
    return t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=os.path.join(root, "examples", "traces"))
    args = parser.parse_args()
    for name, trace in (
        ("chain_100.jsonl", make_chain()),
        ("transformer_small.jsonl", make_transformer()),
    ):
        path = os.path.join(args.out, name)
        trace.write(path)
        print(
            f"{path}: {trace.records} records, peak live {trace.peak} bytes "
            f"({trace.peak / MIB:.2f} MiB), live at end {trace.live_bytes} bytes"
        )


if __name__ == "__main__":
    main()
