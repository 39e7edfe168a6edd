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
