#!/usr/bin/env python3
"""Activation memory of a real PyTorch GPT-2 training step, to set beside
`remat gen gpt2:...`'s unlimited peak (needs torch, transformers and a GPU).

Builds Hugging Face's GPT2LMHeadModel from a config (no weights are fetched),
casts it to bf16, and runs one forward and backward at the given batch and
sequence length with dropout 0. Prints one JSON line per attention kind:
  params_bytes           the model's parameters
  saved_bytes            what the forward leaves allocated beyond the
                         parameters: activations saved for backward + logits + loss
  peak_bytes             the allocator's peak over forward and backward,
                         less the parameters
Usage: torch_gpt2_memory.py [--layers 12 --hidden 768 --heads 12 --seq 1024 --batch 8]
"""
import argparse
import json

import torch


def measure(args, attn):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                     n_positions=args.seq, vocab_size=args.vocab, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = attn
    model = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    loss = model(input_ids=ids, labels=ids).loss
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - base
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    out = {"attn": attn, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
           "seq": args.seq, "batch": args.batch, "vocab": args.vocab, "dtype": "bf16",
           "params_bytes": params, "saved_bytes": saved, "peak_bytes": peak,
           "loss": float(loss)}
    del model, loss, ids
    torch.cuda.empty_cache()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50257)
    args = parser.parse_args()
    for attn in ("eager", "sdpa"):
        try:
            print(json.dumps(measure(args, attn)), flush=True)
        except Exception as e:  # one kind failing should not hide the other
            print(json.dumps({"attn": attn, "error": repr(e)}), flush=True)


if __name__ == "__main__":
    main()
