#!/usr/bin/env bash
# Records two PyTorch training steps as op traces for `remat sim` / `remat sweep`,
# on the CPU, with fixed seeds and model costs (tools/capture_torch_trace.py
# --cost model: FLOPs and bytes at 400 TFLOP/s, 3000 GB/s, a 1 us floor), so
# rerunning it writes the same files byte for byte:
#
#   densenet121_b8.jsonl        torchvision's DenseNet-121, batch 8, 3x224x224,
#                               cross entropy against random labels
#   lstm_l2_h512_s128_b32_v256.jsonl
#                               a byte-level LSTM language model (embedding, 2
#                               layers of nn.LSTMCell with 512 units unrolled
#                               over 128 steps, linear head over 256 tokens),
#                               batch 32
#
# and three small ones, a few dozen to a few hundred calls, for remat.optimal's
# bounds (python -m remat.optimal builds its program for steps of that size):
#
#   mlp_small_l4_h256_t512.jsonl   the MLP of capture_torch_trace.py: 4 blocks of
#                                  Linear(256, 1024)-GELU-Linear(1024, 256), 512 rows
#   lstm_tiny_h64_s8_b8_v64.jsonl  the LSTM below at 1 layer, 64 units, 8 steps,
#                                  batch 8, 64 tokens
#   gpt_tiny_l1_d32_s16_b2_v64.jsonl
#                                  remat.torch.testing.models.gpt: one decoder layer
#                                  with dropout (0.1), width 32, 16 tokens,
#                                  batch 2, 64-token vocabulary
#
# and a step of thousands of small tensors, for the allocator's small pool:
#
#   tree_lstm_h128_l128_b96_v64.jsonl
#                                  remat.torch.testing.models.tree_lstm: a binary
#                                  Tree-LSTM over trees of 128 leaves (255
#                                  nodes) evaluated node by node, hidden 128,
#                                  batch 96, 64 words and classes: every
#                                  tensor at most 640 KiB, a 92 MiB peak
#
# The LSTM's vocabulary is small on purpose: the log-softmax backward holds
# three tensors of seq x batch x vocab floats at once, which with 10000 tokens
# come, with the parameters, to 67% of the step's peak (304 of 453 MB at seq
# 64), so every policy runs out of memory under a live budget below 0.68 of
# it; with 256 tokens (seq 128) they come to 18%.
#
#   ./scripts/record_torch_steps.sh [OUT_DIR]     (default: out/torch_steps/)
#
# Needs torch and torchvision: runs $PYTHON if set, else .venv/bin/python if the
# repository has one, else python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/out/torch_steps}
python=${PYTHON:-}
if [[ -z $python ]]; then
  python=python3
  if [[ -x $root/.venv/bin/python ]]; then
    python=$root/.venv/bin/python
  fi
fi
capture=("$python" "$root/tools/capture_torch_trace.py" --device cpu --dtype fp32
         --cost model --seed 0)
mkdir -p "$out"

"${capture[@]}" --model densenet121 --batch 8 --image 224 \
  -o "$out/densenet121_b8.jsonl"
"${capture[@]}" --model lstm --layers 2 --hidden 512 --seq 128 --batch 32 --vocab 256 \
  -o "$out/lstm_l2_h512_s128_b32_v256.jsonl"
"${capture[@]}" --model mlp --layers 4 --hidden 256 --batch 8 --seq 64 \
  -o "$out/mlp_small_l4_h256_t512.jsonl"
"${capture[@]}" --model lstm --layers 1 --hidden 64 --seq 8 --batch 8 --vocab 64 \
  -o "$out/lstm_tiny_h64_s8_b8_v64.jsonl"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$python" - \
  "$out/gpt_tiny_l1_d32_s16_b2_v64.jsonl" <<'EOF'
import sys

import remat.torch
from remat.torch.testing import models

_, step = models.gpt(0, batch=2, seq=16, layers=1, d=32, vocab=64)
n = remat.torch.record(lambda: step().backward(), sys.argv[1], overwrite=True)
print(f"wrote {n} records to {sys.argv[1]}")
EOF
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$python" - \
  "$out/tree_lstm_h128_l128_b96_v64.jsonl" <<'EOF'
import sys

import remat.torch
from remat.torch.testing import models

_, step = models.tree_lstm(0, hidden=128, leaves=128, batch=96, vocab=64)
n = remat.torch.record(lambda: step().backward(), sys.argv[1], overwrite=True)
print(f"wrote {n} records to {sys.argv[1]}")
EOF
