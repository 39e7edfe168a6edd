// Op traces of whole models, generated from their architecture: one training
// step (forward, backward, optimizer) of a chain, a ResNet, GPT-2, a ViT or a
// UNet, written in the op-trace format of trace/op_trace.h, so `remat sim` can
// replay models nobody recorded.
//
//   GenerateModelTrace("gpt2:layers=12,hidden=768,heads=12,seq=1024,batch=8")
//   GenerateModelTrace("resnet:depth=50,batch=64,image=224")
//
// A spec is `name:key=value,...`; every key has a default (ModelGenHelp()
// lists them). Unknown models and keys, malformed pairs, values that are not
// numbers or out of range, and shapes that do not fit (hidden not a multiple of
// heads, ...) are InvalidArgument naming the model, the key and the known ones.
// The code: model_gen.cc (specs, the writer, the graph and its emission),
// model_gen_ops.cc (the ops), model_gen_models.cc (the models, the entry
// points); model_gen_graph.h declares what they share.
//
// How a trace is made (every model but `chain`). The model's forward is built
// as a graph of PyTorch-level ops with shapes; each op knows which tensors
// autograd saves for its backward (matmul/conv: their inputs; relu: its output;
// gelu: its input; softmax: its output; batch/layer norm: input and fp32
// statistics; dropout: a 1-byte mask; max pool: input and int64 indices). Then:
// - Forward: each op is a call; a tensor is released right after its last
//   forward use unless some op saved it (as Python's reference counting and
//   autograd would free it). Views (reshape, transpose, split, select, expand)
//   are alias outputs and cost nothing.
// - Backward: the ops' backward calls run in reverse order from a ones_like
//   seed on the loss, as autograd's engine would: each computes the gradients
//   of the inputs that need them; gradients of a tensor used twice are summed
//   (`add`); after each op's backward its saved tensors and the gradients it
//   consumed are released. Inputs that need no gradient (images, tokens) get
//   none (a ResNet's first conv computes no input gradient).
// - Parameters and inputs are constants; parameter gradients live until the
//   `optimizer` phase, which reads and releases them (zero_grad to None).
//   Optimizer state and the bf16 copies autocast makes of fp32 weights are not
//   in the trace.
// In-place ops (ResNet's relu_, `out += identity`) are written as new versions
// whose old version is released at once, which is what in place saves.
//
// Every model but `chain` takes `steps` (default 1): the trace holds that many
// training steps in a row over the same constants, each step's tensors named
// apart (step k > 0 prefixes its ids with "s<k>/"), as a trace recorded over
// several iterations would be. Long traces for replay-speed measurements:
// gpt2:layers=12,steps=720 is just over a million records (1,016,072).
//
// Dtypes: activations and their gradients take `dtype` (bf16 default, 2 bytes;
// fp16 2, fp32 4); parameters and their gradients `param_dtype` (default: same
// as dtype; param_dtype=fp32 for fp32 master weights and gradients). Norm
// statistics, the loss and the cross entropy's log-sum-exp are fp32; token ids,
// labels and max-pool indices int64; dropout masks 1 byte.
//
// Costs: cost_ns = max(launch_ns, FLOPs / tflops, bytes moved / hbm_gbps),
// rounded up. FLOPs are counted for matmuls and convolutions only (2 per
// multiply-add: forward, input and weight gradients); every other op is
// memory-bound and costs the bytes it reads and writes (inputs' and outputs'
// logical sizes) over the bandwidth. The defaults describe an H100-class GPU
// as training sees it: 400 TFLOP/s effective on bf16 matmuls (about 40% of the
// H100 SXM's 989 dense peak: what good training runs reach), 3000 GB/s of HBM
// (about 90% of 3.35 TB/s), and a 1 us floor per kernel. The same rate is used
// for any dtype (pass a lower --tflops for fp32). Flash attention counts its
// FLOPs in full (a causal mask's skipped half is not deducted) and its backward
// as 2.5 forwards (it recomputes q k^T). Every model ends in the same fused
// cross entropy (saves the logits and an fp32 log-sum-exp a row).
//
// Models:
// - chain:n,bytes,weight_bytes,cost_ns: the homogeneous chain of
//   scripts/make_op_traces.py, byte for byte (`chain:n=100` is
//   examples/traces/chain_100.jsonl): x_i = f(w_i, x_{i-1}), a 4-byte loss,
//   then f_backward per layer (twice the forward cost); costs are given, not
//   derived.
// - resnet:depth,batch,image,classes: torchvision's ResNet v1.5 (18 and 34:
//   basic blocks; 50, 101, 152: bottlenecks with the stride on the 3x3), conv
//   without bias, batch norm, relu, max pool with indices, adaptive average
//   pool, fc, cross entropy. Parameter counts equal torchvision's. Saved per
//   conv-bn-relu: the conv's output (batch norm's input) and the relu's output;
//   a downsample branch saves its conv's output only. ResNet-50 at 224 saves
//   20,722,688 such elements per image, plus the max pool's output (200,704)
//   and int64 indices, the fc input and the logits: 43.46 MB per image in
//   bf16, 2.78 GB at batch 64, which the trace keeps at the end of its forward
//   to within 0.1%. Its peak is 1% higher, where layer 4's first gradients
//   exist beside all that. (At small batches the parameter gradients, made as
//   the backward runs, add to the peak: 2 bytes a parameter in bf16.)
// - gpt2:layers,hidden,heads,seq,batch,vocab,positions,dropout,attn: GPT-2
//   (Hugging Face's layout, pre-LN): token and position embeddings, per layer
//   layernorm, qkv linear, split into heads, scores = q k^T, a fused scale +
//   causal mask + softmax, [dropout], probs v, merge heads (a contiguous copy),
//   proj, [dropout], residual add, layernorm, fc 4h, gelu, proj, [dropout],
//   residual add; final layernorm, an lm head tied to the token embedding, and
//   a fused cross entropy (as in flash-attn's or Megatron's) that saves the
//   logits and the fp32 log-sum-exp and writes dlogits in `dtype`.
//   attn=flash replaces scores/softmax/probs v with one flash-attention call
//   saving q, k, v, the output and the fp32 log-sum-exp (no s^2 tensor).
//   Activation memory (Korthikanti et al. 2022, "Reducing Activation
//   Recomputation in Large Transformer Models", sec. 4.1, 16-bit, no
//   parallelism): per layer s*b*h*(34 + 5*a*s/h) bytes with dropout (the
//   masks: sbh twice and a*s^2*b; the dropped probabilities 2*a*s^2*b). With
//   dropout=0 (the default) the masks and the dropped probabilities are not
//   there: s*b*h*(32 + 2*a*s/h); with attn=flash, 32*s*b*h plus the 4*a*s*b
//   log-sum-exp. Outside the layers (sec. 4.3): the final layernorm's input
//   and the lm head's input, 4sbh, and 4sbv for the loss; here that is the
//   saved 2sbv logits and the 2sbv dlogits, both live when the backward starts,
//   which is where the peak is. With dropout the embedding's mask adds sbh.
//   What the trace keeps at the end of the forward is within 0.1% of these
//   sums less the 2sbv dlogits (layer norm statistics, 16 bytes a token a
//   layer, are most of the rest), and its peak within 0.1% of the constants
//   plus these sums, for GPT-2 small at s=256 and 1024. With a small
//   vocabulary the last layer's first gradients outgrow the dlogits and set
//   the peak instead, a few percent higher. FLOPs: 72*b*s*L*h^2 *
//   (1 + s/(6h)) + 6*b*s*h*V (Narayanan et al. 2021, without recomputation),
//   which is 6 * non-embedding params * tokens plus attention and lm head.
// - vit:layers,hidden,heads,patch,image,batch,classes,dropout,attn:
//   torchvision's ViT: a patch conv, a class token, position embeddings, the
//   same pre-LN encoder layers without a mask (s = (image/patch)^2 + 1), a
//   final layernorm over all tokens, the class token's row to a linear head,
//   cross entropy. Activations: L*s*b*h*(32 + 2*a*s/h) + 4sbh as above (the
//   head's logits are small); ViT-B/16 at batch 64 keeps them to within 0.1%
//   and peaks 1.4% higher, at the last layer's first gradients. Parameters and
//   FLOPs equal torchvision's (86.6 M, 17.56 G multiply-adds an image).
// - unet:levels,base,batch,image,channels,classes: the common PyTorch UNet
//   (milesial/Pytorch-UNet, bilinear=False): double conv (3x3 conv without
//   bias, batch norm, relu, twice) at `base` channels, `levels` times max pool
//   2 and a double conv doubling the channels, then per level a 2x2 transposed
//   conv halving them, a concatenation with the skip, a double conv; a 1x1 conv
//   to `classes` and a per-pixel cross entropy. 31,037,698 parameters at the
//   defaults. Saved: every conv and relu output, the max pools' outputs and
//   indices, each concatenation (the next conv's input), the logits; the peak
//   is about 9% above them, where the first full-resolution gradients exist.
#ifndef REMAT_GEN_MODEL_GEN_H_
#define REMAT_GEN_MODEL_GEN_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace remat {

struct ModelGenOptions {
  double tflops = 400;            // effective matmul/conv rate, TFLOP/s
  double hbm_gbps = 3000;         // effective memory bandwidth, GB/s
  std::int64_t launch_ns = 1000;  // the least any call that is not a view costs
};

struct GeneratedTrace {
  std::string spec;  // canonical: the model and every key, defaults filled in
  std::string text;  // the op trace, JSON Lines (ParseOpTrace reads it)
  std::uint64_t records = 0;
  std::uint64_t params = 0;  // parameter elements (0 for chain)
  double forward_flops = 0;  // matmul and conv FLOPs of the forward(s)
  double flops = 0;          // ... of the whole trace, forward and backward, all its steps
};

// The trace of one training step of the model `spec` names. InvalidArgument for
// a bad spec or bad options (rates must be positive, the floor not negative),
// and for models whose tensors would not fit in 2^50 bytes.
absl::StatusOr<GeneratedTrace> GenerateModelTrace(std::string_view spec,
                                                  const ModelGenOptions& options = {});

// The models with their keys, defaults and meanings, for --help.
std::string ModelGenHelp();

}  // namespace remat

#endif  // REMAT_GEN_MODEL_GEN_H_
