// The models (chain, resnet, gpt2, vit, unet), their spec keys, and the public
// entry points of gen/model_gen.h.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "gen/model_gen.h"
#include "gen/model_gen_graph.h"

namespace remat {
namespace model_gen {
namespace {

constexpr int kInt64 = 8;

const std::vector<KeyDef> kDtypeKeys = {
    {"dtype", "bf16", "activations and their gradients: bf16, fp16 (2 bytes) or fp32"},
    {"param_dtype", "dtype",
     "parameters and their gradients: bf16, fp16, fp32, or dtype (the same)"},
};

constexpr std::int64_t kMaxSteps = 100'000;

// The keys of every graph model: the dtypes, and how many steps the trace holds.
std::vector<KeyDef> WithDtypes(std::vector<KeyDef> keys) {
  keys.insert(keys.end(), kDtypeKeys.begin(), kDtypeKeys.end());
  keys.push_back({"steps", "1",
                  "training steps in a row, sharing the constants (step k > 0 names its "
                  "tensors s<k>/...)"});
  return keys;
}

// The graph's trace, with its summary.
absl::StatusOr<GeneratedTrace> Finish(Graph& g, int loss, Spec& spec) {
  const std::int64_t steps = spec.Int("steps", 1, kMaxSteps);
  if (!spec.error().ok()) return spec.error();
  absl::StatusOr<std::string> text = g.Finish(loss, static_cast<int>(steps));
  if (!text.ok()) return text.status();
  GeneratedTrace out;
  out.spec = spec.Canonical();
  out.text = *std::move(text);
  out.records = g.records();
  out.params = g.param_elements();
  out.forward_flops = g.forward_flops() * static_cast<double>(steps);
  out.flops = g.total_flops() * static_cast<double>(steps);
  return out;
}

// --- chain ------------------------------------------------------------------

const std::vector<KeyDef> kChainKeys = {
    {"n", "100", "layers"},
    {"bytes", "4MiB", "bytes of each activation and its gradient"},
    {"weight_bytes", "1MiB", "bytes of each layer's weight and its gradient"},
    {"cost_ns", "50000", "a layer's forward cost; its backward costs twice that"},
};

absl::StatusOr<GeneratedTrace> MakeChain(Spec& spec, const ModelGenOptions&) {
  const std::int64_t n = spec.Int("n", 1, 1'000'000);
  const std::uint64_t act = spec.Bytes("bytes", 0, kTiB);
  const std::uint64_t weight = spec.Bytes("weight_bytes", 0, kTiB);
  const std::int64_t fwd = spec.Int("cost_ns", 0, std::int64_t{1} << 40);
  if (!spec.error().ok()) return spec.error();
  const std::int64_t bwd = 2 * fwd;
  constexpr std::int64_t kLossNs = 5000;

  auto x = [](std::int64_t i) { return absl::StrCat("x", i); };
  auto w = [](std::int64_t i) { return absl::StrCat("w", i); };
  auto gr = [](std::int64_t i) { return absl::StrCat("g", i); };
  auto dw = [](std::int64_t i) { return absl::StrCat("dw", i); };
  Writer t;
  t.Constant("x0", act);
  for (std::int64_t i = 1; i <= n; ++i) t.Constant(w(i), weight);
  t.Phase("forward");
  for (std::int64_t i = 1; i <= n; ++i) {
    const std::string in_w = w(i), in_x = x(i - 1), out = x(i);
    t.Call("f", {in_w, in_x}, {{out, act, {}}}, fwd);
  }
  const std::string last = x(n);
  t.Call("loss", {last}, {{"loss", 4, {}}}, kLossNs);
  t.Use({"loss"});
  t.Phase("backward");
  const std::string g_last = gr(n);
  t.Call("loss_backward", {"loss", last}, {{g_last, act, {}}}, kLossNs);
  t.Release("loss");
  t.Release(last);
  for (std::int64_t i = n; i >= 1; --i) {
    const std::string gi = gr(i), wi = w(i), xi = x(i - 1), go = gr(i - 1), dwi = dw(i);
    t.Call("f_backward", {gi, wi, xi}, {{go, act, {}}, {dwi, weight, {}}}, bwd);
    t.Release(gi);
    t.Release(xi);  // x0, a constant, goes too
  }
  t.Release("g0");
  t.Phase("optimizer");
  std::vector<std::string> grads;
  grads.reserve(n);
  for (std::int64_t i = 1; i <= n; ++i) grads.push_back(dw(i));
  t.Use(std::vector<absl::string_view>(grads.begin(), grads.end()));
  for (const std::string& g : grads) t.Release(g);

  GeneratedTrace out;
  out.spec = spec.Canonical();
  absl::StatusOr<std::string> text = t.Take();
  if (!text.ok()) return text.status();
  out.text = *std::move(text);
  out.records = t.records();
  return out;
}

// --- resnet -----------------------------------------------------------------

const std::vector<KeyDef> kResnetKeys = WithDtypes({
    {"depth", "50", "18, 34 (basic blocks), 50, 101, 152 (bottlenecks)"},
    {"batch", "64", "images per step"},
    {"image", "224", "image height and width"},
    {"classes", "1000", "classes of the fc layer"},
});

absl::StatusOr<GeneratedTrace> MakeResnet(Spec& spec, const ModelGenOptions& options) {
  const std::int64_t depth = spec.Int("depth", 18, 152);
  const std::int64_t batch = spec.Int("batch", 1, 1 << 20);
  const std::int64_t image = spec.Int("image", 32, 1 << 16);
  const std::int64_t classes = spec.Int("classes", 1, 1 << 24);
  const int act = spec.Dtype("dtype");
  const int param = spec.Dtype("param_dtype", act);
  std::vector<int> blocks;
  bool bottleneck = depth >= 50;
  switch (depth) {
    case 18:
      blocks = {2, 2, 2, 2};
      break;
    case 34:
      blocks = {3, 4, 6, 3};
      break;
    case 50:
      blocks = {3, 4, 6, 3};
      break;
    case 101:
      blocks = {3, 4, 23, 3};
      break;
    case 152:
      blocks = {3, 8, 36, 3};
      break;
    default:
      spec.Fail(absl::StrFormat("depth=%d is not one of 18, 34, 50, 101, 152", depth));
  }
  if (!spec.error().ok()) return spec.error();

  Graph g(options, act, param);
  auto conv_bn = [&](const std::string& p, int x, std::int64_t in, std::int64_t out, int k,
                     int stride, const std::string& conv, const std::string& bn) {
    const int w = g.Param(absl::StrCat(p, conv, ".weight"), {out, in, k, k});
    const int c = g.Conv2d(absl::StrCat(p, conv), x, w, stride, k / 2);
    const int gamma = g.Param(absl::StrCat(p, bn, ".weight"), {out});
    const int beta = g.Param(absl::StrCat(p, bn, ".bias"), {out});
    return g.BatchNorm(absl::StrCat(p, bn), c, gamma, beta);
  };

  const int img = g.Input("image", {batch, 3, image, image}, act);
  const int labels = g.Input("labels", {batch}, kInt64);
  int x = conv_bn("", img, 3, 64, 7, 2, "conv1", "bn1");
  x = g.Relu("relu", x);
  x = g.MaxPool2d("maxpool", x, 3, 2, 1);
  std::int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t planes = std::int64_t{64} << stage;
    const std::int64_t out = bottleneck ? 4 * planes : planes;
    for (int j = 0; j < blocks[stage]; ++j) {
      const std::string p = absl::StrCat("layer", stage + 1, ".", j, ".");
      const int stride = stage > 0 && j == 0 ? 2 : 1;
      int c;
      if (bottleneck) {
        c = g.Relu(p + "relu1", conv_bn(p, x, in, planes, 1, 1, "conv1", "bn1"));
        c = g.Relu(p + "relu2", conv_bn(p, c, planes, planes, 3, stride, "conv2", "bn2"));
        c = conv_bn(p, c, planes, out, 1, 1, "conv3", "bn3");
      } else {
        c = g.Relu(p + "relu1", conv_bn(p, x, in, planes, 3, stride, "conv1", "bn1"));
        c = conv_bn(p, c, planes, planes, 3, 1, "conv2", "bn2");
      }
      int identity = x;
      if (stride != 1 || in != out) {
        identity = conv_bn(p, x, in, out, 1, stride, "downsample.0", "downsample.1");
      }
      x = g.Relu(p + "out", g.Add(p + "add", c, identity));
      in = out;
    }
  }
  x = g.GlobalAvgPool("avgpool", x);
  const int fc_w = g.Param("fc.weight", {classes, in});
  const int fc_b = g.Param("fc.bias", {classes});
  const int logits = g.Linear("fc", x, fc_w, fc_b);
  const int loss = g.CrossEntropy("loss", logits, labels, 1);
  return Finish(g, loss, spec);
}

// --- transformers (gpt2, vit) ---------------------------------------------

struct Transformer {
  std::int64_t layers, hidden, heads, seq, batch;
  bool dropout;
  bool flash;
};

// One pre-LN block (Hugging Face's GPT-2 and torchvision's ViT alike): x ->
// x + attn(ln1(x)) -> that + mlp(ln2(that)). `mask` >= 0: causal.
int Block(Graph& g, const Transformer& m, const std::string& p, int x, int mask) {
  const std::int64_t b = m.batch, s = m.seq, h = m.hidden, a = m.heads, d = h / a;
  const int ln1_w = g.Param(p + "ln_1.weight", {h});
  const int ln1_b = g.Param(p + "ln_1.bias", {h});
  const int qkv_w = g.Param(p + "attn.qkv.weight", {3 * h, h});
  const int qkv_b = g.Param(p + "attn.qkv.bias", {3 * h});
  const int proj_w = g.Param(p + "attn.proj.weight", {h, h});
  const int proj_b = g.Param(p + "attn.proj.bias", {h});
  const int ln2_w = g.Param(p + "ln_2.weight", {h});
  const int ln2_b = g.Param(p + "ln_2.bias", {h});
  const int fc_w = g.Param(p + "mlp.fc.weight", {4 * h, h});
  const int fc_b = g.Param(p + "mlp.fc.bias", {4 * h});
  const int fc2_w = g.Param(p + "mlp.proj.weight", {h, 4 * h});
  const int fc2_b = g.Param(p + "mlp.proj.bias", {h});

  const int ln1 = g.LayerNorm(p + "ln_1", x, ln1_w, ln1_b);
  const int qkv = g.Linear(p + "qkv", ln1, qkv_w, qkv_b);
  int ctx;
  if (m.flash) {
    // [b, s, 3, a, d] unbound into q, k, v views, as flash-attention takes them.
    const int qkv5 = g.Reshape(p + "qkv.heads", qkv, {b, s, 3, a, d});
    std::vector<int> parts = g.Split(p + "qkv.split", qkv5, 2, 3);
    int q = g.Reshape(p + "q", parts[0], {b, s, a, d});
    int k = g.Reshape(p + "k", parts[1], {b, s, a, d});
    int v = g.Reshape(p + "v", parts[2], {b, s, a, d});
    const int o = g.FlashAttention(p + "attn", q, k, v);
    ctx = g.Reshape(p + "attn.merged", o, {b, s, h});
  } else {
    std::vector<int> parts = g.Split(p + "qkv.split", qkv, 2, 3);
    int heads[3];
    const char* names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
      const int r = g.Reshape(absl::StrCat(p, names[i], ".view"), parts[i], {b, s, a, d});
      heads[i] = g.Transpose(absl::StrCat(p, names[i]), r, 1, 2);  // [b, a, s, d]
    }
    const int scores = g.Matmul(p + "scores", heads[0], heads[1], /*trans_b=*/true);
    int probs = g.Softmax(p + "probs", scores, mask);
    if (m.dropout) probs = g.Dropout(p + "probs.dropout", probs);
    const int o = g.Matmul(p + "attn", probs, heads[2], /*trans_b=*/false);  // [b, a, s, d]
    const int t = g.Transpose(p + "attn.t", o, 1, 2);
    const int c = g.Contiguous(p + "attn.contiguous", t);
    ctx = g.Reshape(p + "attn.merged", c, {b, s, h});
  }
  int out = g.Linear(p + "attn.proj", ctx, proj_w, proj_b);
  if (m.dropout) out = g.Dropout(p + "attn.proj.dropout", out);
  const int mid = g.Add(p + "mid", x, out);
  const int ln2 = g.LayerNorm(p + "ln_2", mid, ln2_w, ln2_b);
  const int fc = g.Linear(p + "mlp.fc", ln2, fc_w, fc_b);
  const int act = g.Gelu(p + "mlp.gelu", fc);
  int mlp = g.Linear(p + "mlp.proj", act, fc2_w, fc2_b);
  if (m.dropout) mlp = g.Dropout(p + "mlp.dropout", mlp);
  return g.Add(p + "out", mid, mlp);
}

const std::vector<KeyDef> kGpt2Keys = WithDtypes({
    {"layers", "12", "transformer layers"},
    {"hidden", "768", "hidden size h"},
    {"heads", "12", "attention heads a (h divisible by a)"},
    {"seq", "1024", "sequence length s"},
    {"batch", "8", "sequences per step b"},
    {"vocab", "50257", "vocabulary size V (the lm head is tied to the token embedding)"},
    {"positions", "1024", "rows of the position embedding (seq at most this)"},
    {"dropout", "0", "1: dropout after the softmax, both projections and the embedding"},
    {"attn", "math", "math (scores, softmax, probs v) or flash (one fused call, no s^2 tensor)"},
});

absl::StatusOr<GeneratedTrace> MakeGpt2(Spec& spec, const ModelGenOptions& options) {
  Transformer m;
  m.layers = spec.Int("layers", 1, 4096);
  m.hidden = spec.Int("hidden", 1, 1 << 20);
  m.heads = spec.Int("heads", 1, 1 << 16);
  m.seq = spec.Int("seq", 1, 1 << 24);
  m.batch = spec.Int("batch", 1, 1 << 20);
  const std::int64_t vocab = spec.Int("vocab", 1, 1 << 26);
  const std::int64_t positions = spec.Int("positions", 1, 1 << 24);
  m.dropout = spec.Int("dropout", 0, 1) == 1;
  m.flash = spec.Choice("attn", {"math", "flash"}) == "flash";
  const int act = spec.Dtype("dtype");
  const int param = spec.Dtype("param_dtype", act);
  if (spec.error().ok() && m.hidden % m.heads != 0) {
    spec.Fail(absl::StrFormat("hidden=%d is not a multiple of heads=%d", m.hidden, m.heads));
  }
  if (spec.error().ok() && m.seq > positions) {
    spec.Fail(absl::StrFormat("seq=%d is more than positions=%d", m.seq, positions));
  }
  if (!spec.error().ok()) return spec.error();

  Graph g(options, act, param);
  const std::int64_t b = m.batch, s = m.seq, h = m.hidden;
  const int tokens = g.Input("tokens", {b, s}, kInt64);
  const int targets = g.Input("targets", {b * s}, kInt64);
  const int pos = g.Input("positions", {s}, kInt64);
  const int mask = m.flash ? -1 : g.Input("causal_mask", {s, s}, 1);
  const int wte = g.Param("wte", {vocab, h});
  const int wpe = g.Param("wpe", {positions, h});

  const int tok = g.Embedding("tok_emb", wte, tokens);
  const int pe = g.Embedding("pos_emb", wpe, pos);
  int x = g.Add("h.0.in", tok, pe);
  if (m.dropout) x = g.Dropout("emb.dropout", x);
  for (std::int64_t l = 0; l < m.layers; ++l) x = Block(g, m, absl::StrCat("h.", l, "."), x, mask);
  const int lnf_w = g.Param("ln_f.weight", {h});
  const int lnf_b = g.Param("ln_f.bias", {h});
  const int xf = g.LayerNorm("ln_f", x, lnf_w, lnf_b);
  const int flat = g.Reshape("ln_f.flat", xf, {b * s, h});
  const int logits = g.Linear("logits", flat, wte);  // tied: logits = x wte^T
  const int loss = g.CrossEntropy("loss", logits, targets, 1);
  return Finish(g, loss, spec);
}

const std::vector<KeyDef> kVitKeys = WithDtypes({
    {"layers", "12", "encoder layers"},
    {"hidden", "768", "hidden size h"},
    {"heads", "12", "attention heads a (h divisible by a)"},
    {"patch", "16", "patch size (image divisible by it)"},
    {"image", "224", "image height and width"},
    {"batch", "64", "images per step"},
    {"classes", "1000", "classes of the head"},
    {"dropout", "0", "1: dropout after the softmax, both projections and the embedding"},
    {"attn", "math", "math or flash"},
});

absl::StatusOr<GeneratedTrace> MakeVit(Spec& spec, const ModelGenOptions& options) {
  Transformer m;
  m.layers = spec.Int("layers", 1, 4096);
  m.hidden = spec.Int("hidden", 1, 1 << 20);
  m.heads = spec.Int("heads", 1, 1 << 16);
  const std::int64_t patch = spec.Int("patch", 1, 1 << 12);
  const std::int64_t image = spec.Int("image", 1, 1 << 16);
  m.batch = spec.Int("batch", 1, 1 << 20);
  const std::int64_t classes = spec.Int("classes", 1, 1 << 24);
  m.dropout = spec.Int("dropout", 0, 1) == 1;
  m.flash = spec.Choice("attn", {"math", "flash"}) == "flash";
  const int act = spec.Dtype("dtype");
  const int param = spec.Dtype("param_dtype", act);
  if (spec.error().ok() && m.hidden % m.heads != 0) {
    spec.Fail(absl::StrFormat("hidden=%d is not a multiple of heads=%d", m.hidden, m.heads));
  }
  if (spec.error().ok() && image % patch != 0) {
    spec.Fail(absl::StrFormat("image=%d is not a multiple of patch=%d", image, patch));
  }
  if (!spec.error().ok()) return spec.error();
  const std::int64_t grid = image / patch;
  m.seq = grid * grid + 1;

  Graph g(options, act, param);
  const std::int64_t b = m.batch, s = m.seq, h = m.hidden;
  const int img = g.Input("image", {b, 3, image, image}, act);
  const int labels = g.Input("labels", {b}, kInt64);
  const int conv_w = g.Param("conv_proj.weight", {h, 3, patch, patch});
  const int conv_b = g.Param("conv_proj.bias", {h});
  const int cls = g.Param("class_token", {1, 1, h});
  const int pos = g.Param("encoder.pos_embedding", {1, s, h});

  int pe = g.Conv2d("conv_proj", img, conv_w, static_cast<int>(patch), 0, conv_b);  // [b, h, g, g]
  pe = g.Reshape("conv_proj.flat", pe, {b, h, grid * grid});
  pe = g.Transpose("patches", pe, 1, 2);  // [b, g*g, h]
  const int cls_b = g.Expand("class_token.expand", cls, {b, 1, h});
  int x = g.Cat("tokens", {cls_b, pe}, 1);
  x = g.Add("encoder.in", x, pos);
  if (m.dropout) x = g.Dropout("encoder.dropout", x);
  for (std::int64_t l = 0; l < m.layers; ++l) {
    x = Block(g, m, absl::StrCat("encoder.layers.", l, "."), x, -1);
  }
  const int ln_w = g.Param("encoder.ln.weight", {h});
  const int ln_b = g.Param("encoder.ln.bias", {h});
  x = g.LayerNorm("encoder.ln", x, ln_w, ln_b);
  const int first = g.Select("cls", x, 1);  // [b, h]: the class token's row
  const int head_w = g.Param("heads.head.weight", {classes, h});
  const int head_b = g.Param("heads.head.bias", {classes});
  const int logits = g.Linear("heads.head", first, head_w, head_b);
  const int loss = g.CrossEntropy("loss", logits, labels, 1);
  return Finish(g, loss, spec);
}

// --- unet -------------------------------------------------------------------

const std::vector<KeyDef> kUnetKeys = WithDtypes({
    {"levels", "4", "down (and up) steps"},
    {"base", "64", "channels at full resolution; doubled at each level"},
    {"batch", "8", "images per step"},
    {"image", "256", "image height and width (divisible by 2^levels)"},
    {"channels", "3", "input channels"},
    {"classes", "2", "output classes per pixel"},
});

absl::StatusOr<GeneratedTrace> MakeUnet(Spec& spec, const ModelGenOptions& options) {
  const std::int64_t levels = spec.Int("levels", 1, 8);
  const std::int64_t base = spec.Int("base", 1, 1 << 16);
  const std::int64_t batch = spec.Int("batch", 1, 1 << 20);
  const std::int64_t image = spec.Int("image", 1, 1 << 16);
  const std::int64_t channels = spec.Int("channels", 1, 1 << 16);
  const std::int64_t classes = spec.Int("classes", 1, 1 << 16);
  const int act = spec.Dtype("dtype");
  const int param = spec.Dtype("param_dtype", act);
  if (spec.error().ok() && image % (std::int64_t{1} << levels) != 0) {
    spec.Fail(absl::StrFormat("image=%d is not a multiple of 2^levels=%d", image,
                              std::int64_t{1} << levels));
  }
  if (!spec.error().ok()) return spec.error();

  Graph g(options, act, param);
  auto double_conv = [&](const std::string& p, int x, std::int64_t in, std::int64_t out) {
    for (int i = 1; i <= 2; ++i) {
      const std::string c = absl::StrCat(p, "conv", i);
      const int w = g.Param(c + ".weight", {out, i == 1 ? in : out, 3, 3});
      x = g.Conv2d(c, x, w, 1, 1);
      const std::string n = absl::StrCat(p, "bn", i);
      const int gamma = g.Param(n + ".weight", {out});
      const int beta = g.Param(n + ".bias", {out});
      x = g.Relu(absl::StrCat(p, "relu", i), g.BatchNorm(n, x, gamma, beta));
    }
    return x;
  };

  const int img = g.Input("image", {batch, channels, image, image}, act);
  const int masks = g.Input("masks", {batch, image, image}, kInt64);
  std::vector<int> skips;
  int x = double_conv("inc.", img, channels, base);
  std::int64_t ch = base;
  for (std::int64_t i = 1; i <= levels; ++i) {
    skips.push_back(x);
    const std::string p = absl::StrCat("down", i, ".");
    x = g.MaxPool2d(p + "pool", x, 2, 2, 0);
    x = double_conv(p, x, ch, 2 * ch);
    ch *= 2;
  }
  for (std::int64_t i = 1; i <= levels; ++i) {
    const std::string p = absl::StrCat("up", i, ".");
    const int w = g.Param(p + "up.weight", {ch, ch / 2, 2, 2});
    const int bias = g.Param(p + "up.bias", {ch / 2});
    const int up = g.ConvTranspose2d(p + "up", x, w, bias);
    const int skip = skips[static_cast<std::size_t>(levels - i)];
    x = g.Cat(p + "cat", {skip, up}, 1);
    x = double_conv(p, x, ch, ch / 2);
    ch /= 2;
  }
  const int out_w = g.Param("outc.weight", {classes, base, 1, 1});
  const int out_b = g.Param("outc.bias", {classes});
  const int logits = g.Conv2d("outc", x, out_w, 1, 0, out_b);
  const int loss = g.CrossEntropy("loss", logits, masks, 1);
  return Finish(g, loss, spec);
}

// --- registry ---------------------------------------------------------------

struct ModelDef {
  absl::string_view name;
  absl::string_view summary;
  const std::vector<KeyDef>* keys;
  absl::StatusOr<GeneratedTrace> (*make)(Spec&, const ModelGenOptions&);
};

const std::vector<ModelDef>& Models() {
  static const std::vector<ModelDef> models = {
      {"chain", "a homogeneous chain, forward then backward (given costs)", &kChainKeys, MakeChain},
      {"gpt2", "GPT-2: causal transformer LM, tied lm head, fused cross entropy", &kGpt2Keys,
       MakeGpt2},
      {"resnet", "torchvision ResNet v1.5 on ImageNet-shaped images", &kResnetKeys, MakeResnet},
      {"unet", "2D UNet (conv-bn-relu pairs, max pool down, transposed conv up, skips)", &kUnetKeys,
       MakeUnet},
      {"vit", "torchvision Vision Transformer (class token, pre-LN encoder)", &kVitKeys, MakeVit},
  };
  return models;
}

std::string ModelNames() {
  std::vector<absl::string_view> names;
  for (const ModelDef& m : Models()) names.push_back(m.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace
}  // namespace model_gen

absl::StatusOr<GeneratedTrace> GenerateModelTrace(std::string_view spec_text,
                                                  const ModelGenOptions& options) {
  const absl::string_view spec(spec_text.data(), spec_text.size());
  using model_gen::ModelDef;
  if (!(options.tflops > 0) || !std::isfinite(options.tflops)) {
    return absl::InvalidArgumentError("tflops must be a positive number");
  }
  if (!(options.hbm_gbps > 0) || !std::isfinite(options.hbm_gbps)) {
    return absl::InvalidArgumentError("hbm_gbps must be a positive number");
  }
  if (options.launch_ns < 0) return absl::InvalidArgumentError("launch_ns must not be negative");
  const std::size_t colon = spec.find(':');
  const absl::string_view name = spec.substr(0, colon);
  const absl::string_view pairs = colon == absl::string_view::npos ? "" : spec.substr(colon + 1);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no model named in spec '%s'; known models: %s", spec, model_gen::ModelNames()));
  }
  for (const ModelDef& m : model_gen::Models()) {
    if (m.name != name) continue;
    model_gen::Spec parsed{std::string(m.name), m.keys};
    if (absl::Status s = parsed.Parse(pairs); !s.ok()) return s;
    return m.make(parsed, options);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown model '%s'; known models: %s", name, model_gen::ModelNames()));
}

std::string ModelGenHelp() {
  std::string out;
  for (const model_gen::ModelDef& m : model_gen::Models()) {
    absl::StrAppend(&out, m.name, ": ", m.summary, "\n");
    for (const model_gen::KeyDef& k : *m.keys) {
      absl::StrAppend(&out, absl::StrFormat("    %-13s %-7s %s\n", k.key, k.def, k.doc));
    }
  }
  return out;
}

}  // namespace remat
