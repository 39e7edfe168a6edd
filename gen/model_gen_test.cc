// Tests of the model trace generators: each model's trace parses, its memory
// matches a published formula or a derivation from the architecture done here
// independently, its FLOPs match the standard counts, and bad specs fail with
// messages that say what is known.
//
// What is compared, for each model:
// - "saved": live bytes when the backward phase starts (the end of the
//   forward: everything autograd keeps) minus the constants (parameters and
//   inputs), against the activation formula. Tight (2%).
// - "peak": OpTrace::peak_live_bytes (the parser's; the unlimited replay's is
//   the same, as sim/gen_replay_test.cc checks) against constants + the
//   formula. The requirement is 15%. The peak is reached early in the
//   backward, where the first gradients exist beside everything saved: for
//   GPT-2 it is where the formula's 4sbv loss term is counted (saved logits +
//   dlogits); for the convnets it adds one or two gradient maps of the last
//   layers to the saved activations.
#include "gen/model_gen.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trace/op_trace.h"

namespace remat {
namespace {

using ::testing::HasSubstr;

constexpr double kBf16 = 2;

GeneratedTrace Gen(const std::string& spec, const ModelGenOptions& options = {}) {
  absl::StatusOr<GeneratedTrace> g = GenerateModelTrace(spec, options);
  EXPECT_TRUE(g.ok()) << spec << ": " << g.status();
  return g.ok() ? *std::move(g) : GeneratedTrace{};
}

OpTrace Parse(const GeneratedTrace& g) {
  absl::StatusOr<OpTrace> t = ParseOpTrace(g.text, g.spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : OpTrace{};
}

// Live storage bytes just before the first record of phase `phase`, running
// the trace as written (as the parser counts the peak).
std::uint64_t LiveAtPhase(const OpTrace& t, const std::string& phase) {
  std::vector<int> refs(t.tensors.size(), 0);
  std::uint64_t live = 0;
  auto define = [&](std::uint32_t x) {
    const OpTensor& tensor = t.tensors[x];
    if (refs[tensor.storage]++ == 0) live += t.tensors[tensor.storage].bytes;
  };
  for (const OpRecord& r : t.records) {
    switch (r.kind) {
      case OpKind::kPhase:
        if (t.names[r.name] == phase) return live;
        break;
      case OpKind::kConstant:
      case OpKind::kCall:
        for (std::uint32_t x : r.outputs) define(x);
        break;
      case OpKind::kRelease: {
        const std::uint32_t s = t.tensors[r.inputs[0]].storage;
        if (--refs[s] == 0) live -= t.tensors[s].bytes;
        break;
      }
      case OpKind::kUse:
      case OpKind::kEvict:
      case OpKind::kPrefetch:
        break;
    }
  }
  ADD_FAILURE() << "no phase " << phase;
  return 0;
}

// Checks the end-of-forward activations against `saved_reference` and the
// peak against constants + `peak_reference`, and prints one row of the
// comparison.
void CheckMemory(const std::string& label, const OpTrace& t, double constants,
                 double saved_reference, double peak_reference, double saved_tolerance,
                 double peak_tolerance = 0.15) {
  EXPECT_EQ(static_cast<double>(t.constant_bytes), constants) << label;
  const double saved = static_cast<double>(LiveAtPhase(t, "backward")) - constants;
  const double peak = static_cast<double>(t.peak_live_bytes);
  const double reference = constants + peak_reference;
  std::printf("[ memory ] %-34s saved %.4g vs %.4g (%+.2f%%); peak %.4g vs %.4g (%+.2f%%)\n",
              label.c_str(), saved, saved_reference, 100 * (saved / saved_reference - 1), peak,
              reference, 100 * (peak / reference - 1));
  EXPECT_NEAR(saved / saved_reference, 1.0, saved_tolerance) << label << ": saved " << saved;
  EXPECT_NEAR(peak / reference, 1.0, peak_tolerance) << label << ": peak " << peak;
  // Nothing but the constants is left at the end.
  EXPECT_EQ(t.live_bytes_at_end, t.constant_bytes) << label;
}

// Costs with matmuls at 1 TFLOP/s (1 ns = 1000 FLOPs) and everything else
// nearly free: the trace's total cost is its FLOPs.
ModelGenOptions FlopOptions() {
  ModelGenOptions o;
  o.tflops = 1;
  o.hbm_gbps = 1e12;
  o.launch_ns = 0;
  return o;
}

void CheckFlopsFromCosts(const GeneratedTrace& g) {
  const OpTrace t = Parse(g);
  // Memory-bound calls round up to 1 ns each.
  const double from_costs = static_cast<double>(t.total_cost_ns - t.calls) * 1e3;
  EXPECT_NEAR(from_costs / g.flops, 1.0, 1e-3) << g.spec;
}

// --- chain --------------------------------------------------------------------

TEST(ModelGenTest, ChainIsTheShippedChainByteForByte) {
  std::ifstream in(std::string(REMAT_EXAMPLE_TRACES_DIR) + "/chain_100.jsonl", std::ios::binary);
  ASSERT_TRUE(in) << "examples/traces/chain_100.jsonl";
  std::stringstream shipped;
  shipped << in.rdbuf();
  const GeneratedTrace g = Gen("chain:n=100");
  EXPECT_EQ(g.text, shipped.str());
  EXPECT_EQ(g.spec, "chain:n=100,bytes=4MiB,weight_bytes=1MiB,cost_ns=50000");
  EXPECT_EQ(Gen("chain").text, g.text);
}

TEST(ModelGenTest, ChainPeakAndCosts) {
  const GeneratedTrace g = Gen("chain:n=10,bytes=1000,weight_bytes=10,cost_ns=7");
  const OpTrace t = Parse(g);
  // At the first f_backward: x0..x9, g10 and g9 (n + 2 activations), the
  // weights and dw10.
  EXPECT_EQ(t.peak_live_bytes, 12 * 1000u + 11 * 10u);
  EXPECT_EQ(t.constant_bytes, 1000u + 10 * 10u);
  EXPECT_EQ(t.total_cost_ns, 10 * 7u + 5000 + 5000 + 10 * 14u);
  EXPECT_EQ(t.live_bytes_at_end, 10 * 10u);  // the weights (x0 went in the backward)
}

// --- GPT-2 -----------------------------------------------------------------------

struct Gpt2 {
  double layers = 12, hidden = 768, heads = 12, seq = 1024, batch = 8, vocab = 50257,
         positions = 1024;
  bool dropout = false;
  bool flash = false;

  std::string Spec() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "gpt2:layers=%.0f,hidden=%.0f,heads=%.0f,seq=%.0f,batch=%.0f,vocab=%.0f,"
                  "dropout=%d,attn=%s",
                  layers, hidden, heads, seq, batch, vocab, dropout ? 1 : 0,
                  flash ? "flash" : "math");
    return buf;
  }
  // Hugging Face's count: wte, wpe, per layer 12h^2 + 13h, the final layernorm.
  double Params() const {
    const double h = hidden;
    return vocab * h + positions * h + layers * (12 * h * h + 13 * h) + 2 * h;
  }
  // bf16 parameters; int64 tokens, targets and positions; the bool causal mask.
  double Constants() const {
    return kBf16 * Params() + 8 * (2 * batch * seq + seq) + (flash ? 0 : seq * seq);
  }
  // Korthikanti et al. 2022, sec. 4.1 and 4.3, in bytes (16-bit).
  double Activations() const {
    const double s = seq, b = batch, h = hidden, a = heads;
    double per_layer;
    if (flash) {
      // No s^2 tensors; flash attention keeps an fp32 log-sum-exp per head and
      // row, and drops attention probabilities in the kernel (no mask).
      per_layer = s * b * h * (dropout ? 34 : 32) + 4 * a * s * b;
    } else if (dropout) {
      per_layer = s * b * h * (34 + 5 * a * s / h);
    } else {
      // Without dropout: 34 - 2 (two sbh masks), 5 - 3 (the a s^2 b mask and
      // the 2 a s^2 b dropped probabilities).
      per_layer = s * b * h * (32 + 2 * a * s / h);
    }
    // Final layernorm input 2sbh, lm head input 2sbh, the loss's 4sbv, and
    // the embedding dropout's mask.
    const double outside = 4 * s * b * h + 4 * s * b * vocab + (dropout ? s * b * h : 0);
    return layers * per_layer + outside;
  }
  // Narayanan et al. 2021 without recomputation: 72 b s L h^2 (1 + s/6h) + 6 b s h V.
  double Flops() const {
    const double s = seq, b = batch, h = hidden;
    return 72 * b * s * layers * h * h * (1 + s / (6 * h)) + 6 * b * s * h * vocab;
  }
};

void CheckGpt2Memory(const Gpt2& m, const std::string& label) {
  const GeneratedTrace g = Gen(m.Spec());
  EXPECT_EQ(static_cast<double>(g.params), m.Params());
  // The paper's 4sbv is fp32 logits kept for the loss; the fused cross entropy
  // keeps bf16 logits (2sbv), and its backward's bf16 dlogits (2sbv more) are
  // live at the peak.
  const double logits = 2 * m.seq * m.batch * m.vocab;
  CheckMemory(label, Parse(g), m.Constants(), m.Activations() - logits, m.Activations(), 0.02);
}

TEST(ModelGenTest, Gpt2SmallSeqMemoryMatchesKorthikanti) {
  Gpt2 m;
  m.seq = 256;
  m.batch = 4;
  CheckGpt2Memory(m, "gpt2 124M s=256 b=4");
}

TEST(ModelGenTest, Gpt2MemoryMatchesKorthikanti) {
  CheckGpt2Memory(Gpt2{}, "gpt2 124M s=1024 b=8");
}

TEST(ModelGenTest, Gpt2WithDropoutMatchesKorthikanti) {
  Gpt2 m;
  m.dropout = true;
  CheckGpt2Memory(m, "gpt2 s=1024 b=8 dropout");
}

TEST(ModelGenTest, Gpt2FlashAttentionKeepsNoSquareTerm) {
  Gpt2 m;
  m.flash = true;
  CheckGpt2Memory(m, "gpt2 s=1024 b=8 flash");
  m.dropout = true;
  CheckGpt2Memory(m, "gpt2 s=1024 b=8 flash+dropout");
}

TEST(ModelGenTest, Gpt2MediumShapeMatchesKorthikanti) {
  Gpt2 m;
  m.layers = 4;  // per-layer terms scale; a few layers keep the test fast
  m.hidden = 1024;
  m.heads = 16;
  m.seq = 512;
  m.batch = 2;
  m.vocab = 8192;
  CheckGpt2Memory(m, "gpt2 h=1024 a=16 s=512 b=2");
}

TEST(ModelGenTest, Gpt2FlopsMatchTheStandardFormula) {
  Gpt2 m;
  m.seq = 256;
  m.batch = 4;
  const GeneratedTrace g = Gen(m.Spec(), FlopOptions());
  EXPECT_NEAR(g.flops / m.Flops(), 1.0, 1e-9);
  EXPECT_NEAR(g.flops / g.forward_flops, 3.0, 1e-9);  // every matmul input needs a gradient
  CheckFlopsFromCosts(g);
  // 6 * params * tokens (the non-embedding matmuls and the lm head), plus
  // attention's 12 * L * s * h per token.
  const double tokens = m.seq * m.batch;
  const double dense = 6 * (m.layers * 12 * m.hidden * m.hidden + m.vocab * m.hidden) * tokens;
  EXPECT_NEAR(g.flops / (dense + 12 * m.layers * m.seq * m.hidden * tokens), 1.0, 1e-9);
  EXPECT_GT(g.flops, 6 * m.Params() * tokens * 0.99);
  EXPECT_LT(g.flops, 6 * m.Params() * tokens * 1.15);
  std::printf("[ flops  ] gpt2 s=256 b=4: %.4g (6*P*T = %.4g)\n", g.flops, 6 * m.Params() * tokens);
}

// --- ResNet --------------------------------------------------------------------

int ConvOut(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

struct ResnetSaved {
  double act = 0;  // activation elements kept per image
  double idx = 0;  // int64 max-pool indices per image
};

// What autograd keeps per image for torchvision's ResNet, from its layers:
// every conv's output (batch norm's input) and every relu's output (the next
// conv's input); max pool's output and indices; the fc's input; the logits.
ResnetSaved ResnetSavedPerImage(int depth, int image, int classes) {
  const bool bottleneck = depth >= 50;
  std::vector<int> blocks = depth == 18    ? std::vector<int>{2, 2, 2, 2}
                            : depth == 101 ? std::vector<int>{3, 4, 23, 3}
                            : depth == 152 ? std::vector<int>{3, 8, 36, 3}
                                           : std::vector<int>{3, 4, 6, 3};
  ResnetSaved s;
  const int r1 = ConvOut(image, 7, 2, 3);
  s.act += 2.0 * 64 * r1 * r1;  // conv1 out, relu out
  int r = ConvOut(r1, 3, 2, 1);
  s.act += 64.0 * r * r;  // max pool out
  s.idx += 64.0 * r * r;
  int in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int planes = 64 << stage;
    const int out = bottleneck ? 4 * planes : planes;
    for (int j = 0; j < blocks[stage]; ++j) {
      const int stride = stage > 0 && j == 0 ? 2 : 1;
      const int q = ConvOut(r, 3, stride, 1);
      const double before = static_cast<double>(r) * r, after = static_cast<double>(q) * q;
      if (bottleneck) {
        s.act += 2 * planes * before + 2 * planes * after + 2 * out * after;
      } else {
        s.act += 2 * planes * after + 2 * planes * after;
      }
      if (stride != 1 || in != out) s.act += out * after;  // the downsample conv's output
      in = out;
      r = q;
    }
  }
  s.act += in + classes;  // fc input, logits
  return s;
}

// torchvision's published parameter counts and GFLOPS (multiply-adds, forward).
struct TorchvisionResnet {
  int depth;
  double params;
  double gmacs;
};
constexpr TorchvisionResnet kTorchvision[] = {
    {18, 11'689'512, 1.81},  {34, 21'797'672, 3.66},   {50, 25'557'032, 4.09},
    {101, 44'549'160, 7.80}, {152, 60'192'808, 11.51},
};

TEST(ModelGenTest, ResnetParamsAndFlopsMatchTorchvision) {
  for (const TorchvisionResnet& r : kTorchvision) {
    const GeneratedTrace g = Gen("resnet:batch=2,depth=" + std::to_string(r.depth), FlopOptions());
    EXPECT_EQ(static_cast<double>(g.params), r.params) << r.depth;
    const double fwd = g.forward_flops / 2 / 2;  // per image, multiply-adds
    EXPECT_NEAR(fwd / (r.gmacs * 1e9), 1.0, 0.01) << r.depth;
    // Training is three forwards, less the first conv's input gradient
    // (images need none).
    const double stem = 2.0 * 2 * 64 * 112 * 112 * 3 * 7 * 7;
    EXPECT_NEAR(g.flops / (3 * g.forward_flops - stem), 1.0, 1e-9) << r.depth;
    CheckFlopsFromCosts(g);
  }
}

void CheckResnetMemory(int depth, int batch, int image) {
  const std::string spec = "resnet:depth=" + std::to_string(depth) +
                           ",batch=" + std::to_string(batch) + ",image=" + std::to_string(image);
  const GeneratedTrace g = Gen(spec);
  const ResnetSaved per = ResnetSavedPerImage(depth, image, 1000);
  // Plus each image's fp32 log-sum-exp.
  const double activations = batch * (kBf16 * per.act + 8 * per.idx + 4);
  const double constants =
      kBf16 * static_cast<double>(g.params) + batch * (kBf16 * 3 * image * image + 8);
  CheckMemory(spec, Parse(g), constants, activations, activations, 0.02);
}

TEST(ModelGenTest, Resnet50MemoryMatchesTheSavedActivations) {
  // 20,722,688 conv and relu outputs per image, 200,704 max-pool outputs and
  // indices, 2,048 + 1,000: 43.46 MB per image, 2.78 GB at batch 64.
  const ResnetSaved per = ResnetSavedPerImage(50, 224, 1000);
  EXPECT_EQ(per.act, 20'722'688 + 200'704 + 2'048 + 1'000);
  EXPECT_EQ(per.idx, 200'704);
  CheckResnetMemory(50, 64, 224);
}

TEST(ModelGenTest, ResnetOtherDepthsMatchTheSavedActivations) {
  // Batches that make activations, not parameter gradients, the bulk of the
  // memory (at batch 2 a ResNet-152's gradients, 120 MB, rival its 180 MB
  // of activations, and they all exist before the backward ends).
  CheckResnetMemory(18, 32, 224);
  CheckResnetMemory(34, 32, 160);
  CheckResnetMemory(101, 32, 224);
  CheckResnetMemory(152, 32, 224);
}

// --- ViT -----------------------------------------------------------------------

TEST(ModelGenTest, VitMatchesTorchvisionAndKorthikanti) {
  const double L = 12, h = 768, a = 12, b = 64, s = 14 * 14 + 1;
  const GeneratedTrace g = Gen("vit:layers=12,hidden=768,heads=12,patch=16,image=224,batch=64");
  // torchvision's vit_b_16: 86,567,656 parameters, 17.56 GFLOPS (multiply-adds).
  EXPECT_EQ(g.params, 86'567'656u);
  EXPECT_NEAR(g.forward_flops / b / 2 / 17.56e9, 1.0, 0.005);
  // Three forwards, less the patch conv's input gradient.
  const double patch_conv = 2 * b * 196 * h * 3 * 16 * 16;
  EXPECT_NEAR(g.flops / (3 * g.forward_flops - patch_conv), 1.0, 1e-9);
  const double activations = L * s * b * h * (32 + 2 * a * s / h) + 4 * s * b * h;
  const double constants = kBf16 * 86'567'656 + b * (kBf16 * 3 * 224 * 224 + 8);
  CheckMemory("vit-b/16 b=64", Parse(g), constants, activations, activations, 0.02);
  CheckFlopsFromCosts(Gen("vit:layers=2,batch=2", FlopOptions()));
}

// --- UNet ----------------------------------------------------------------------

TEST(ModelGenTest, UnetMatchesItsArchitecture) {
  const int levels = 4, base = 64, batch = 8, image = 256, in_ch = 3, classes = 2;
  const GeneratedTrace g = Gen("unet:levels=4,base=64,batch=8,image=256,channels=3,classes=2");
  // Parameters, multiply-adds and saved elements, level by level.
  double params = 0, macs = 0, act = 0, idx = 0;
  auto double_conv = [&](double cin, double cout, double res) {
    params += 9 * cin * cout + 9 * cout * cout + 4 * cout;
    macs += 9 * (cin + cout) * cout * res * res;
    act += 4 * cout * res * res;  // two conv outputs, two relu outputs
  };
  double_conv(in_ch, base, image);
  double ch = base;
  for (int i = 1; i <= levels; ++i) {
    const double res = image >> i;
    act += ch * res * res;  // max pool output
    idx += ch * res * res;
    double_conv(ch, 2 * ch, res);
    ch *= 2;
  }
  for (int i = levels - 1; i >= 0; --i) {
    const double res = image >> i;
    params += ch * (ch / 2) * 4 + ch / 2;  // the 2x2 transposed conv
    macs += ch * (ch / 2) * 4 * (res / 2) * (res / 2);
    act += ch * res * res;  // the concatenation (skip + up), the next conv's input
    double_conv(ch, ch / 2, res);
    ch /= 2;
  }
  params += base * classes + classes;
  macs += static_cast<double>(base) * classes * image * image;
  act += static_cast<double>(classes) * image * image;  // logits
  EXPECT_EQ(static_cast<double>(g.params), params);
  EXPECT_EQ(g.params, 31'037'698u);  // milesial/Pytorch-UNet with 3 channels, 2 classes
  EXPECT_NEAR(g.forward_flops / (2 * macs * batch), 1.0, 1e-9);
  const double stem = 2.0 * 9 * in_ch * base * image * image * batch;  // inc's first conv: no dgrad
  EXPECT_NEAR(g.flops / (3 * g.forward_flops - stem), 1.0, 1e-9);
  const double activations = batch * (kBf16 * act + 8 * idx + 4.0 * image * image);
  const double constants =
      kBf16 * params + batch * (kBf16 * in_ch * image * image + 8.0 * image * image);
  CheckMemory("unet 4 levels b=8 256^2", Parse(g), constants, activations, activations, 0.02);
}

// --- All models ----------------------------------------------------------------

// One of each model and variant; sim/gen_replay_test.cc replays the same
// specs through the runtime.
const char* const kSmallSpecs[] = {
    "chain:n=20",
    "resnet:depth=18,batch=4,image=64",
    "resnet:depth=50,batch=2,image=64",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512,dropout=1",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512,attn=flash",
    "vit:layers=2,hidden=128,heads=4,patch=8,image=32,batch=2,classes=10",
    "vit:layers=2,hidden=128,heads=4,patch=8,image=32,batch=2,classes=10,attn=flash,dropout=1",
    "unet:levels=2,base=8,batch=2,image=32",
};

TEST(ModelGenTest, CanonicalSpecsRegenerateTheSameTrace) {
  for (const char* spec : kSmallSpecs) {
    const GeneratedTrace g = Gen(spec);
    const GeneratedTrace again = Gen(g.spec);
    EXPECT_EQ(again.spec, g.spec);
    EXPECT_EQ(again.text, g.text) << spec;
  }
  EXPECT_EQ(Gen("gpt2:layers=2").spec,
            "gpt2:layers=2,hidden=768,heads=12,seq=1024,batch=8,vocab=50257,positions=1024,"
            "dropout=0,attn=math,dtype=bf16,param_dtype=dtype,steps=1");
}

TEST(ModelGenTest, StepsRepeatTheStepOverTheSameConstants) {
  for (const std::string spec : {"gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512",
                                 "resnet:depth=18,batch=4,image=64",
                                 "vit:layers=2,hidden=128,heads=4,patch=8,image=32,batch=2",
                                 "unet:levels=2,base=8,batch=1,image=32"}) {
    SCOPED_TRACE(spec);
    const GeneratedTrace one = Gen(spec);
    const GeneratedTrace three = Gen(spec + ",steps=3");
    const OpTrace a = Parse(one), b = Parse(three);
    std::size_t constants = 0;
    std::int64_t cost_a = 0, cost_b = 0;
    for (const OpTensor& t : a.tensors) constants += t.constant ? 1 : 0;
    for (const OpRecord& r : a.records) cost_a += r.cost_ns;
    for (const OpRecord& r : b.records) cost_b += r.cost_ns;
    EXPECT_EQ(b.records.size(), constants + 3 * (a.records.size() - constants));
    EXPECT_EQ(three.records, b.records.size());
    EXPECT_EQ(b.tensors.size(), constants + 3 * (a.tensors.size() - constants));
    EXPECT_EQ(cost_b, 3 * cost_a);
    EXPECT_DOUBLE_EQ(three.flops, 3 * one.flops);
    EXPECT_DOUBLE_EQ(three.forward_flops, 3 * one.forward_flops);
    // Each step frees what it made: the peak is one step's.
    EXPECT_EQ(b.peak_live_bytes, a.peak_live_bytes);
    // Step k's tensors are step 0's under "s<k>/"; constants are shared.
    absl::flat_hash_set<std::string> ids;
    for (const OpTensor& t : b.tensors) ids.insert(t.id);
    for (const OpTensor& t : a.tensors) {
      EXPECT_TRUE(ids.contains(t.id)) << t.id;
      EXPECT_NE(ids.contains("s2/" + t.id), t.constant) << t.id;
    }
    // Step 1's first call (on constants only) is step 0's with its output renamed.
    const std::size_t body = a.records.size() - constants;
    std::vector<absl::string_view> lines = absl::StrSplit(three.text, '\n');
    std::vector<absl::string_view> first = absl::StrSplit(one.text, '\n');
    const std::string line0(first[constants + 1]);
    ASSERT_THAT(line0, HasSubstr("\"op\":\"call\""));
    EXPECT_EQ(std::string(lines[constants + body + 1]),
              absl::StrReplaceAll(line0, {{"\"id\":\"", "\"id\":\"s1/"}}))
        << "the first record of step 1";
  }
}

TEST(ModelGenTest, CostsFollowTheDeviceRates) {
  const std::string spec = "gpt2:layers=2,hidden=512,heads=8,seq=256,batch=4,vocab=1024";
  const OpTrace base = Parse(Gen(spec));
  for (const OpRecord& r : base.records) {
    if (r.kind != OpKind::kCall) continue;
    bool view = true;
    for (std::uint32_t o : r.outputs) view = view && base.tensors[o].is_view();
    if (view) {
      EXPECT_EQ(r.cost_ns, 0) << "line " << r.line;
    } else {
      EXPECT_GE(r.cost_ns, 1000) << "line " << r.line;  // the launch floor
    }
  }
  // gelu is memory-bound: it reads and writes [b, s, 4h] in bf16.
  const std::int64_t gelu_bytes = 2 * 4 * 256 * 4 * 512 * 2;
  ModelGenOptions slow_memory;
  slow_memory.hbm_gbps = 100;
  slow_memory.launch_ns = 0;
  const OpTrace slow = Parse(Gen(spec, slow_memory));
  bool found = false;
  for (const OpRecord& r : slow.records) {
    if (r.kind == OpKind::kCall && slow.names[r.name] == "gelu") {
      EXPECT_EQ(r.cost_ns, (gelu_bytes + 99) / 100);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  // Matmul-bound: half the rate, twice the time.
  ModelGenOptions fast = FlopOptions(), half = FlopOptions();
  fast.tflops = 400;
  half.tflops = 200;
  const std::string big = "gpt2:layers=2,hidden=1024,heads=16,seq=512,batch=4,vocab=1024";
  EXPECT_NEAR(static_cast<double>(Parse(Gen(big, half)).total_cost_ns) /
                  static_cast<double>(Parse(Gen(big, fast)).total_cost_ns),
              2.0, 0.01);
}

TEST(ModelGenTest, DtypesScaleActivationsAndParameters) {
  const std::string spec = "gpt2:layers=2,hidden=256,heads=4,seq=128,batch=4,vocab=1024";
  const OpTrace bf16 = Parse(Gen(spec));
  const OpTrace fp32 = Parse(Gen(spec + ",dtype=fp32"));
  const OpTrace master = Parse(Gen(spec + ",param_dtype=fp32"));
  const GeneratedTrace g = Gen(spec);
  const double params = static_cast<double>(g.params);
  // dtype=fp32 makes parameters fp32 too (param_dtype follows dtype).
  EXPECT_EQ(static_cast<double>(fp32.constant_bytes - bf16.constant_bytes), 2 * params);
  EXPECT_EQ(static_cast<double>(master.constant_bytes - bf16.constant_bytes), 2 * params);
  const double act16 = static_cast<double>(LiveAtPhase(bf16, "backward") - bf16.constant_bytes);
  const double act32 = static_cast<double>(LiveAtPhase(fp32, "backward") - fp32.constant_bytes);
  EXPECT_NEAR(act32 / act16, 2.0, 0.02);  // fp32 statistics and masks stay as they are
  EXPECT_EQ(LiveAtPhase(master, "backward") - master.constant_bytes,
            LiveAtPhase(bf16, "backward") - bf16.constant_bytes);
  EXPECT_EQ(Gen(spec + ",dtype=fp16").text, Gen(spec).text);
}

// --- Bad specs -----------------------------------------------------------------

std::string ErrorOf(const std::string& spec, const ModelGenOptions& options = {}) {
  absl::StatusOr<GeneratedTrace> g = GenerateModelTrace(spec, options);
  EXPECT_FALSE(g.ok()) << spec;
  if (g.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(g.status())) << g.status();
  return std::string(g.status().message());
}

TEST(ModelGenTest, BadSpecsSayWhatIsKnown) {
  EXPECT_EQ(ErrorOf("bert:layers=2"),
            "unknown model 'bert'; known models: chain, gpt2, resnet, unet, vit");
  EXPECT_THAT(ErrorOf(""), HasSubstr("no model named"));
  EXPECT_THAT(ErrorOf(":layers=2"), HasSubstr("known models: chain, gpt2"));
  EXPECT_EQ(ErrorOf("gpt2:layer=2"),
            "gpt2: unknown key 'layer'; known keys: layers, hidden, heads, seq, batch, vocab, "
            "positions, dropout, attn, dtype, param_dtype, steps");
  EXPECT_THAT(ErrorOf("resnet:depht=50"), HasSubstr("known keys: depth, batch, image, classes"));
  EXPECT_EQ(ErrorOf("gpt2:layers=x"), "gpt2: layers='x' is not an integer");
  EXPECT_EQ(ErrorOf("gpt2:layers=1.5"), "gpt2: layers='1.5' is not an integer");
  EXPECT_EQ(ErrorOf("gpt2:layers="), "gpt2: layers='' is not an integer");
  EXPECT_EQ(ErrorOf("gpt2:layers=0"), "gpt2: layers=0 is out of range [1, 4096]");
  EXPECT_EQ(ErrorOf("gpt2:batch=-3"), "gpt2: batch=-3 is out of range [1, 1048576]");
  EXPECT_THAT(ErrorOf("gpt2:layers"),
              HasSubstr("gpt2: 'layers' is not key=value; known keys: layers"));
  EXPECT_THAT(ErrorOf("gpt2:layers=2,,seq=8"), HasSubstr("'' is not key=value"));
  EXPECT_EQ(ErrorOf("gpt2:=2"), "gpt2: '=2' has an empty key");
  EXPECT_EQ(ErrorOf("gpt2:layers=1,layers=2"), "gpt2: key 'layers' given twice");
  EXPECT_EQ(ErrorOf("gpt2:hidden=770"), "gpt2: hidden=770 is not a multiple of heads=12");
  EXPECT_EQ(ErrorOf("gpt2:seq=2048"), "gpt2: seq=2048 is more than positions=1024");
  EXPECT_EQ(ErrorOf("gpt2:attn=fast"), "gpt2: attn='fast' is not one of math, flash");
  EXPECT_EQ(ErrorOf("gpt2:dropout=2"), "gpt2: dropout=2 is out of range [0, 1]");
  EXPECT_EQ(ErrorOf("gpt2:dtype=int8"), "gpt2: dtype='int8' is not one of bf16, fp16, fp32");
  EXPECT_EQ(ErrorOf("gpt2:param_dtype=fp64"),
            "gpt2: param_dtype='fp64' is not one of bf16, fp16, fp32, dtype");
  EXPECT_EQ(ErrorOf("gpt2:steps=0"), "gpt2: steps=0 is out of range [1, 100000]");
  EXPECT_THAT(ErrorOf("gpt2:layers=12,steps=100000"),
              HasSubstr("steps=100000 would write 141100152 records; at most 20000000"));
  EXPECT_THAT(ErrorOf("chain:steps=2"), HasSubstr("chain: unknown key 'steps'"));
  EXPECT_EQ(ErrorOf("resnet:depth=20"), "resnet: depth=20 is not one of 18, 34, 50, 101, 152");
  EXPECT_EQ(ErrorOf("resnet:image=16"), "resnet: image=16 is out of range [32, 65536]");
  EXPECT_EQ(ErrorOf("vit:image=100"), "vit: image=100 is not a multiple of patch=16");
  EXPECT_EQ(ErrorOf("unet:image=100"), "unet: image=100 is not a multiple of 2^levels=16");
  EXPECT_THAT(ErrorOf("chain:bytes=lots"), HasSubstr("chain: bytes='lots' is not a byte size"));
  EXPECT_EQ(ErrorOf("chain:n=2000000"), "chain: n=2000000 is out of range [1, 1000000]");
  // The first bad value is the one reported.
  EXPECT_EQ(ErrorOf("vit:layers=0,heads=0"), "vit: layers=0 is out of range [1, 4096]");
  EXPECT_THAT(ErrorOf("gpt2:batch=1048576,seq=16777216,positions=16777216"),
              HasSubstr("the model is too large"));
}

TEST(ModelGenTest, BadOptionsFail) {
  ModelGenOptions o;
  o.tflops = 0;
  EXPECT_EQ(ErrorOf("chain", o), "tflops must be a positive number");
  o = {};
  o.hbm_gbps = -1;
  EXPECT_EQ(ErrorOf("chain", o), "hbm_gbps must be a positive number");
  o = {};
  o.launch_ns = -1;
  EXPECT_EQ(ErrorOf("chain", o), "launch_ns must not be negative");
}

TEST(ModelGenTest, HelpListsEveryModelAndKey) {
  const std::string help = ModelGenHelp();
  for (const char* s : {"chain:", "gpt2:", "resnet:", "unet:", "vit:", "param_dtype", "positions",
                        "weight_bytes", "levels", "patch"}) {
    EXPECT_THAT(help, HasSubstr(s));
  }
}

}  // namespace
}  // namespace remat
