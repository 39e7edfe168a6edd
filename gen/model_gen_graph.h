// Internals of the model generators (gen/model_gen.h): spec keys, the JSON
// Lines writer, and the graph a model's forward is built as, with the ops'
// shapes, FLOPs, saved tensors and backward rules. Only model_gen*.cc use it.
#ifndef REMAT_GEN_MODEL_GEN_GRAPH_H_
#define REMAT_GEN_MODEL_GEN_GRAPH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gen/model_gen.h"

namespace remat::model_gen {

// --- Specs ----------------------------------------------------------------

struct KeyDef {
  absl::string_view key;
  absl::string_view def;  // the default, as text
  absl::string_view doc;
};

// The key=value pairs of one model's spec. Parse() rejects malformed pairs and
// keys the model does not declare; the typed readers take the given text or the
// default, and keep the first bad value's error for error().
class Spec {
 public:
  Spec(std::string model, const std::vector<KeyDef>* keys);

  absl::Status Parse(absl::string_view pairs);  // "k=v,k=v" (may be empty)

  std::int64_t Int(absl::string_view key, std::int64_t min, std::int64_t max);
  std::uint64_t Bytes(absl::string_view key, std::uint64_t min, std::uint64_t max);
  std::string Choice(absl::string_view key, const std::vector<absl::string_view>& choices);
  // Bytes per element of bf16 / fp16 / fp32; "dtype" means `same_as` (when > 0).
  int Dtype(absl::string_view key, int same_as = 0);
  // A constraint between keys failed: "<model>: <message>".
  void Fail(std::string message);

  const absl::Status& error() const { return error_; }
  std::string Canonical() const;

 private:
  std::string Raw(absl::string_view key) const;

  std::string model_;
  const std::vector<KeyDef>* keys_;
  std::map<std::string, std::string> given_;
  absl::Status error_;
};

// --- Writer ---------------------------------------------------------------

// Records in the format of trace/op_trace.h, one a line, with the keys in the
// order scripts/make_op_traces.py writes them. Ids and names are the
// generators' own (no characters JSON would escape). Constants come first;
// Take(steps) repeats everything after them `steps` times, each repeat with
// its own names for the tensors that are not constants.
class Writer {
 public:
  struct Out {
    absl::string_view id;
    std::uint64_t bytes = 0;
    absl::string_view alias_of;  // non-empty: a view
  };

  void Constant(absl::string_view id, std::uint64_t bytes);
  void Call(absl::string_view name, const std::vector<absl::string_view>& inputs,
            const std::vector<Out>& outputs, std::int64_t cost_ns);
  void Use(const std::vector<absl::string_view>& ids);
  void Release(absl::string_view id);
  void Phase(absl::string_view name);

  // Records written, or after Take, in the text it gave.
  std::uint64_t records() const { return records_; }
  // The text; with steps > 1 the records after the constants repeat, and
  // repeat k (from 1) names each non-constant tensor "s<k>/<id>". A constant
  // must not be released then (its second step could not read it).
  absl::StatusOr<std::string> Take(int steps = 1);

 private:
  void Begin(absl::string_view op);
  void Id(absl::string_view id);  // a non-constant's id goes after a marker byte

  std::string text_;
  std::uint64_t records_ = 0;
  absl::flat_hash_set<std::string> constants_;
  std::size_t body_start_ = std::string::npos;  // where the first non-constant record begins
  std::uint64_t body_records_ = 0;
  bool releases_constant_ = false;
  bool constant_after_body_ = false;
};

// --- Graph ----------------------------------------------------------------

using Shape = absl::InlinedVector<std::int64_t, 5>;

struct GTensor {
  std::string id;
  Shape shape;
  int elem = 2;       // bytes per element
  int alias_of = -1;  // a view of this tensor
  bool constant = false;
  bool requires_grad = false;
  bool keep = false;  // the loss: live until its op's backward
  bool released = false;
  int producer = -1;  // forward node
  int last_use = -1;  // the last forward node reading it
  int saved_by = 0;   // recorded nodes saving it whose backward has not run
  int holders = 0;    // backward: gradient slots holding it
};

class Graph;
struct GNode;
using BackwardFn = std::function<void(Graph&, const GNode&)>;

struct GNode {
  std::string op;
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::size_t differentiable_outputs =
      1;                   // the first ones; the rest (masks, stats) get no gradient
  std::vector<int> saved;  // what autograd keeps for the backward
  double flops = 0;        // matmul/conv FLOPs
  double moved = -1;       // bytes read and written; < 0: inputs + outputs
  bool view = false;       // outputs alias inputs[0]
  bool recorded = false;   // some input requires grad
  BackwardFn backward;
};

// One model's step. Build the forward with the ops (model_gen_ops.cc), then
// Finish(loss) writes the trace.
class Graph {
 public:
  Graph(const ModelGenOptions& options, int act_elem, int param_elem);

  int act() const { return act_; }
  int param() const { return param_; }
  const GTensor& T(int t) const { return tensors_[t]; }
  const Shape& S(int t) const { return tensors_[t].shape; }
  std::uint64_t param_elements() const { return param_elements_; }
  double forward_flops() const { return forward_flops_; }
  double total_flops() const { return forward_flops_ + backward_flops_; }
  std::uint64_t records() const { return writer_.records(); }
  static std::uint64_t Numel(const Shape& shape);

  // Leaves: constants. Inputs need no gradient; parameters do (param dtype).
  int Input(absl::string_view name, Shape shape, int elem);
  int Param(absl::string_view name, Shape shape);

  // --- Ops (model_gen_ops.cc). `name` is the output's id (made unique). ---
  int Linear(absl::string_view name, int x, int w, int b = -1);    // w: [out, in]
  int Matmul(absl::string_view name, int a, int b, bool trans_b);  // [..., m, k] x [..., k, n]
  int Conv2d(absl::string_view name, int x, int w, int stride, int pad, int b = -1);
  int ConvTranspose2d(absl::string_view name, int x, int w,
                      int b = -1);  // w: [in, out, k, k], stride k
  int BatchNorm(absl::string_view name, int x, int gamma, int beta);
  int LayerNorm(absl::string_view name, int x, int gamma, int beta);
  int Relu(absl::string_view name, int x);
  int Gelu(absl::string_view name, int x);
  int Add(absl::string_view name, int a, int b);  // b may broadcast over a's leading dims
  int Softmax(absl::string_view name, int x, int mask = -1);  // scaled, masked when mask >= 0
  int Dropout(absl::string_view name, int x);
  int MaxPool2d(absl::string_view name, int x, int kernel, int stride, int pad);
  int GlobalAvgPool(absl::string_view name, int x);  // [N, C, H, W] -> [N, C]
  int Embedding(absl::string_view name, int w, int ids);
  int CrossEntropy(absl::string_view name, int logits, int targets, int class_dim);
  int FlashAttention(absl::string_view name, int q, int k, int v);  // [b, s, a, d]
  int Reshape(absl::string_view name, int x, Shape shape);
  int Transpose(absl::string_view name, int x, int d0, int d1);
  std::vector<int> Split(absl::string_view name, int x, int dim, int parts);
  int Select(absl::string_view name, int x, int dim);  // index 0; drops the dim
  int Expand(absl::string_view name, int x, Shape shape);
  int Cat(absl::string_view name, const std::vector<int>& xs, int dim);
  int Contiguous(absl::string_view name, int x);

  // The trace: constants, forward, backward from `loss`, optimizer.
  absl::StatusOr<std::string> Finish(int loss, int steps = 1);

  // --- For ops' backward rules ---
  int Grad(int t) const;  // the gradient flowing into forward tensor t, or -1
  // Writes a call making new tensors (released after the op's backward unless
  // given to a tensor with Give()).
  struct OutDef {
    std::string hint;
    Shape shape;
    int elem;
  };
  int Emit(absl::string_view op, std::vector<int> inputs, absl::string_view hint, Shape shape,
           int elem, double flops, double moved = -1);
  std::vector<int> EmitMulti(absl::string_view op, std::vector<int> inputs,
                             std::vector<OutDef> outputs, double flops, double moved = -1);
  int EmitView(absl::string_view op, int src, absl::string_view hint, Shape shape);
  std::vector<int> EmitViews(absl::string_view op, int src, std::vector<OutDef> outputs);
  // Adds `g` to forward tensor t's gradient (summing with one already there);
  // nothing when t needs no gradient.
  void Give(int t, int g);
  // "<id>.grad": the hint for a gradient of t.
  std::string GradName(int t) const { return tensors_[t].id + ".grad"; }

 private:
  int NewTensor(absl::string_view hint, Shape shape, int elem, int alias_of);
  std::string UniqueId(absl::string_view hint);
  std::uint64_t Bytes(int t) const;
  int AddNode(GNode node);
  int Op(absl::string_view op, std::vector<int> inputs, absl::string_view name, Shape shape,
         int elem, double flops, std::vector<int> saved, BackwardFn backward);
  int ViewOp(absl::string_view op, int x, absl::string_view name, Shape shape, BackwardFn backward);
  void Fail(std::string message);  // a generator bug: Internal

  std::int64_t CostNs(double flops, double moved) const;
  double Moved(const std::vector<int>& inputs, const std::vector<int>& outputs) const;
  void WriteCall(absl::string_view op, const std::vector<int>& inputs,
                 const std::vector<int>& outputs, bool view, double flops, double moved);
  bool Releasable(int t) const;
  void Release(int t);
  void Hold(int g);
  void Drop(int g);

  ModelGenOptions options_;
  int act_;
  int param_;
  std::vector<GTensor> tensors_;
  std::vector<GNode> nodes_;
  std::vector<int> params_;
  absl::flat_hash_map<std::string, int> id_counts_;
  std::vector<int> grad_;   // forward tensor -> its gradient so far (-1: none)
  std::vector<int> temps_;  // tensors the running backward made
  std::uint64_t param_elements_ = 0;
  double forward_flops_ = 0;
  double backward_flops_ = 0;
  absl::Status error_;
  Writer writer_;
};

}  // namespace remat::model_gen

#endif  // REMAT_GEN_MODEL_GEN_GRAPH_H_
