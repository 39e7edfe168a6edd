// Model op-trace generators: spec parsing, the trace writer, the forward graph
// with autograd's saved tensors, and its emission (forward, backward,
// optimizer). The models themselves are in model_gen_models.cc.
#include "gen/model_gen.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "gen/model_gen_graph.h"

namespace remat::model_gen {

// --- Spec -------------------------------------------------------------------

namespace {

std::string KnownKeys(const std::vector<KeyDef>& keys) {
  std::vector<absl::string_view> names;
  names.reserve(keys.size());
  for (const KeyDef& k : keys) names.push_back(k.key);
  return absl::StrJoin(names, ", ");
}

}  // namespace

Spec::Spec(std::string model, const std::vector<KeyDef>* keys)
    : model_(std::move(model)), keys_(keys) {}

absl::Status Spec::Parse(absl::string_view pairs) {
  if (pairs.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(pairs, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: '%s' is not key=value; known keys: %s",
                                                        model_, item, KnownKeys(*keys_)));
    }
    std::string key(item.substr(0, eq));
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: '%s' has an empty key", model_, item));
    }
    const bool known =
        std::any_of(keys_->begin(), keys_->end(), [&](const KeyDef& k) { return k.key == key; });
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: unknown key '%s'; known keys: %s", model_, key, KnownKeys(*keys_)));
    }
    if (given_.contains(key)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: key '%s' given twice", model_, key));
    }
    given_.emplace(std::move(key), std::string(item.substr(eq + 1)));
  }
  return absl::OkStatus();
}

std::string Spec::Raw(absl::string_view key) const {
  if (auto it = given_.find(std::string(key)); it != given_.end()) return it->second;
  for (const KeyDef& k : *keys_) {
    if (k.key == key) return std::string(k.def);
  }
  return "";  // a model reading a key it did not declare: caught by the tests
}

void Spec::Fail(std::string message) {
  if (error_.ok()) error_ = absl::InvalidArgumentError(absl::StrCat(model_, ": ", message));
}

std::int64_t Spec::Int(absl::string_view key, std::int64_t min, std::int64_t max) {
  const std::string text = Raw(key);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    Fail(absl::StrFormat("%s='%s' is not an integer", key, text));
    return min;
  }
  if (value < min || value > max) {
    Fail(absl::StrFormat("%s=%d is out of range [%d, %d]", key, value, min, max));
    return min;
  }
  return value;
}

std::uint64_t Spec::Bytes(absl::string_view key, std::uint64_t min, std::uint64_t max) {
  const std::string text = Raw(key);
  absl::StatusOr<std::uint64_t> value = ParseBytes(text);
  if (!value.ok()) {
    Fail(absl::StrFormat("%s='%s' is not a byte size (%s)", key, text, value.status().message()));
    return min;
  }
  if (*value < min || *value > max) {
    Fail(absl::StrFormat("%s=%s is out of range [%d, %d] bytes", key, text, min, max));
    return min;
  }
  return *value;
}

std::string Spec::Choice(absl::string_view key, const std::vector<absl::string_view>& choices) {
  const std::string text = Raw(key);
  if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
    Fail(absl::StrFormat("%s='%s' is not one of %s", key, text, absl::StrJoin(choices, ", ")));
    return std::string(choices.front());
  }
  return text;
}

int Spec::Dtype(absl::string_view key, int same_as) {
  const std::string text = Raw(key);
  if (text == "dtype" && same_as > 0) return same_as;
  const std::string dtype =
      Choice(key, same_as > 0 ? std::vector<absl::string_view>{"bf16", "fp16", "fp32", "dtype"}
                              : std::vector<absl::string_view>{"bf16", "fp16", "fp32"});
  return dtype == "fp32" ? 4 : 2;
}

std::string Spec::Canonical() const {
  std::vector<std::string> pairs;
  pairs.reserve(keys_->size());
  for (const KeyDef& k : *keys_) pairs.push_back(absl::StrCat(k.key, "=", Raw(k.key)));
  return absl::StrCat(model_, ":", absl::StrJoin(pairs, ","));
}

// --- Writer -----------------------------------------------------------------

// Marks a non-constant's id in the text, for Take to name per step. The
// generators' ids never hold control characters.
constexpr char kStepMark = '\x01';
// What a repeated trace may hold: a few GB of text.
constexpr std::uint64_t kMaxRecords = 20'000'000;

void Writer::Begin(absl::string_view op) {
  if (op != "constant" && body_start_ == std::string::npos) body_start_ = text_.size();
  if (body_start_ != std::string::npos) ++body_records_;
  absl::StrAppend(&text_, "{\"op\":\"", op, "\"");
  ++records_;
}

void Writer::Id(absl::string_view id) {
  if (!constants_.contains(id)) text_.push_back(kStepMark);
  text_.append(id.data(), id.size());
}

void Writer::Constant(absl::string_view id, std::uint64_t bytes) {
  if (body_start_ != std::string::npos) constant_after_body_ = true;
  constants_.emplace(id);
  Begin("constant");
  absl::StrAppend(&text_, ",\"id\":\"", id, "\",\"bytes\":", bytes, "}\n");
}

void Writer::Call(absl::string_view name, const std::vector<absl::string_view>& inputs,
                  const std::vector<Out>& outputs, std::int64_t cost_ns) {
  Begin("call");
  absl::StrAppend(&text_, ",\"name\":\"", name, "\",\"inputs\":[");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    text_.append(i == 0 ? "\"" : ",\"");
    Id(inputs[i]);
    text_.push_back('"');
  }
  absl::StrAppend(&text_, "],\"outputs\":[");
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Out& o = outputs[i];
    text_.append(i == 0 ? "{\"id\":\"" : ",{\"id\":\"");
    Id(o.id);
    if (o.alias_of.empty()) {
      absl::StrAppend(&text_, "\",\"bytes\":", o.bytes, "}");
    } else {
      text_.append("\",\"alias_of\":\"");
      Id(o.alias_of);
      text_.append("\"}");
    }
  }
  absl::StrAppend(&text_, "],\"cost_ns\":", cost_ns, "}\n");
}

void Writer::Use(const std::vector<absl::string_view>& ids) {
  Begin("use");
  absl::StrAppend(&text_, ",\"ids\":[");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    text_.append(i == 0 ? "\"" : ",\"");
    Id(ids[i]);
    text_.push_back('"');
  }
  absl::StrAppend(&text_, "]}\n");
}

void Writer::Release(absl::string_view id) {
  if (constants_.contains(id)) releases_constant_ = true;
  Begin("release");
  text_.append(",\"id\":\"");
  Id(id);
  text_.append("\"}\n");
}

void Writer::Phase(absl::string_view name) {
  Begin("phase");
  absl::StrAppend(&text_, ",\"name\":\"", name, "\"}\n");
}

absl::StatusOr<std::string> Writer::Take(int steps) {
  if (steps < 1) return absl::InvalidArgumentError("steps must be at least 1");
  if (steps > 1 && (releases_constant_ || constant_after_body_)) {
    return absl::InvalidArgumentError(
        "this trace cannot repeat its step: it releases a constant or defines one late");
  }
  const std::uint64_t total =
      records_ - body_records_ + body_records_ * static_cast<std::uint64_t>(steps);
  if (total > kMaxRecords) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "steps=%d would write %d records; at most %d", steps, total, kMaxRecords));
  }
  const std::size_t start = std::min(body_start_, text_.size());
  const absl::string_view body = absl::string_view(text_).substr(start);
  std::string out(text_.data(), start);
  out.reserve(start + steps * (body.size() + body_records_ * 8));
  for (int k = 0; k < steps; ++k) {
    const std::string prefix = k == 0 ? "" : absl::StrCat("s", k, "/");
    for (std::size_t at = 0; at < body.size();) {
      const std::size_t mark = body.find(kStepMark, at);
      const std::size_t end = mark == absl::string_view::npos ? body.size() : mark;
      out.append(body.data() + at, end - at);
      if (mark == absl::string_view::npos) break;
      out.append(prefix);
      at = mark + 1;
    }
  }
  records_ = total;
  text_.clear();
  return out;
}

// --- Graph: building the forward ------------------------------------------

namespace {

// Tensors above this many bytes make a model "too large" (and keep every sum
// of sizes far from overflowing).
constexpr std::uint64_t kMaxTensorBytes = std::uint64_t{1} << 50;

}  // namespace

Graph::Graph(const ModelGenOptions& options, int act, int param)
    : options_(options), act_(act), param_(param) {}

std::uint64_t Graph::Numel(const Shape& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n) ||
        n > kMaxTensorBytes) {
      return kMaxTensorBytes + 1;
    }
  }
  return n;
}

std::uint64_t Graph::Bytes(int t) const {
  const GTensor& x = tensors_[t];
  const std::uint64_t n = Numel(x.shape);
  if (n > kMaxTensorBytes / static_cast<std::uint64_t>(x.elem)) return kMaxTensorBytes + 1;
  return n * static_cast<std::uint64_t>(x.elem);
}

std::string Graph::UniqueId(absl::string_view hint) {
  int& n = id_counts_[hint];
  ++n;
  if (n == 1) return std::string(hint);
  // "x.2", unless a tensor was itself named that.
  for (;;) {
    std::string id = absl::StrCat(hint, ".", n);
    if (!id_counts_.contains(id)) {
      id_counts_[id] = 1;
      return id;
    }
    ++n;
  }
}

int Graph::NewTensor(absl::string_view hint, Shape shape, int elem, int alias_of) {
  GTensor t;
  t.id = UniqueId(hint);
  t.shape = std::move(shape);
  t.elem = elem;
  t.alias_of = alias_of;
  tensors_.push_back(std::move(t));
  const int index = static_cast<int>(tensors_.size()) - 1;
  if (Bytes(index) > kMaxTensorBytes && error_.ok()) {
    error_ = absl::InvalidArgumentError(absl::StrFormat(
        "tensor '%s' would exceed 2^50 bytes: the model is too large", tensors_[index].id));
  }
  return index;
}

int Graph::Input(absl::string_view name, Shape shape, int elem) {
  const int t = NewTensor(name, std::move(shape), elem, -1);
  tensors_[t].constant = true;
  return t;
}

int Graph::Param(absl::string_view name, Shape shape) {
  const int t = NewTensor(name, std::move(shape), param_, -1);
  tensors_[t].constant = true;
  tensors_[t].requires_grad = true;
  params_.push_back(t);
  param_elements_ += Numel(tensors_[t].shape);
  return t;
}

void Graph::Fail(std::string message) {
  if (error_.ok()) error_ = absl::InternalError(std::move(message));
}

int Graph::AddNode(GNode node) {
  const int n = static_cast<int>(nodes_.size());
  bool rg = false;
  for (int t : node.inputs) rg = rg || tensors_[t].requires_grad;
  node.recorded = rg && static_cast<bool>(node.backward);
  if (!node.recorded) {
    node.saved.clear();
    node.backward = nullptr;
  }
  for (int t : node.inputs) tensors_[t].last_use = n;
  for (std::size_t i = 0; i < node.outputs.size(); ++i) {
    GTensor& out = tensors_[node.outputs[i]];
    out.producer = n;
    out.requires_grad = node.recorded && (i < node.differentiable_outputs);
  }
  // Saving a constant keeps nothing alive: constants stay anyway.
  for (int t : node.saved) {
    if (!tensors_[t].constant) ++tensors_[t].saved_by;
  }
  forward_flops_ += node.flops;
  nodes_.push_back(std::move(node));
  return n;
}

int Graph::Op(absl::string_view op, std::vector<int> inputs, absl::string_view name, Shape shape,
              int elem, double flops, std::vector<int> saved, BackwardFn backward) {
  GNode node;
  node.op = std::string(op);
  node.inputs = std::move(inputs);
  const int out = NewTensor(name, std::move(shape), elem, -1);
  node.outputs = {out};
  node.saved = std::move(saved);
  node.flops = flops;
  node.backward = std::move(backward);
  AddNode(std::move(node));
  return out;
}

int Graph::ViewOp(absl::string_view op, int x, absl::string_view name, Shape shape,
                  BackwardFn backward) {
  if (Numel(shape) > Numel(tensors_[x].shape) && op != "expand") {
    Fail(absl::StrFormat("view '%s' of '%s' is larger than its source", name, tensors_[x].id));
  }
  GNode node;
  node.op = std::string(op);
  node.view = true;
  node.inputs = {x};
  node.outputs = {NewTensor(name, std::move(shape), tensors_[x].elem, x)};
  node.backward = std::move(backward);
  AddNode(std::move(node));
  return nodes_.back().outputs[0];
}

// --- Graph: emission ---------------------------------------------------------

std::int64_t Graph::CostNs(double flops, double moved) const {
  const double ns =
      std::max({static_cast<double>(options_.launch_ns), std::ceil(flops / (options_.tflops * 1e3)),
                std::ceil(moved / options_.hbm_gbps)});
  return ns >= 9e18 ? static_cast<std::int64_t>(9e18) : static_cast<std::int64_t>(ns);
}

bool Graph::Releasable(int t) const {
  const GTensor& x = tensors_[t];
  return !x.constant && !x.keep && !x.released && x.saved_by == 0;
}

void Graph::Release(int t) {
  if (tensors_[t].released) {
    Fail(absl::StrFormat("'%s' released twice", tensors_[t].id));
    return;
  }
  tensors_[t].released = true;
  writer_.Release(tensors_[t].id);
}

double Graph::Moved(const std::vector<int>& inputs, const std::vector<int>& outputs) const {
  double moved = 0;
  std::vector<int> seen;
  for (int t : inputs) {
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    moved += static_cast<double>(Bytes(t));
  }
  for (int t : outputs) moved += static_cast<double>(Bytes(t));
  return moved;
}

void Graph::WriteCall(absl::string_view op, const std::vector<int>& inputs,
                      const std::vector<int>& outputs, bool view, double flops, double moved) {
  std::vector<absl::string_view> ins;
  ins.reserve(inputs.size());
  for (int t : inputs) ins.push_back(tensors_[t].id);
  std::vector<Writer::Out> outs;
  outs.reserve(outputs.size());
  for (int t : outputs) {
    const GTensor& x = tensors_[t];
    if (x.alias_of >= 0) {
      outs.push_back({x.id, 0, tensors_[x.alias_of].id});
    } else {
      outs.push_back({x.id, Bytes(t), {}});
    }
  }
  if (moved < 0) moved = Moved(inputs, outputs);
  writer_.Call(op, ins, outs, view ? 0 : CostNs(flops, moved));
}

int Graph::Emit(absl::string_view op, std::vector<int> inputs, absl::string_view hint, Shape shape,
                int elem, double flops, double moved) {
  std::vector<int> outs =
      EmitMulti(op, std::move(inputs), {{std::string(hint), std::move(shape), elem}}, flops, moved);
  return outs[0];
}

std::vector<int> Graph::EmitMulti(absl::string_view op, std::vector<int> inputs,
                                  std::vector<OutDef> outputs, double flops, double moved) {
  std::vector<int> outs;
  outs.reserve(outputs.size());
  for (OutDef& o : outputs) {
    const int t = NewTensor(o.hint, std::move(o.shape), o.elem, -1);
    temps_.push_back(t);
    outs.push_back(t);
  }
  WriteCall(op, inputs, outs, /*view=*/false, flops, moved);
  backward_flops_ += flops;
  return outs;
}

int Graph::EmitView(absl::string_view op, int src, absl::string_view hint, Shape shape) {
  const int t = NewTensor(hint, std::move(shape), tensors_[src].elem, src);
  temps_.push_back(t);
  WriteCall(op, {src}, {t}, /*view=*/true, 0, 0);
  return t;
}

std::vector<int> Graph::EmitViews(absl::string_view op, int src, std::vector<OutDef> outputs) {
  std::vector<int> outs;
  for (OutDef& o : outputs) {
    const int t = NewTensor(o.hint, std::move(o.shape), tensors_[src].elem, src);
    temps_.push_back(t);
    outs.push_back(t);
  }
  WriteCall(op, {src}, outs, /*view=*/true, 0, 0);
  return outs;
}

void Graph::Hold(int g) { ++tensors_[g].holders; }

void Graph::Drop(int g) {
  if (--tensors_[g].holders == 0) Release(g);
}

void Graph::Give(int t, int g) {
  if (!tensors_[t].requires_grad) return;
  int& slot = grad_[t];
  if (slot < 0) {
    slot = g;
    Hold(g);
    return;
  }
  const int old = slot;
  const GTensor& x = tensors_[t];
  const int sum = Emit("add", {old, g}, absl::StrCat(x.id, ".grad"), x.shape, tensors_[g].elem, 0);
  slot = sum;
  Hold(sum);
  Drop(old);
}

int Graph::Grad(int t) const { return grad_[t]; }

absl::StatusOr<std::string> Graph::Finish(int loss, int steps) {
  if (!error_.ok()) return error_;
  tensors_[loss].keep = true;
  grad_.assign(tensors_.size(), -1);

  // Constants first (parameters in the order the model made them, inputs
  // among them), then the forward.
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    if (tensors_[t].constant) writer_.Constant(tensors_[t].id, Bytes(static_cast<int>(t)));
  }
  writer_.Phase("forward");
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    const GNode& node = nodes_[n];
    WriteCall(node.op, node.inputs, node.outputs, node.view, node.flops, node.moved);
    std::vector<int> done;
    for (int t : node.inputs) {
      if (tensors_[t].last_use == static_cast<int>(n) && Releasable(t) &&
          std::find(done.begin(), done.end(), t) == done.end()) {
        done.push_back(t);
        Release(t);
      }
    }
    for (int t : node.outputs) {
      if (tensors_[t].last_use < 0 && Releasable(t)) Release(t);
    }
  }
  writer_.Use({tensors_[loss].id});

  writer_.Phase("backward");
  const int seed = Emit("ones_like", {loss}, "loss.grad", {}, 4, 0);
  temps_.clear();
  grad_.resize(tensors_.size(), -1);
  grad_[loss] = seed;
  Hold(seed);
  for (int n = static_cast<int>(nodes_.size()) - 1; n >= 0; --n) {
    GNode& node = nodes_[n];
    if (!node.recorded) continue;
    bool any = false;
    for (int t : node.outputs) any = any || grad_[t] >= 0;
    temps_.clear();
    if (any) {
      grad_.resize(tensors_.size(), -1);  // room for what the backward makes
      node.backward(*this, node);
    }
    // What the backward made and handed to no one, then the gradients it
    // consumed, then what the op saved.
    for (int t : temps_) {
      if (tensors_[t].holders == 0 && !tensors_[t].released) Release(t);
    }
    temps_.clear();
    for (int t : node.outputs) {
      if (grad_[t] >= 0) {
        const int g = grad_[t];
        grad_[t] = -1;
        Drop(g);
      }
    }
    for (int t : node.saved) {
      if (tensors_[t].constant) continue;
      if (--tensors_[t].saved_by == 0 && !tensors_[t].keep && !tensors_[t].released) Release(t);
    }
    for (int t : node.outputs) {
      if (tensors_[t].keep) Release(t);
    }
  }

  writer_.Phase("optimizer");
  std::vector<absl::string_view> grads;
  for (int p : params_) {
    if (grad_[p] >= 0) grads.push_back(tensors_[grad_[p]].id);
  }
  if (!grads.empty()) writer_.Use(grads);
  for (int p : params_) {
    if (grad_[p] >= 0) {
      const int g = grad_[p];
      grad_[p] = -1;
      Drop(g);
    }
  }
  if (!error_.ok()) return error_;
  return writer_.Take(steps);
}

}  // namespace remat::model_gen
