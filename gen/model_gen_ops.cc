// The ops models are built from: output shapes, FLOPs, what autograd saves, and
// the backward calls (PyTorch's aten names where there is one).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gen/model_gen_graph.h"

namespace remat::model_gen {
namespace {

constexpr int kFp32 = 4;
constexpr int kInt64 = 8;
constexpr int kBool = 1;

double D(std::uint64_t n) { return static_cast<double>(n); }

}  // namespace

int Graph::Linear(absl::string_view name, int x, int w, int b) {
  const Shape xs = S(x);
  const Shape ws = S(w);
  if (xs.empty() || ws.size() != 2 || xs.back() != ws[1] ||
      (b >= 0 && Numel(S(b)) != static_cast<std::uint64_t>(ws[0]))) {
    Fail(absl::StrFormat("linear '%s': shapes do not fit", name));
    return x;
  }
  const std::int64_t in = ws[1];
  const std::int64_t out = ws[0];
  const double rows = D(Numel(xs)) / static_cast<double>(in);
  const double flops = 2 * rows * static_cast<double>(in) * static_cast<double>(out);
  Shape ys = xs;
  ys.back() = out;
  std::vector<int> inputs = {x, w};
  if (b >= 0) inputs.push_back(b);
  return Op(b >= 0 ? "addmm" : "mm", std::move(inputs), name, std::move(ys), act_, flops, {x, w},
            [x, w, b, flops](Graph& g, const GNode& n) {
              const int dy = g.Grad(n.outputs[0]);
              if (dy < 0) return;
              if (g.T(x).requires_grad) {
                g.Give(x, g.Emit("mm", {dy, w}, g.GradName(x), g.S(x), g.T(x).elem, flops));
              }
              if (g.T(w).requires_grad) {
                g.Give(w, g.Emit("mm", {dy, x}, g.GradName(w), g.S(w), g.T(w).elem, flops));
              }
              if (b >= 0 && g.T(b).requires_grad) {
                g.Give(b, g.Emit("sum", {dy}, g.GradName(b), g.S(b), g.T(b).elem, 0));
              }
            });
}

int Graph::Matmul(absl::string_view name, int a, int b, bool trans_b) {
  const Shape as = S(a);
  const Shape bs = S(b);
  const std::size_t r = as.size();
  bool ok = r >= 2 && bs.size() == r;
  for (std::size_t i = 0; ok && i + 2 < r; ++i) ok = as[i] == bs[i];
  const std::int64_t m = ok ? as[r - 2] : 0;
  const std::int64_t k = ok ? as[r - 1] : 0;
  const std::int64_t n = ok ? (trans_b ? bs[r - 2] : bs[r - 1]) : 0;
  ok = ok && (trans_b ? bs[r - 1] : bs[r - 2]) == k;
  if (!ok) {
    Fail(absl::StrFormat("matmul '%s': shapes do not fit", name));
    return a;
  }
  const double batch = D(Numel(as)) / static_cast<double>(m * k);
  const double flops =
      2 * batch * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  Shape ys = as;
  ys[r - 1] = n;
  return Op("bmm", {a, b}, name, std::move(ys), act_, flops, {a, b},
            [a, b, flops](Graph& g, const GNode& node) {
              const int dy = g.Grad(node.outputs[0]);
              if (dy < 0) return;
              if (g.T(a).requires_grad) {
                g.Give(a, g.Emit("bmm", {dy, b}, g.GradName(a), g.S(a), g.T(a).elem, flops));
              }
              if (g.T(b).requires_grad) {
                g.Give(b, g.Emit("bmm", {a, dy}, g.GradName(b), g.S(b), g.T(b).elem, flops));
              }
            });
}

namespace {

// convolution_backward: one call, the gradients of whichever of input, weight
// and bias need one.
void ConvBackward(Graph& g, const GNode& n, int x, int w, int b, double flops) {
  const int dy = g.Grad(n.outputs[0]);
  if (dy < 0) return;
  std::vector<Graph::OutDef> outs;
  std::vector<int> to;
  double f = 0;
  for (int t : {x, w, b}) {
    if (t < 0 || !g.T(t).requires_grad) continue;
    outs.push_back({g.GradName(t), g.S(t), g.T(t).elem});
    to.push_back(t);
    if (t != b) f += flops;
  }
  if (to.empty()) return;
  std::vector<int> grads = g.EmitMulti("convolution_backward", {dy, x, w}, std::move(outs), f);
  for (std::size_t i = 0; i < to.size(); ++i) g.Give(to[i], grads[i]);
}

}  // namespace

int Graph::Conv2d(absl::string_view name, int x, int w, int stride, int pad, int b) {
  const Shape xs = S(x);
  const Shape ws = S(w);
  if (xs.size() != 4 || ws.size() != 4 || xs[1] != ws[1] || ws[2] != ws[3] || stride < 1) {
    Fail(absl::StrFormat("conv '%s': shapes do not fit", name));
    return x;
  }
  const std::int64_t k = ws[2];
  const std::int64_t ho = (xs[2] + 2 * pad - k) / stride + 1;
  const std::int64_t wo = (xs[3] + 2 * pad - k) / stride + 1;
  if (xs[2] + 2 * pad < k || xs[3] + 2 * pad < k) {
    Fail(absl::StrFormat("conv '%s': input smaller than the kernel", name));
    return x;
  }
  const double flops = 2 * D(xs[0]) * D(ws[0]) * D(ho) * D(wo) * D(xs[1]) * D(k) * D(k);
  std::vector<int> inputs = {x, w};
  if (b >= 0) inputs.push_back(b);
  return Op("convolution", std::move(inputs), name, {xs[0], ws[0], ho, wo}, act_, flops, {x, w},
            [x, w, b, flops](Graph& g, const GNode& n) { ConvBackward(g, n, x, w, b, flops); });
}

int Graph::ConvTranspose2d(absl::string_view name, int x, int w, int b) {
  const Shape xs = S(x);
  const Shape ws = S(w);
  if (xs.size() != 4 || ws.size() != 4 || xs[1] != ws[0] || ws[2] != ws[3]) {
    Fail(absl::StrFormat("conv_transpose '%s': shapes do not fit", name));
    return x;
  }
  const std::int64_t k = ws[2];
  const double flops = 2 * D(xs[0]) * D(xs[1]) * D(xs[2]) * D(xs[3]) * D(ws[1]) * D(k) * D(k);
  std::vector<int> inputs = {x, w};
  if (b >= 0) inputs.push_back(b);
  return Op("convolution", std::move(inputs), name, {xs[0], ws[1], xs[2] * k, xs[3] * k}, act_,
            flops, {x, w},
            [x, w, b, flops](Graph& g, const GNode& n) { ConvBackward(g, n, x, w, b, flops); });
}

namespace {

// The backward of a norm: dx, dgamma, dbeta from one call.
void NormBackward(Graph& g, const GNode& n, absl::string_view op, std::vector<int> inputs, int x,
                  int gamma, int beta) {
  const int dy = g.Grad(n.outputs[0]);
  if (dy < 0) return;
  inputs.insert(inputs.begin(), dy);
  std::vector<Graph::OutDef> outs;
  std::vector<int> to;
  for (int t : {x, gamma, beta}) {
    if (!g.T(t).requires_grad) continue;
    outs.push_back({g.GradName(t), g.S(t), g.T(t).elem});
    to.push_back(t);
  }
  if (to.empty()) return;
  std::vector<int> grads = g.EmitMulti(op, std::move(inputs), std::move(outs), 0);
  for (std::size_t i = 0; i < to.size(); ++i) g.Give(to[i], grads[i]);
}

}  // namespace

int Graph::BatchNorm(absl::string_view name, int x, int gamma, int beta) {
  const Shape xs = S(x);
  if (xs.size() < 2 || Numel(S(gamma)) != static_cast<std::uint64_t>(xs[1])) {
    Fail(absl::StrFormat("batch_norm '%s': shapes do not fit", name));
    return x;
  }
  GNode node;
  node.op = "batch_norm";
  node.inputs = {x, gamma, beta};
  const int y = NewTensor(name, xs, act_, -1);
  const int stats = NewTensor(absl::StrCat(name, ".stats"), {2, xs[1]}, kFp32, -1);  // mean, invstd
  node.outputs = {y, stats};
  node.saved = {x, gamma, stats};
  node.backward = [x, gamma, beta, stats](Graph& g, const GNode& n) {
    NormBackward(g, n, "batch_norm_backward", {x, gamma, stats}, x, gamma, beta);
  };
  AddNode(std::move(node));
  return y;
}

int Graph::LayerNorm(absl::string_view name, int x, int gamma, int beta) {
  const Shape xs = S(x);
  if (xs.empty() || Numel(S(gamma)) != static_cast<std::uint64_t>(xs.back())) {
    Fail(absl::StrFormat("layer_norm '%s': shapes do not fit", name));
    return x;
  }
  const std::int64_t rows = static_cast<std::int64_t>(Numel(xs)) / xs.back();
  GNode node;
  node.op = "layer_norm";
  node.inputs = {x, gamma, beta};
  const int y = NewTensor(name, xs, act_, -1);
  const int stats = NewTensor(absl::StrCat(name, ".stats"), {rows, 2}, kFp32, -1);  // mean, rstd
  node.outputs = {y, stats};
  node.saved = {x, gamma, beta, stats};
  node.backward = [x, gamma, beta, stats](Graph& g, const GNode& n) {
    NormBackward(g, n, "layer_norm_backward", {x, stats, gamma, beta}, x, gamma, beta);
  };
  AddNode(std::move(node));
  return y;
}

int Graph::Relu(absl::string_view name, int x) {
  GNode node;
  node.op = "relu";
  node.inputs = {x};
  const int y = NewTensor(name, S(x), T(x).elem, -1);
  node.outputs = {y};
  node.saved = {y};  // threshold_backward reads the result
  node.backward = [x, y](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0)
      g.Give(x, g.Emit("threshold_backward", {dy, y}, g.GradName(x), g.S(x), g.T(x).elem, 0));
  };
  AddNode(std::move(node));
  return y;
}

int Graph::Gelu(absl::string_view name, int x) {
  return Op("gelu", {x}, name, S(x), T(x).elem, 0, {x}, [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) g.Give(x, g.Emit("gelu_backward", {dy, x}, g.GradName(x), g.S(x), g.T(x).elem, 0));
  });
}

int Graph::Add(absl::string_view name, int a, int b) {
  const Shape as = S(a);
  const Shape bs = S(b);
  // b is a's shape, or a suffix of it (broadcast over a's leading dims).
  bool ok = bs.size() <= as.size();
  for (std::size_t i = 0; ok && i < bs.size(); ++i) {
    const std::int64_t bd = bs[bs.size() - 1 - i];
    ok = bd == as[as.size() - 1 - i] || bd == 1;
  }
  if (!ok) {
    Fail(absl::StrFormat("add '%s': shapes do not fit", name));
    return a;
  }
  return Op("add", {a, b}, name, as, T(a).elem, 0, {}, [a, b](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0) return;
    g.Give(a, dy);
    if (!g.T(b).requires_grad) return;
    if (Numel(g.S(b)) == Numel(g.S(a))) {
      g.Give(b, dy);
    } else {
      g.Give(b, g.Emit("sum", {dy}, g.GradName(b), g.S(b), g.T(b).elem, 0));
    }
  });
}

int Graph::Softmax(absl::string_view name, int x, int mask) {
  GNode node;
  node.op = mask >= 0 ? "masked_softmax" : "softmax";
  node.inputs = {x};
  if (mask >= 0) node.inputs.push_back(mask);
  const int y = NewTensor(name, S(x), T(x).elem, -1);
  node.outputs = {y};
  node.saved = {y};
  node.backward = [x, y](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0)
      g.Give(x, g.Emit("softmax_backward", {dy, y}, g.GradName(x), g.S(x), g.T(x).elem, 0));
  };
  AddNode(std::move(node));
  return y;
}

int Graph::Dropout(absl::string_view name, int x) {
  GNode node;
  node.op = "native_dropout";
  node.inputs = {x};
  const int y = NewTensor(name, S(x), T(x).elem, -1);
  const int mask = NewTensor(absl::StrCat(name, ".mask"), S(x), kBool, -1);
  node.outputs = {y, mask};
  node.saved = {mask};
  node.backward = [x, mask](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0) return;
    g.Give(x, g.Emit("native_dropout_backward", {dy, mask}, g.GradName(x), g.S(x), g.T(x).elem, 0));
  };
  AddNode(std::move(node));
  return y;
}

int Graph::MaxPool2d(absl::string_view name, int x, int kernel, int stride, int pad) {
  const Shape xs = S(x);
  if (xs.size() != 4 || xs[2] + 2 * pad < kernel || xs[3] + 2 * pad < kernel) {
    Fail(absl::StrFormat("max_pool '%s': shapes do not fit", name));
    return x;
  }
  const Shape ys = {xs[0], xs[1], (xs[2] + 2 * pad - kernel) / stride + 1,
                    (xs[3] + 2 * pad - kernel) / stride + 1};
  GNode node;
  node.op = "max_pool2d_with_indices";
  node.inputs = {x};
  const int y = NewTensor(name, ys, T(x).elem, -1);
  const int idx = NewTensor(absl::StrCat(name, ".indices"), ys, kInt64, -1);
  node.outputs = {y, idx};
  node.saved = {x, idx};
  node.backward = [x, idx](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0) return;
    g.Give(x, g.Emit("max_pool2d_with_indices_backward", {dy, x, idx}, g.GradName(x), g.S(x),
                     g.T(x).elem, 0));
  };
  AddNode(std::move(node));
  return y;
}

int Graph::GlobalAvgPool(absl::string_view name, int x) {
  const Shape xs = S(x);
  if (xs.size() != 4) {
    Fail(absl::StrFormat("avg_pool '%s': not [N, C, H, W]", name));
    return x;
  }
  // adaptive_avg_pool2d to 1x1 and the flatten after it; autograd keeps the input.
  return Op("adaptive_avg_pool2d", {x}, name, {xs[0], xs[1]}, T(x).elem, 0, {x},
            [x](Graph& g, const GNode& n) {
              const int dy = g.Grad(n.outputs[0]);
              if (dy < 0) return;
              g.Give(x, g.Emit("_adaptive_avg_pool2d_backward", {dy, x}, g.GradName(x), g.S(x),
                               g.T(x).elem, 0));
            });
}

int Graph::Embedding(absl::string_view name, int w, int ids) {
  const Shape ws = S(w);
  if (ws.size() != 2) {
    Fail(absl::StrFormat("embedding '%s': weight is not 2-d", name));
    return ids;
  }
  Shape ys = S(ids);
  ys.push_back(ws[1]);
  GNode node;
  node.op = "embedding";
  node.inputs = {w, ids};
  const int y = NewTensor(name, ys, act_, -1);
  node.outputs = {y};
  node.saved = {ids};
  // Reads the rows it gathers, not the whole table.
  node.moved = D(Numel(S(ids))) * kInt64 + 2 * D(Numel(ys)) * act_;
  node.backward = [w, ids](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0 || !g.T(w).requires_grad) return;
    g.Give(w, g.Emit("embedding_dense_backward", {dy, ids}, g.GradName(w), g.S(w), g.T(w).elem, 0));
  };
  AddNode(std::move(node));
  return y;
}

int Graph::CrossEntropy(absl::string_view name, int logits, int targets, int class_dim) {
  const Shape ls = S(logits);
  if (class_dim < 0 || static_cast<std::size_t>(class_dim) >= ls.size()) {
    Fail(absl::StrFormat("cross_entropy '%s': no class dim", name));
    return logits;
  }
  const std::int64_t rows = static_cast<std::int64_t>(Numel(ls)) / ls[class_dim];
  // Fused (log-softmax and NLL in one kernel): keeps the logits and each row's
  // fp32 log-sum-exp; the backward writes dlogits in the logits' dtype.
  GNode node;
  node.op = "cross_entropy";
  node.inputs = {logits, targets};
  const int loss = NewTensor(name, {}, kFp32, -1);
  const int lse = NewTensor(absl::StrCat(name, ".lse"), {rows}, kFp32, -1);
  node.outputs = {loss, lse};
  node.saved = {logits, lse, targets};
  node.backward = [logits, lse, targets](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0) return;
    g.Give(logits, g.Emit("cross_entropy_backward", {dy, logits, lse, targets}, g.GradName(logits),
                          g.S(logits), g.T(logits).elem, 0));
  };
  AddNode(std::move(node));
  return loss;
}

int Graph::FlashAttention(absl::string_view name, int q, int k, int v) {
  const Shape qs = S(q);
  if (qs.size() != 4 || S(k) != qs || S(v) != qs) {
    Fail(absl::StrFormat("flash_attention '%s': q, k, v are not [b, s, a, d] alike", name));
    return q;
  }
  const double b = D(qs[0]), s = D(qs[1]), a = D(qs[2]), d = D(qs[3]);
  const double flops = 4 * b * a * s * s * d;  // q k^T and p v (causal halves are not deducted)
  GNode node;
  node.op = "flash_attention";
  node.inputs = {q, k, v};
  const int out = NewTensor(name, qs, act_, -1);
  const int lse = NewTensor(absl::StrCat(name, ".lse"), {qs[0], qs[2], qs[1]}, kFp32, -1);
  node.outputs = {out, lse};
  node.saved = {q, k, v, out, lse};
  node.flops = flops;
  node.backward = [q, k, v, out, lse, flops](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy < 0) return;
    // Recomputes q k^T, then dv, dp, dq, dk: five matmuls to the forward's two.
    std::vector<int> grads = g.EmitMulti("flash_attention_backward", {dy, q, k, v, out, lse},
                                         {{g.GradName(q), g.S(q), g.T(q).elem},
                                          {g.GradName(k), g.S(k), g.T(k).elem},
                                          {g.GradName(v), g.S(v), g.T(v).elem}},
                                         2.5 * flops);
    g.Give(q, grads[0]);
    g.Give(k, grads[1]);
    g.Give(v, grads[2]);
  };
  AddNode(std::move(node));
  return out;
}

int Graph::Reshape(absl::string_view name, int x, Shape shape) {
  if (Numel(shape) != Numel(S(x))) {
    Fail(absl::StrFormat("reshape '%s': element counts differ", name));
    return x;
  }
  return ViewOp("view", x, name, std::move(shape), [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) g.Give(x, g.EmitView("view", dy, g.GradName(x), g.S(x)));
  });
}

int Graph::Transpose(absl::string_view name, int x, int d0, int d1) {
  Shape shape = S(x);
  if (d0 < 0 || d1 < 0 || static_cast<std::size_t>(std::max(d0, d1)) >= shape.size()) {
    Fail(absl::StrFormat("transpose '%s': no such dims", name));
    return x;
  }
  std::swap(shape[d0], shape[d1]);
  return ViewOp("transpose", x, name, std::move(shape), [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) g.Give(x, g.EmitView("transpose", dy, g.GradName(x), g.S(x)));
  });
}

std::vector<int> Graph::Split(absl::string_view name, int x, int dim, int parts) {
  const Shape xs = S(x);
  if (dim < 0 || static_cast<std::size_t>(dim) >= xs.size() || parts < 1 || xs[dim] % parts != 0) {
    Fail(absl::StrFormat("split '%s': does not divide", name));
    return std::vector<int>(parts > 0 ? parts : 0, x);
  }
  Shape part = xs;
  part[dim] /= parts;
  GNode node;
  node.op = "split";
  node.view = true;
  node.inputs = {x};
  for (int i = 0; i < parts; ++i) {
    node.outputs.push_back(NewTensor(absl::StrCat(name, ".", i), part, T(x).elem, x));
  }
  node.differentiable_outputs = node.outputs.size();
  node.backward = [x](Graph& g, const GNode& n) {
    // cat of the parts' gradients (parts without one are zeros).
    std::vector<int> grads;
    for (int t : n.outputs) {
      if (g.Grad(t) >= 0) grads.push_back(g.Grad(t));
    }
    g.Give(x, g.Emit("cat", std::move(grads), g.GradName(x), g.S(x), g.T(x).elem, 0));
  };
  AddNode(std::move(node));
  return nodes_.back().outputs;
}

int Graph::Select(absl::string_view name, int x, int dim) {
  Shape shape = S(x);
  if (dim < 0 || static_cast<std::size_t>(dim) >= shape.size()) {
    Fail(absl::StrFormat("select '%s': no such dim", name));
    return x;
  }
  shape.erase(shape.begin() + dim);
  return ViewOp("select", x, name, std::move(shape), [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) {
      g.Give(x, g.Emit("select_backward", {dy}, g.GradName(x), g.S(x), g.T(x).elem, 0));
    }
  });
}

int Graph::Expand(absl::string_view name, int x, Shape shape) {
  return ViewOp("expand", x, name, std::move(shape), [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) g.Give(x, g.Emit("sum", {dy}, g.GradName(x), g.S(x), g.T(x).elem, 0));
  });
}

int Graph::Cat(absl::string_view name, const std::vector<int>& xs, int dim) {
  if (xs.empty()) {
    Fail(absl::StrFormat("cat '%s': nothing to concatenate", name));
    return -1;
  }
  Shape shape = S(xs[0]);
  if (dim < 0 || static_cast<std::size_t>(dim) >= shape.size()) {
    Fail(absl::StrFormat("cat '%s': no such dim", name));
    return xs[0];
  }
  for (std::size_t i = 1; i < xs.size(); ++i) {
    Shape other = S(xs[i]);
    if (other.size() != shape.size()) {
      Fail(absl::StrFormat("cat '%s': ranks differ", name));
      return xs[0];
    }
    shape[dim] += other[dim];
  }
  return Op("cat", xs, name, std::move(shape), T(xs[0]).elem, 0, {},
            [xs](Graph& g, const GNode& n) {
              const int dy = g.Grad(n.outputs[0]);
              if (dy < 0) return;
              // Each input's gradient is a slice of dy.
              std::vector<OutDef> outs;
              std::vector<int> to;
              for (int t : xs) {
                if (!g.T(t).requires_grad) continue;
                outs.push_back({g.GradName(t), g.S(t), g.T(t).elem});
                to.push_back(t);
              }
              if (to.empty()) return;
              std::vector<int> views = g.EmitViews("split", dy, std::move(outs));
              for (std::size_t i = 0; i < to.size(); ++i) g.Give(to[i], views[i]);
            });
}

int Graph::Contiguous(absl::string_view name, int x) {
  return Op("clone", {x}, name, S(x), T(x).elem, 0, {}, [x](Graph& g, const GNode& n) {
    const int dy = g.Grad(n.outputs[0]);
    if (dy >= 0) g.Give(x, dy);
  });
}

}  // namespace remat::model_gen
