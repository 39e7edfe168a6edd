// The step: recording, saving, bringing back. See step.h.
#include "step.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/TensorBody.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/node.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <chrono>
#include <set>
#include <cstdlib>
#include <mutex>
#include <unordered_set>

namespace remat_torch {

bool (*g_python_body)(const c10::OperatorHandle& op) = nullptr;

namespace {

// Calls whose outputs do not read the arguments they write in training mode
// (batch norm's running statistics): replayed onto scratch copies.
bool WritesUnread(const std::string& name) {
  static const std::unordered_set<std::string> names = {
      "aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::cudnn_batch_norm",
      "aten::miopen_batch_norm", "aten::_batch_norm_with_update",
      "aten::_native_batch_norm_legit_functional"};
  return names.count(name) != 0;
}

bool BuiltinNamespace(const std::string& name) {
  for (const char* ns : {"aten::", "prims::", "rngprims::", "prim::"}) {
    if (name.rfind(ns, 0) == 0) return true;
  }
  return false;
}

bool Collective(const std::string& name) {
  for (const char* ns : {"c10d::", "_c10d_functional::", "c10d_functional::",
                         "_c10d_functional_autograd::", "_dtensor::"}) {
    if (name.rfind(ns, 0) == 0) return true;
  }
  return false;
}

int64_t VersionOf(const at::Tensor& t) {
  if (t.is_inference()) return -1;
  return static_cast<int64_t>(t._version());
}

// The strided tensors among a call's boxed values, with where each sits.
template <typename F>
void ForEachTensor(const std::vector<c10::IValue>& values, F&& f) {
  for (size_t a = 0; a < values.size(); ++a) {
    const c10::IValue& v = values[a];
    if (v.isTensor()) {
      f(v.toTensor(), static_cast<int32_t>(a), -1);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        f(static_cast<at::Tensor>(list.get(k)), static_cast<int32_t>(a),
          static_cast<int32_t>(k));
      }
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t k = 0; k < list.size(); ++k) {
        c10::IValue item = list.get(k);
        if (item.isTensor()) {
          f(item.toTensor(), static_cast<int32_t>(a), static_cast<int32_t>(k));
        }
      }
    }
  }
}

// Puts generators back as they were, the last taken first (a generator
// named twice gets its first state back).
void Restore(std::vector<std::pair<at::Generator, at::Tensor>>& live) {
  for (auto it = live.rbegin(); it != live.rend(); ++it) {
    std::lock_guard<std::mutex> lock(it->first.mutex());
    it->first.set_state(it->second);
  }
}

bool HasStorage(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() &&
         !t.is_meta() && t.storage().unsafeGetStorageImpl() != nullptr;
}

}  // namespace

const OpInfo& SharedInfoOf(const at::RecordFunction& fn);
FlopsKind FlopsKindOf(const std::string& name);

std::string OpName(const c10::OperatorHandle& op) {
  // As Python prints an operator: aten.add_.Tensor, aten.tanh.default.
  std::string name = op.schema().name();
  auto colons = name.find("::");
  if (colons != std::string::npos) name.replace(colons, 2, ".");
  const std::string& overload = op.schema().overload_name();
  return name + "." + (overload.empty() ? std::string("default") : overload);
}

at::Tensor ViewOf(const c10::Storage& storage, at::ScalarType dtype, c10::IntArrayRef sizes,
                  c10::IntArrayRef strides, int64_t offset) {
  c10::Device device = storage.device();
  c10::DispatchKeySet keys(c10::computeDispatchKey(dtype, at::kStrided, device));
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), keys,
                                                     caffe2::TypeMeta::fromScalarType(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

FlopsKind FlopsKindOf(const std::string& name) {
  if (name == "aten::mm") return FlopsKind::kMm;
  if (name == "aten::addmm") return FlopsKind::kAddmm;
  if (name == "aten::bmm") return FlopsKind::kBmm;
  if (name == "aten::baddbmm") return FlopsKind::kBaddbmm;
  if (name == "aten::convolution" || name == "aten::_convolution") {
    return FlopsKind::kConvolution;
  }
  for (const char* attention :
       {"aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "aten::_efficient_attention_forward", "aten::_flash_attention_forward"}) {
    if (name == attention) return FlopsKind::kAttention;
  }
  return FlopsKind::kNone;
}

namespace {

// The `k`-th tensor argument, or an undefined tensor.
at::Tensor TensorArg(const std::vector<c10::IValue>& values, size_t k) {
  if (k < values.size() && values[k].isTensor()) return values[k].toTensor();
  return at::Tensor();
}

double Flops(const OpInfo& info, const std::vector<c10::IValue>& in,
             const std::vector<c10::IValue>& out) {
  auto dims = [](const at::Tensor& t, int64_t want) { return t.defined() && t.dim() == want; };
  switch (info.flops) {
    case FlopsKind::kNone:
      return 0;
    case FlopsKind::kMm:
    case FlopsKind::kAddmm: {
      const size_t first = info.flops == FlopsKind::kMm ? 0 : 1;
      at::Tensor a = TensorArg(in, first), b = TensorArg(in, first + 1);
      if (!dims(a, 2) || !dims(b, 2)) return 0;
      return 2.0 * a.size(0) * a.size(1) * b.size(1);
    }
    case FlopsKind::kBmm:
    case FlopsKind::kBaddbmm: {
      const size_t first = info.flops == FlopsKind::kBmm ? 0 : 1;
      at::Tensor a = TensorArg(in, first), b = TensorArg(in, first + 1);
      if (!dims(a, 3) || !dims(b, 3)) return 0;
      return 2.0 * a.size(0) * a.size(1) * a.size(2) * b.size(2);
    }
    case FlopsKind::kConvolution: {
      // (input, weight, bias, stride, padding, dilation, transposed, ...):
      // each output (input, transposed) element takes a multiply-add per
      // weight element of its group.
      at::Tensor x = TensorArg(in, 0), w = TensorArg(in, 1), y = TensorArg(out, 0);
      if (!x.defined() || !w.defined() || !y.defined() || w.dim() < 3) return 0;
      const bool transposed = in.size() > 6 && in[6].isBool() && in[6].toBool();
      double per = static_cast<double>(w.size(1));
      for (int64_t d = 2; d < w.dim(); ++d) per *= static_cast<double>(w.size(d));
      return 2.0 * per * static_cast<double>(transposed ? x.numel() : y.numel());
    }
    case FlopsKind::kAttention: {
      // q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev): Q K^T, then its
      // softmax times V. (The flash kernels' entry points take (B, L, H, E).)
      at::Tensor q = TensorArg(in, 0), k = TensorArg(in, 1), v = TensorArg(in, 2);
      if (!dims(q, 4) || !dims(k, 4) || !dims(v, 4)) return 0;
      const bool bthe = info.op && info.op->schema().name().find("_forward") != std::string::npos;
      const int64_t l = bthe ? q.size(1) : q.size(2), s = bthe ? k.size(1) : k.size(2);
      const double bh = static_cast<double>(q.size(0)) * (bthe ? q.size(2) : q.size(1));
      return 2.0 * bh * l * s * (q.size(3) + v.size(3));
    }
  }
  return 0;
}

double BytesMoved(const std::vector<c10::IValue>& values) {
  double bytes = 0;
  ForEachTensor(values, [&](const at::Tensor& t, int32_t, int32_t) {
    if (t.defined()) bytes += static_cast<double>(t.numel()) * t.element_size();
  });
  return bytes;
}

}  // namespace

int64_t ModelCostNs(const OpInfo& info, const std::vector<c10::IValue>& inputs,
                    const std::vector<c10::IValue>& outputs, const CostRates& rates) {
  const double flops_ns = std::ceil(Flops(info, inputs, outputs) / (rates.tflops * 1e3));
  const double bytes_ns = std::ceil((BytesMoved(inputs) + BytesMoved(outputs)) / rates.hbm_gbps);
  const double ns = std::max({static_cast<double>(rates.launch_ns), flops_ns, bytes_ns});
  return ns >= 9e18 ? int64_t{9000000000000000000} : static_cast<int64_t>(ns);
}

const OpInfo& InfoOf(const at::RecordFunction& fn) {
  // Keyed by the schema's name (one string per operator overload, owned by
  // the dispatcher for the process's life); each thread keeps its own
  // index in front of the shared table.
  thread_local ska::flat_hash_map<const char*, const OpInfo*> mine;
  auto hit = mine.find(fn.name());
  if (hit != mine.end()) return *hit->second;
  const OpInfo& info = SharedInfoOf(fn);
  mine.emplace(fn.name(), &info);
  return info;
}

const OpInfo& SharedInfoOf(const at::RecordFunction& fn) {
  static std::mutex mu;
  static std::unordered_map<const char*, std::unique_ptr<OpInfo>> infos;
  const char* key = fn.name();
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos.find(key);
  if (it != infos.end()) return *it->second;
  auto info = std::make_unique<OpInfo>();
  std::optional<c10::OperatorName> name = fn.operator_name();
  if (name) {
    info->op = c10::Dispatcher::singleton().findOp(*name);
  }
  if (info->op) {
    const c10::FunctionSchema& schema = info->op->schema();
    const std::string& full = schema.name();
    bool custom = !BuiltinNamespace(full);
    const c10::OperatorHandle& op = *info->op;
    info->composite = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
                      !op.hasKernelForDispatchKey(c10::DispatchKey::Autograd) &&
                      !op.hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU) &&
                      !op.hasKernelForDispatchKey(c10::DispatchKey::AutogradCUDA);
    info->random = info->op->hasTag(at::Tag::nondeterministic_seeded);
    info->nondeterministic = info->op->hasTag(at::Tag::nondeterministic_bitwise);
    info->writes_unread = WritesUnread(full);
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto* alias = schema.arguments()[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        info->written_args.push_back(static_cast<int32_t>(i));
      }
    }
    if (info->writes_unread) {
      info->written_args.push_back(3);
      info->written_args.push_back(4);
    }
    if (full == "aten::set_data") {
      // `t.data = u` moves t's TensorImpl onto u's bytes: it writes no
      // bytes (what autograd saved of t stays as it is).
      info->written_args.clear();
      info->is_view = true;
    }
    if (full == "aten::_has_compatible_shallow_copy_type") {
      // What `t.data = u` asks first, with t: RecordFunction does not see
      // aten::set_data itself (an unobserved operator), this it does.
      info->is_view = true;
      info->moves = true;
    }
    info->writes = !info->written_args.empty();
    info->flops = FlopsKindOf(full);
    for (const auto& ret : schema.returns()) {
      const auto* alias = ret.alias_info();
      if (alias != nullptr && !alias->isWrite()) info->is_view = true;
    }
    if (Collective(full)) {
      info->why_not = full + " is a collective (a replay on one rank alone would hang)";
    } else if (info->op->hasTag(at::Tag::data_dependent_output) ||
               info->op->hasTag(at::Tag::dynamic_output_shape)) {
      info->why_not = full + " has a data-dependent output";
    }
    if (custom) {
      // An operator outside PyTorch's own (a torch.library custom op) may
      // draw random numbers untagged: it runs, and is replayed, under the
      // states of the generators it can reach; where its kernel is Python,
      // numpy's and Python's too.
      info->random = true;
      info->python_body = g_python_body != nullptr && g_python_body(*info->op);
    }
  } else {
    info->why_not = std::string(key) + " has no dispatcher entry";
  }
  return *infos.emplace(key, std::move(info)).first->second;
}

Step::Step(std::shared_ptr<Session> session, StepOptions options)
    : session_(std::move(session)), runtime_(session_->runtime()), options_(options) {
  start_stats = session_->Stats();
  const Session::Sizes& last = session_->last_sizes;
  calls_.reserve(std::max<size_t>(64, last.calls + last.calls / 8));
  storages_.reserve(std::max<size_t>(64, last.storages + last.storages / 8));
  by_impl_.reserve(std::max<size_t>(64, last.storages + last.storages / 8));
  by_id_.reserve(last.registered + last.registered / 8);
  groups_.reserve(last.registered + last.registered / 8);
  registered_.reserve(last.registered + last.registered / 8);
  const char* verify = std::getenv("REMAT_NATIVE_VERIFY");
  verify_ = verify != nullptr && std::string(verify) == "1";
}

void Step::Verify(int32_t index, const at::Tensor& t) {
  auto it = verify_copies_.find(index);
  if (it == verify_copies_.end()) return;
  const Storage& s = storages_[index];
  const at::Tensor& old = it->second.first;
  int64_t n = std::min<int64_t>(old.numel(), t.storage().nbytes() / old.element_size());
  bool same = false;
  if (static_cast<int64_t>(t.storage().nbytes()) >= old.numel() * old.element_size()) {
    InternalScope mine(this);
    at::Tensor now = ViewOf(t.storage(), old.scalar_type(), old.sizes(), old.strides(),
                            old.storage_offset());
    same = at::equal(old, now);
  }
  if (!same) {
    std::string chain = calls_[s.producer].op.schema().name();
    for (int64_t w = 0; w < s.reg_version && w < static_cast<int64_t>(s.writers.size()); ++w) {
      chain += " > " + calls_[s.writers[w]].op.schema().name();
    }
    fprintf(stderr,
            "remat verify: storage %d (version %lld, held %lld, n %lld) came back different: "
            "%s\n",
            index, (long long)s.reg_version, (long long)it->second.second, (long long)n,
            chain.c_str());
  }
  verify_copies_.erase(it);
}

Step::~Step() {
  if (!closed_) {
    try {
      Close();
    } catch (...) {
    }
  }
  if (session_->step() == this) session_->set_step(nullptr);
}

std::vector<int32_t> Step::WrittenArgs(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs) {
  if (!info.writes_unread || inputs.size() <= 5 || !inputs[5].isBool() || inputs[5].toBool()) {
    return info.written_args;
  }
  // Batch norm in evaluation: its running statistics are read, not written.
  std::vector<int32_t> written;
  for (int32_t a : info.written_args) {
    if (a != 3 && a != 4) written.push_back(a);
  }
  return written;
}

bool Step::WantsCall(const at::RecordFunction& fn, bool outermost) const {
  (void)fn;
  if (closed_ || internal) return false;
  // In a backward: not the forward's calls.
  if (torch::autograd::get_current_graph_task_id() != -1) return false;
  // Below autograd: a kernel's own calls, not the forward's; but under
  // torch.inference_mode(), which leaves autograd out altogether, a call no
  // recorded call runs is the program's own (a write there must be seen).
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutogradFunctionality)) {
    return outermost && c10::InferenceMode::is_enabled();
  }
  return true;
}

int32_t Step::StorageOf(c10::StorageImpl* impl) const {
  auto it = by_impl_.find(impl);
  return it == by_impl_.end() ? -1 : it->second;
}

int32_t Step::NewStorage(const c10::Storage& st, bool leaf) {
  Storage s{c10::weak_intrusive_ptr<c10::StorageImpl>(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(st.unsafeGetStorageImpl()))};
  s.leaf = leaf;
  s.nbytes = static_cast<int64_t>(st.nbytes());
  int32_t index = static_cast<int32_t>(storages_.size());
  storages_.push_back(std::move(s));
  by_impl_.emplace(st.unsafeGetStorageImpl(), index);
  return index;
}

void Step::Record(const OpInfo& info, const c10::OperatorHandle& op,
                  std::vector<c10::IValue>&& inputs, const std::vector<c10::IValue>& outputs,
                  std::optional<RngState> rng, bool grad, int64_t cost_ns) {
  if (!info.writes && (info.is_view || c10::InferenceMode::is_enabled())) return;
  if (!info.writes) {
    // Writes nothing: recorded only where it made a storage (many calls
    // that make none are views under another name).
    bool made = false;
    ForEachTensor(outputs, [&](const at::Tensor& t, int32_t, int32_t) {
      if (!made && HasStorage(t) && StorageOf(t.storage().unsafeGetStorageImpl()) < 0) {
        made = true;
      }
    });
    if (!made) return;
  }
  int32_t index = static_cast<int32_t>(calls_.size());
  counts.recorded_calls += 1;
  calls_.emplace_back(op);
  Call& call = calls_.back();
  call.grad = grad;
  call.cost_ns = cost_ns;
  call.rng = std::move(rng);
  call.why_not = info.why_not;
  // As Python prints it, for the reasons a call cannot be replayed (made
  // only for those: a call's name is longer than a string holds inline).
  auto name = [&op] { return OpName(op); };
  bool on_cuda = false;
  call.refs.reserve(inputs.size());
  call.slots.reserve(inputs.size());
  ForEachTensor(inputs, [&](const at::Tensor& t, int32_t arg, int32_t item) {
    if (!HasStorage(t)) return;  // (undefined, sparse, ...: kept in the arguments as is)
    on_cuda = on_cuda || t.is_cuda();
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    int32_t s = StorageOf(impl);
    if (s < 0) s = NewStorage(t.storage(), /*leaf=*/true);
    Ref r;
    r.storage = s;
    r.sizes.assign(t.sizes().begin(), t.sizes().end());
    r.strides.assign(t.strides().begin(), t.strides().end());
    r.offset = t.storage_offset();
    r.dtype = t.scalar_type();
    const Storage& st = storages_[s];
    if (st.leaf) {
      r.leaf = t;
      r.version = VersionOf(t);
      r.storage_writes = st.version;
    } else {
      r.version = st.version;
    }
    if (t.is_conj() || t.is_neg() || (!st.leaf && r.dtype != st.dtype)) {
      if (call.why_not.empty()) {
        call.why_not = name() + " reads a view a replay would not rebuild (conj, neg or dtype)";
      }
    }
    call.refs.push_back(std::move(r));
    call.slots.push_back({arg, item});
  });
  for (int32_t arg : WrittenArgs(info, inputs)) {
    for (size_t i = 0; i < call.slots.size(); ++i) {
      if (call.slots[i].arg == arg) call.written.push_back(static_cast<int32_t>(i));
    }
  }
  if (call.why_not.empty() && !options_.allow_nondeterministic && info.nondeterministic &&
      on_cuda) {
    call.why_not = name() + " is not bitwise deterministic on CUDA";
  }
  if (call.why_not.empty() && op.schema().name() == "aten::_cudnn_rnn" && inputs.size() > 12 &&
      inputs[12].isBool() && inputs[12].toBool() && inputs[11].isDouble() &&
      inputs[11].toDouble() > 0) {
    call.why_not = name() + " draws its dropout from cuDNN's own random state";
  }
  for (int32_t i : call.written) {
    Storage& s = storages_[call.refs[i].storage];
    if (s.leaf) {
      if (!info.writes_unread && call.why_not.empty()) {
        call.why_not = name() + " writes into a tensor made before the context";
      }
      s.version += 1;  // (what read its bytes before cannot be replayed from them now)
      continue;
    }
    if (s.registered && !s.freed && !s.pinned_forever && Overlaps(s, call.refs[i])) {
      // A write into what a saved view reads: autograd reads the new bytes,
      // so the live storage stays as it is for the rest of the step.
      PinForever(call.refs[i].storage, name() + " wrote into it after it was saved");
      counts.pinned_by_write += 1;
      // The program's own tensor holds the newest bytes.
      ForEachTensor(inputs, [&](const at::Tensor& t, int32_t arg, int32_t item) {
        if (arg == call.slots[i].arg && item == call.slots[i].item) {
          storages_[call.refs[i].storage].held = t.tensor_data();
        }
      });
      storages_[call.refs[i].storage].held_version = s.version + 1;
    }
    s.writers.push_back(index);
    s.version += 1;
    if (s.held.defined() && !s.pinned_forever &&
        s.held.storage().unsafeGetStorageImpl() == s.weak._unsafe_get_target()) {
      s.held_version = s.version;  // remat holds the program's own storage
    }
  }
  // Tensors leave the recorded arguments (a recorded call must not keep an
  // activation alive); the refs say how to rebuild them.
  call.args = std::move(inputs);
  for (const Slot& slot : call.slots) {
    c10::IValue& v = call.args[slot.arg];
    if (slot.item < 0) {
      v = c10::IValue();
    } else if (v.isTensorList()) {
      auto list = v.toTensorList().copy();
      list.set(slot.item, at::Tensor());
      v = c10::IValue(std::move(list));
    } else {
      auto list = v.toList().copy();
      list.set(slot.item, c10::IValue());
      v = c10::IValue(std::move(list));
    }
  }
  int32_t j = 0;
  ForEachTensor(outputs, [&](const at::Tensor& t, int32_t, int32_t) {
    int32_t out = j++;
    if (!HasStorage(t)) return;
    if (StorageOf(t.storage().unsafeGetStorageImpl()) >= 0) return;
    int32_t s = NewStorage(t.storage(), /*leaf=*/false);
    storages_[s].producer = index;
    storages_[s].output = out;
    storages_[s].dtype = t.scalar_type();
  });
}

bool Step::Overlaps(const Storage& s, const Ref& r) {
  if (s.regions.empty()) return false;
  const int64_t item = static_cast<int64_t>(c10::elementSize(s.dtype));
  const int64_t n = s.nbytes / item;
  if (r.dtype != s.dtype || n > (int64_t{1} << 24)) return true;  // unsure: as if it did
  InternalScope mine(this);
  try {
    at::AutoDispatchBelowAutograd below;
    at::Tensor mask = at::zeros({n}, at::TensorOptions().dtype(at::kBool));
    for (const Region& g : s.regions) mask.as_strided(g.sizes, g.strides, g.offset).fill_(true);
    return mask.as_strided(r.sizes, r.strides, r.offset).any().item<bool>();
  } catch (const std::exception&) {
    return true;  // (a view beyond what it knows of the storage: unsure, as if it did)
  }
}

void Step::PinForever(int32_t index, const std::string& why) {
  Storage& s = storages_[index];
  if (s.pinned_forever || s.freed || !s.registered) return;
  s.why_pinned = why;
  {
    InternalScope mine(this);
    Acquire(index);  // (one pin, released at the step's end)
  }
  storages_[index].pinned_forever = true;
  forever_bytes_ += storages_[index].nbytes;
}

bool Step::BringsBack(const Storage& s, int64_t version) const {
  if (s.held.defined()) return s.held_version == version;
  if (s.host.defined()) return s.host_version == version;
  return true;  // dropped: a recompute brings back its registered version
}

namespace {
// FrontierOf's sets and stack, kept between its calls on a thread (it runs
// for each saved tensor, and calls nothing that could call it again):
// cleared, they keep their room, so a walk allocates nothing.
struct FrontierScratch {
  struct Item {
    int32_t s;
    int64_t version;
    bool top;
  };
  ska::flat_hash_set<int32_t> read;  // leaves its replay reads
  ska::flat_hash_set<uint64_t> seen_inputs;
  ska::flat_hash_set<int64_t> visited;
  std::vector<Item> stack;
  std::vector<int32_t> chain;
};
}  // namespace

Step::Frontier Step::FrontierOf(int32_t root, int64_t root_version) {
  Frontier f;
  thread_local FrontierScratch scratch;
  if (scratch.visited.bucket_count() > 4096) {
    scratch = FrontierScratch{};  // (clearing walks every slot: not after one long walk)
  }
  auto& [read, seen_inputs, visited, stack, chain] = scratch;
  read.clear();
  seen_inputs.clear();
  visited.clear();
  stack.assign(1, {root, root_version, true});
  while (!stack.empty()) {
    const FrontierScratch::Item it = stack.back();
    stack.pop_back();
    int64_t key = (static_cast<int64_t>(it.s) << 24) ^ it.version;
    if (!visited.insert(key).second) continue;
    const Storage& st = storages_[it.s];
    if (st.exported) {
      return {{}, 0, "its recompute reads bytes handed outside autograd (numpy, ...)", {}};
    }
    if (!it.top && st.registered && !st.freed && st.reg_version == it.version &&
        BringsBack(st, it.version)) {
      if (seen_inputs.insert(st.id).second) f.inputs.push_back(it.s);
      continue;
    }
    if (st.leaf) continue;
    chain.assign(1, st.producer);
    for (int64_t w = 0; w < it.version && w < static_cast<int64_t>(st.writers.size()); ++w) {
      chain.push_back(st.writers[w]);
    }
    for (int32_t c : chain) {
      const Call& call = calls_[c];
      if (!call.why_not.empty()) return {{}, 0, call.why_not, {}};
      f.cost += call.cost_ns;
      for (size_t i = 0; i < call.refs.size(); ++i) {
        const Ref& r = call.refs[i];
        const Storage& in = storages_[r.storage];
        if (in.leaf) {
          bool written = false;
          for (int32_t w : call.written) written = written || w == static_cast<int32_t>(i);
          if (written) continue;  // replayed onto a scratch copy
          if ((r.version >= 0 && VersionOf(r.leaf) != r.version) ||
              in.version != r.storage_writes) {
            return {{},
                    0,
                    OpName(call.op) +
                        " read a tensor made before the context that was modified in place "
                        "since",
                    {}};
          }
          if (in.exported) {
            return {{}, 0, "its recompute reads bytes handed outside autograd (numpy, ...)", {}};
          }
          if (read.insert(r.storage).second) f.read.push_back(r.storage);
          continue;
        }
        if (r.storage != it.s) stack.push_back({r.storage, r.version, false});
      }
    }
  }
  return f;
}

int32_t Step::Sibling(int32_t index) const {
  const Storage& s = storages_[index];
  const Call& call = calls_[s.producer];
  if (s.reg_version != 0 || call.group < 0) return -1;
  for (int32_t m : groups_[call.group]) {
    const Storage& o = storages_[m];
    if (o.registered && !o.freed && o.reg_version == 0 && o.allow_drop == s.allow_drop) return m;
  }
  return -1;
}

namespace {
// A dtype as Python names it (torch.float32, ...).
std::string DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: {
      std::string name = c10::toString(t);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return name;
    }
  }
}

std::string Count(size_t n) { return std::to_string(n) + (n == 1 ? " tensor" : " tensors"); }
}  // namespace

[[noreturn]] void Step::Fail(remat_status status, int32_t index, const std::string& what) {
  std::string message = remat_last_error();
  if (status != REMAT_OUT_OF_MEMORY) throw std::runtime_error("remat: " + what + ": " + message);
  // Two lines: what did not fit beside what the budget could not let go
  // (and why), and the ways out, the least budget among them.
  std::vector<int32_t> kept, stuck, read;
  std::set<std::string> kept_why, stuck_why;
  for (int32_t k : registered_) {
    const Storage& s = storages_[k];
    if (s.freed || k == index) continue;
    bool reading = std::find(pins_.begin(), pins_.end(), s.id) != pins_.end();
    if (s.pinned_forever) {
      kept.push_back(k);
      kept_why.insert(s.why_pinned);
    } else if (reading) {
      read.push_back(k);
    } else if (!s.allow_drop && !options_.offload && s.held.defined()) {
      stuck.push_back(k);
      if (!s.why_kept.empty()) stuck_why.insert(s.why_kept);
    }
  }
  auto bytes = [&](const std::vector<int32_t>& v) {
    int64_t n = 0;
    for (int32_t k : v) n += storages_[k].nbytes;
    return n;
  };
  auto joined = [](const std::set<std::string>& v) {
    std::string out;
    for (const std::string& w : v) out += (out.empty() ? "" : "; ") + w;
    return out;
  };
  std::vector<std::string> held, fixes;
  if (!kept.empty()) {
    held.push_back(Count(kept.size()) + " (" + std::to_string(bytes(kept)) +
                   " bytes) kept to the step's end (" + joined(kept_why) + ")");
    fixes.push_back("make that write out of place (y = x + 1, not x.add_(1)) or do it after the "
                    "backward");
  }
  if (!stuck.empty()) {
    held.push_back(Count(stuck.size()) + " (" + std::to_string(bytes(stuck)) +
                   " bytes) that cannot be replayed (" + joined(stuck_why) + ") with offload off");
    fixes.push_back("pass offload=True");
  }
  if (!read.empty()) {
    held.push_back(Count(read.size()) + " (" + std::to_string(bytes(read)) +
                   " bytes) the backward is reading now");
  }
  const uint64_t budget = session_->budget_bytes();
  const uint64_t need = static_cast<uint64_t>(storages_[index].nbytes + bytes(kept) +
                                              bytes(stuck) + bytes(read));
  fixes.push_back(need > budget ? "raise the budget to at least " + std::to_string(need) + " bytes"
                                : std::string("raise the budget"));
  std::string beside;
  for (const std::string& h : held) beside += (beside.empty() ? "" : ", ") + h;
  if (beside.empty()) beside = "nothing it must keep";
  std::string fix;
  for (const std::string& f : fixes) fix += (fix.empty() ? "" : "; or ") + f;
  fix[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(fix[0])));
  throw BudgetTooSmall("remat.torch.budget(" + std::to_string(budget) + " bytes) " + what +
                       " beside " + beside + ".\n" + fix + ".");
}

void Step::Register(int32_t index, const at::Tensor& t, bool own) {
  Frontier f = FrontierOf(index, storages_[index].version);
  Storage& s = storages_[index];
  s.droppable = f.why_not.empty();
  s.why_kept = f.why_not;
  if (!s.droppable) counts.kept_not_replayable += 1;
  s.allow_drop = options_.recompute && s.droppable;
  s.want_backup = false;  // (saved again after the runtime let it go: afresh)
  s.host = at::Tensor();
  s.backup = at::Tensor();
  bool allow_offload = options_.offload;
  if (WeighsReplays()) {
    const uint64_t kind = KindOf(index);  // (made in the order tensors are handed over)
    if (s.allow_drop) {
      // Dropped only where its replay can fit: the runtime estimates what
      // the replay holds at once, from its call graph; the planner admits it
      // by that, and by what earlier steps learned of its kind.
      c10::SmallVector<uint64_t, 8> ids;
      for (int32_t i : f.inputs) ids.push_back(storages_[i].id);
      uint64_t replay[REMAT_REPLAY_DEPTH + 1] = {};
      remat_drop_admission admission{};
      if (remat_runtime_estimate_replay(runtime_, ids.empty() ? nullptr : ids.data(),
                                        ids.size(), static_cast<uint64_t>(s.nbytes),
                                        replay) != REMAT_OK ||
          remat_planner_admit_drop(options_.planner, kind, static_cast<uint64_t>(s.nbytes),
                                   replay, REMAT_REPLAY_DEPTH + 1, options_.replay_room,
                                   &admission) != REMAT_OK) {
        throw std::runtime_error(std::string("remat: admitting a drop: ") + remat_last_error());
      }
      switch (admission.verdict) {
        case REMAT_OFFLOAD_OVER_SHARE:
          s.allow_drop = false;
          counts.offload_not_drop += 1;
          break;
        case REMAT_OFFLOAD_BESIDE_PINNED:
          s.allow_drop = false;
          counts.offload_not_drop_seen += 1;
          break;
        case REMAT_OFFLOAD_SEEN_TO_FAIL:
          s.allow_drop = false;
          counts.offload_not_drop_failed += 1;
          break;
        default:
          break;
      }
      s.want_backup = s.allow_drop && admission.copy_first != 0 && options_.backups;
    }
  }
  if (s.allow_drop && options_.drop_first) allow_offload = false;
  s.device = t.device();
  s.order = static_cast<int32_t>(registered_.size());
  s.held = own ? t : t.tensor_data();  // (not t's own TensorImpl: see module.cc's PackHook)
  s.held_version = s.version;
  s.reg_version = s.version;
  int32_t sibling = Sibling(index);
  uint64_t id = 0;
  remat_status status;
  Call& call = calls_[s.producer];
  if (sibling >= 0) {
    status = remat_call_add_output(runtime_, storages_[sibling].id, s.nbytes,
                                   s.allow_drop ? 1 : 0, allow_offload ? 1 : 0, 0, &id, nullptr);
  } else {
    c10::SmallVector<uint64_t, 8> ids;
    for (int32_t i : f.inputs) ids.push_back(storages_[i].id);
    remat_call_options opts{};
    opts.inputs = ids.empty() ? nullptr : ids.data();
    opts.num_inputs = ids.size();
    opts.compute_ns = std::max<int64_t>(1, f.cost);
    opts.allow_drop = s.allow_drop ? 1 : 0;
    opts.allow_offload = allow_offload ? 1 : 0;
    opts.recompute = s.allow_drop ? &Session::OnRecompute : nullptr;
    auto* ref = new GroupRef{session_.get(), static_cast<int32_t>(groups_.size())};
    opts.user_data = ref;
    opts.destroy = [](void* p) { delete static_cast<GroupRef*>(p); };
    size_t bytes = static_cast<size_t>(s.nbytes);
    status = remat_call_create(runtime_, 1, &bytes, &opts, 0, &id, nullptr);
  }
  if (status != REMAT_OK) {
    storages_[index].held = at::Tensor();
    std::string shape = "(";
    for (size_t d = 0; d < t.sizes().size(); ++d) {
      shape += (d ? ", " : "") + std::to_string(t.sizes()[d]);
    }
    shape += t.sizes().size() == 1 ? ",)" : ")";
    Fail(status, index,
         "cannot hold a saved tensor of " + std::to_string(storages_[index].nbytes) + " bytes (" +
             shape + " torch." + DtypeName(t.scalar_type()) +
             ", made by " + OpName(call.op) + ")");
  }
  Storage& r = storages_[index];
  if (sibling >= 0) {
    r.group = storages_[sibling].group;
    groups_[r.group].push_back(index);
  } else {
    groups_.push_back({index});
    r.group = static_cast<int32_t>(groups_.size()) - 1;
    if (r.reg_version == 0) call.group = r.group;  // later outputs may join it
  }
  for (int32_t leaf : f.read) storages_[leaf].readers.push_back(index);
  r.id = id;
  r.registered = true;
  by_id_[id] = index;
  registered_.push_back(index);
  remat_tensor_release(runtime_, id);
}

int32_t Step::Pack(const at::Tensor& t, bool grad_leaf, bool own) {
  if (closed_ || internal) return -1;
  RaiseDeferred();
  if (!HasStorage(t)) {
    counts.saved_unmanaged += 1;
    return -1;
  }
  if (!dead_.empty()) FreeDead();
  if (!pins_.empty()) ReleasePins();  // a forward again: the last backward node has run
  int32_t index = StorageOf(t.storage().unsafeGetStorageImpl());
  if (index < 0) {
    counts.saved_unmanaged += 1;
    return -1;
  }
  {
    Storage& s = storages_[index];
    if (s.leaf || s.exported || t.scalar_type() != s.dtype || s.nbytes == 0 || grad_leaf ||
        t.is_conj() || t.is_neg()) {
      counts.saved_unmanaged += 1;
      return -1;
    }
    if (s.registered && s.freed && !s.pinned_forever) {
      // Saved again after the runtime let it go: a new runtime tensor.
      by_id_.erase(s.id);
      s.registered = false;
      s.freed = false;
      s.id = 0;
      s.regions.clear();
    }
  }
  if (!storages_[index].registered) {
    Register(index, t, own);
  } else {
    Storage& s = storages_[index];
    if (s.reg_version != s.version && !s.pinned_forever) {
      // Saved again after writes that left the views saved so far alone
      // (else it would be pinned): the newer content serves them all.
      Frontier f = FrontierOf(index, s.version);
      Storage& now = storages_[index];
      if (f.why_not.empty()) {
        for (int32_t leaf : f.read) storages_[leaf].readers.push_back(index);
        now.reg_version = now.version;
        if (now.held.defined() && now.held_version != now.version) {
          now.held = t.tensor_data();  // the program's own storage holds the newer bytes
          now.held_version = now.version;
        }
        if (now.host.defined() && now.host_version != now.version) {
          now.host = CopyOut(t, now.nbytes);  // offloaded: the newer bytes go to the host
          storages_[index].host_version = storages_[index].version;
        }
        Storage& again = storages_[index];
        if (again.backup.defined() && again.backup_version != again.version) {
          again.backup = at::Tensor();  // of the older content: a replay of the newer must do
        }
      } else {
        PinForever(index, "written in place after it was saved, then saved again");
        storages_[index].held = t.tensor_data();
        storages_[index].held_version = storages_[index].version;
        counts.pinned_by_write += 1;
      }
    }
  }
  Storage& s = storages_[index];
  if (s.pinned_forever) {
    counts.saved_unmanaged += 1;
    return -1;
  }
  s.regions.push_back({{t.sizes().begin(), t.sizes().end()},
                       {t.strides().begin(), t.strides().end()},
                       t.storage_offset()});
  s.handles += 1;
  counts.saved_tensors += 1;
  return index;
}

void Step::HandleDied(int32_t storage) { dead_.push_back(storage); }

void Step::KeepReaders(int32_t leaf, const std::string& why) {
  if (!pins_.empty()) ReleasePins();
  FreeDead();
  std::vector<int32_t> readers;
  readers.swap(storages_[leaf].readers);
  for (int32_t r : readers) PinForever(r, why);
}

void Step::BeforeWrite(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs) {
  if (closed_ || internal) return;
  RaiseDeferred();
  for (int32_t arg : WrittenArgs(info, inputs)) {
    if (arg >= static_cast<int32_t>(inputs.size())) continue;
    std::vector<c10::IValue> one = {inputs[arg]};
    ForEachTensor(one, [&](const at::Tensor& t, int32_t, int32_t) {
      if (!HasStorage(t)) return;
      int32_t s = StorageOf(t.storage().unsafeGetStorageImpl());
      if (s >= 0 && storages_[s].leaf && !storages_[s].readers.empty()) {
        KeepReaders(s, "computed from a tensor made before the budget that " +
                           OpName(*info.op) + " then wrote into");
      }
    });
  }
}

void Step::Exported(const at::Tensor& t) {
  if (closed_ || internal || !HasStorage(t)) return;
  int32_t index = StorageOf(t.storage().unsafeGetStorageImpl());
  if (index < 0) index = NewStorage(t.storage(), /*leaf=*/true);
  if (storages_[index].exported) return;
  storages_[index].exported = true;
  if (!storages_[index].readers.empty()) {
    KeepReaders(index, "computed from bytes handed outside autograd (numpy, DLPack, data_ptr), "
                       "which may be written there");
  }
  Storage& s = storages_[index];
  if (!s.leaf && s.registered && !s.freed) {
    PinForever(index, "its bytes were handed outside autograd (numpy, DLPack, data_ptr)");
    // From now on remat holds the program's own bytes.
    Storage& now = storages_[index];
    now.held = ViewOf(t.storage(), now.dtype,
                      {now.nbytes / static_cast<int64_t>(c10::elementSize(now.dtype))}, {1}, 0);
    now.held_version = now.version;
  }
}

void Step::DataSet(const at::Tensor& t) {
  // remat holds shallow copies (tensor_data), which `.data =` does not
  // move: nothing of remat's follows t. Autograd holds a tensor it saved as
  // an input, and reads where it was moved: so does remat, which keeps t
  // alive to the step's end for those handles to read.
  if (closed_ || internal) return;
  moved_.push_back(t);
}

void Step::FreeDead() {
  while (!dead_.empty()) {
    int32_t index = dead_.back();
    dead_.pop_back();
    Storage& s = storages_[index];
    s.handles -= 1;
    if (s.handles == 0 && s.registered && !closed_) {
      bool pinned = false;
      for (uint64_t p : pins_) pinned = pinned || p == s.id;
      if (!pinned) Free(index);
    }
  }
}

void Step::Free(int32_t index) {
  Storage& s = storages_[index];
  if (s.freed || s.pinned_forever || !s.registered) return;
  s.freed = true;
  if (s.backup.defined()) {
    // Dropped, and not needed again by the step's backward: such a drop did
    // no harm. (A step with no backward says nothing of what one would need.)
    if (!s.held.defined() && backward_read_) SawReplay(index, true);
    s.backup = at::Tensor();
  }
  remat_tensor_free(runtime_, s.id);
}

void Step::ReleasePins() {
  pin_node_ = nullptr;
  pin_bytes_ = 0;
  // (Copied out, not swapped: pins_ keeps its room for the next node.)
  c10::SmallVector<uint64_t, 8> pins(pins_.begin(), pins_.end());
  pins_.clear();
  for (uint64_t id : pins) remat_tensor_release(runtime_, id);
  for (uint64_t id : pins) {
    auto it = by_id_.find(id);
    if (it != by_id_.end() && storages_[it->second].handles == 0) Free(it->second);
  }
}

void Step::Acquire(int32_t index) {
  void* p = nullptr;
  error_ = nullptr;
  // Dropped: its acquire replays it.
  const bool replayed = !storages_[index].held.defined() && !storages_[index].host.defined();
  remat_status status = remat_tensor_acquire(runtime_, storages_[index].id, 0, &p);
  if (error_) {
    // What failed inside a replay, as itself (a BudgetTooSmall stays one).
    std::exception_ptr error = error_;
    error_ = nullptr;
    if (status == REMAT_OK) remat_tensor_release(runtime_, storages_[index].id);
    bool too_small = false;
    try {
      std::rethrow_exception(error);
    } catch (const BudgetTooSmall&) {
      too_small = true;
    } catch (const c10::OutOfMemoryError&) {
      too_small = true;  // (the device's own: no room for the replay there either)
    } catch (...) {
    }
    // No room for the replay: the copy made as it was dropped, if any.
    if (too_small && Refill(index)) {
      unfit_ = -1;
      return;
    }
    // No copy to come back from: unless a replay this one runs inside
    // comes back from its own, the step fails, and the next steps of its
    // plan offload its kind (ReportUnfit).
    if (too_small) unfit_ = replayed ? index : -1;
    std::rethrow_exception(error);
  }
  if (status != REMAT_OK) {
    if (status == REMAT_OUT_OF_MEMORY && Refill(index)) {
      unfit_ = -1;
      return;
    }
    if (status == REMAT_OUT_OF_MEMORY) unfit_ = replayed ? index : -1;
    Fail(status, index, "cannot make room to bring back a saved tensor of " +
                     std::to_string(storages_[index].nbytes) + " bytes (made by " +
                     OpName(calls_[storages_[index].producer].op) + ")");
  }
  // Back: a replay that failed inside this one (rebuilt, or refilled) is
  // not the step's failure.
  unfit_ = -1;
  if (deferred_) {
    // A copy back that failed as the runtime brought it (OnEvent): its
    // error, not a tensor missing later.
    remat_tensor_release(runtime_, storages_[index].id);
    RaiseDeferred();
  }
}

bool Step::Refill(int32_t index) {
  {
    const Storage& s = storages_[index];
    if (!s.backup.defined() || s.backup_version != s.reg_version || s.held.defined() ||
        s.freed) {
      return false;
    }
  }
  void* p = nullptr;
  if (remat_tensor_refill(runtime_, storages_[index].id, 0, &p) != REMAT_OK) return false;
  Storage& s = storages_[index];
  try {
    s.held = CopyIn(s.backup, s.device);
  } catch (...) {
    // Dropped again, as the step has it (the runtime's block was never written).
    remat_tensor_release(runtime_, s.id);
    remat_tensor_evict(runtime_, s.id, REMAT_EVICT_DROP, 0, nullptr);
    throw;
  }
  s.held_version = s.reg_version;
  counts.backups_used += 1;  // (the copy is kept for a later drop of it)
  SawReplay(index, false);
  return true;
}

void Step::ReportUnfit() {
  if (unfit_ >= 0) SawReplay(unfit_, false);
  unfit_ = -1;
}

uint64_t Step::KindOf(int32_t index) {
  Storage& s = storages_[index];
  if (!s.has_kind) {
    // Its producing op, which output, and how many such this step handed to
    // the runtime before it: the same tensor of every step of a program
    // gets the same kind.
    std::string what = OpName(calls_[s.producer].op) + "#" + std::to_string(s.output);
    const int64_t n = kinds_handed_[what]++;
    uint64_t h = std::hash<std::string>{}(what) ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    storages_[index].kind = h;
    storages_[index].has_kind = true;
  }
  return storages_[index].kind;
}

std::vector<std::pair<std::string, uint64_t>> Step::KindsHanded() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (int32_t index : registered_) {
    const Storage& s = storages_[index];
    if (s.has_kind) out.emplace_back(OpName(calls_[s.producer].op), s.kind);
  }
  return out;
}

void Step::SawReplay(int32_t index, bool fit) {
  const Storage& s = storages_[index];
  if (!s.has_kind || options_.planner == nullptr) return;
  remat_planner_saw_replay(options_.planner, s.kind, static_cast<uint64_t>(s.nbytes),
                           fit ? 1 : 0);
}

void Step::PrefetchBefore(int32_t index) {
  // The backward reads saved tensors about in the reverse order of saving:
  // the next few offloaded ones before this one are copied in now (on a
  // GPU on the side stream, behind this node's compute).
  constexpr int kAhead = 2, kScan = 64;
  int found = 0;
  const int32_t order = storages_[index].order;
  for (int32_t i = order - 1; i >= 0 && i >= order - kScan; --i) {
    const Storage& t = storages_[registered_[i]];
    if (t.freed || t.pinned_forever || !t.host.defined() || t.held.defined()) continue;
    if (remat_tensor_prefetch(runtime_, t.id, 0) != REMAT_OK) break;  // no room now
    if (++found == kAhead) break;
  }
}

at::Tensor Step::CopyOut(const at::Tensor& held, int64_t nbytes) {
  const auto start = std::chrono::steady_clock::now();
  InternalScope mine(this);
  at::AutoDispatchBelowADInplaceOrView below;
  // The whole storage, flat, as bytes.
  at::Tensor flat = ViewOf(held.storage(), at::kByte, {nbytes}, {1}, 0);
  at::Tensor host;
  if (!flat.is_cuda()) {
    // (The CPU, or another device without streams remat drives: a copy there.)
    host = flat.clone();
  } else {
    host = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    c10::impl::VirtualGuardImpl impl(flat.device().type());
    if (!side_) side_ = impl.getStreamFromGlobalPool(flat.device(), /*isHighPriority=*/false);
    // The side stream starts once what the program enqueued so far is done
    // (the bytes are written), and the storage is not reused before the copy.
    c10::Event ready(flat.device().type());
    ready.record(impl.getStream(flat.device()));
    ready.block(*side_);
    {
      c10::StreamGuard on_side(*side_);
      host.copy_(flat, /*non_blocking=*/true);
    }
    flat.record_stream(*side_);
  }
  copy_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return host;
}

at::Tensor Step::CopyIn(const at::Tensor& host, c10::Device device) {
  const auto start = std::chrono::steady_clock::now();
  InternalScope mine(this);
  at::AutoDispatchBelowADInplaceOrView below;
  at::Tensor back;
  if (!device.is_cuda()) {
    back = host.clone();
  } else {
    c10::impl::VirtualGuardImpl impl(device.type());
    if (side_) {
      // After the copy out (on the side stream) has read the device's bytes.
      c10::Event out(device.type());
      out.record(*side_);
      out.block(impl.getStream(device));
    }
    back = host.to(device, /*non_blocking=*/true);
  }
  copy_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return back;
}

at::Tensor Step::Unpack(int32_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                        int64_t offset, at::ScalarType dtype) {
  if (closed_) {
    throw std::runtime_error(
        "a tensor saved under remat.torch.budget was used after the context ended: run the "
        "backward inside the `with`");
  }
  // Pins last while the node that unpacked them runs: the engine unpacks a
  // node's saved tensors just before applying it.
  auto node = torch::autograd::get_current_node();
  int task = torch::autograd::get_current_graph_task_id();
  if (node.get() == nullptr || node.get() != pin_node_ || task != pin_task_) {
    ReleasePins();
    pin_node_ = node.get();
    pin_task_ = task;
  }
  FreeDead();
  RaiseDeferred();
  backward_read_ = true;
  // A storage counts once beside another, however many of its views the
  // node reads.
  const bool again = storages_[index].pinned_forever ||
                     std::find(pins_.begin(), pins_.end(), storages_[index].id) != pins_.end();
  if (WeighsReplays() && !again) {
    remat_planner_saw_pinned(options_.planner, KindOf(index),
                             static_cast<uint64_t>(storages_[index].nbytes),
                             static_cast<uint64_t>(pin_bytes_ + forever_bytes_));
  }
  Acquire(index);
  pins_.push_back(storages_[index].id);
  if (!again) pin_bytes_ += storages_[index].nbytes;
  if (options_.offload) PrefetchBefore(index);
  Storage& s = storages_[index];
  if (!s.held.defined()) {
    throw std::runtime_error("remat: saved storage " + std::to_string(index) +
                             " is resident in the runtime but has no tensor (a bug)");
  }
  return ViewOf(s.held.storage(), dtype, sizes, strides, offset);
}

void Step::OnEvent(const remat_event& e) {
  auto it = by_id_.find(e.tensor);
  if (it == by_id_.end()) return;
  Storage& s = storages_[it->second];
  // (Under the runtime's lock: the copies below make no runtime call, and
  // an error cannot cross the runtime: it waits for the step's next hook.)
  try {
    if (e.kind == REMAT_EVENT_DROPPED || e.kind == REMAT_EVENT_COLLECTED) {
      if (verify_ && e.kind == REMAT_EVENT_DROPPED && s.held.defined()) {
        InternalScope mine(this);
        verify_copies_[it->second] = {s.held.clone(), s.held_version};
      }
      if (e.kind == REMAT_EVENT_DROPPED && e.pressure && s.want_backup && s.held.defined() &&
          s.held_version == s.reg_version &&
          !(s.backup.defined() && s.backup_version == s.reg_version)) {
        // (A copy made at an earlier drop still serves.)
        try {
          s.backup = CopyOut(s.held, s.nbytes);
          s.backup_version = s.reg_version;
          counts.backups += 1;
          counts.backup_bytes += s.nbytes;
        } catch (const c10::OutOfMemoryError&) {
          // No host memory for it (pinned memory runs out first): the drop
          // goes on without a copy.
          counts.backups_skipped += 1;
        } catch (const std::bad_alloc&) {
          counts.backups_skipped += 1;
        }
      }
      s.held = at::Tensor();
      s.host = at::Tensor();
    } else if (e.kind == REMAT_EVENT_OFFLOADED) {
      if (s.held.defined()) {
        s.host = CopyOut(s.held, s.nbytes);
        s.host_version = s.held_version;
        s.held = at::Tensor();
      }
    } else if (e.kind == REMAT_EVENT_RESTORED) {
      if (e.refill) return;  // from the copy made as it was dropped: Refill copies it in
      counts.restores += 1;
      if (s.host.defined()) {
        s.held = CopyIn(s.host, s.device);
        s.held_version = s.host_version;
        s.host = at::Tensor();
      }
    }
  } catch (...) {
    // (An offload whose copy failed keeps `held`: its bytes are not lost.)
    Defer(std::current_exception());
  }
}

int Step::OnRecompute(int32_t group, const int* regenerate, size_t num_outputs) {
  auto start = std::chrono::steady_clock::now();
  bool outer = !in_replay_;
  in_replay_ = true;
  InternalScope mine(this);
  std::vector<int32_t> done;
  int result = 0;
  try {
    Memo memo;
    std::unordered_map<int32_t, std::vector<at::Tensor>> runs;
    at::AutoDispatchBelowAutograd below;
    const c10::SmallVector<int32_t, 2> members = groups_[group];
    for (size_t i = 0; i < num_outputs && i < members.size(); ++i) {
      if (!regenerate[i]) continue;
      int32_t index = members[i];
      done.push_back(index);
      at::Tensor t = Materialize(index, storages_[index].reg_version, memo, runs, true);
      if (verify_) Verify(index, t);
      storages_[index].held = t;
      storages_[index].held_version = storages_[index].reg_version;
    }
    for (int32_t index : done) SawReplay(index, true);  // (its copy is kept for a later drop)
  } catch (const std::exception& e) {
    for (int32_t index : done) storages_[index].held = at::Tensor();
    if (!error_) error_ = std::current_exception();
    remat_recompute_set_error(e.what());
    result = 1;
  } catch (...) {  // (nothing may cross into the C runtime)
    for (int32_t index : done) storages_[index].held = at::Tensor();
    if (!error_) error_ = std::current_exception();
    remat_recompute_set_error("remat: a replay raised");
    result = 1;
  }
  if (outer) {
    in_replay_ = false;
    recompute_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return result;
}

at::Tensor Step::Materialize(int32_t index, int64_t version, Memo& memo,
                             std::unordered_map<int32_t, std::vector<at::Tensor>>& runs,
                             bool top) {
  int64_t key = (static_cast<int64_t>(index) << 24) ^ version;
  auto found = memo.find(key);
  if (found != memo.end()) return found->second;
  const bool managed = !top && storages_[index].registered && !storages_[index].freed &&
                       storages_[index].reg_version == version;
  if (managed && storages_[index].held.defined() &&
      storages_[index].held_version == version) {
    return storages_[index].held;
  }
  if (managed && !storages_[index].held.defined()) {
    // Saved since this recompute's inputs were listed: the runtime brings it.
    bool rebuilt = false;
    try {
      Acquire(index);
    } catch (const BudgetTooSmall&) {
      // No room for it beside the outputs the runtime is regenerating now.
      // Where the runtime may drop it (its replay was judged to fit), it is
      // rebuilt below from its own call, a temporary of this replay as the
      // replay's unsaved intermediates are; the runtime keeps it as it was.
      if (!(storages_[index].droppable && storages_[index].allow_drop)) throw;
      rebuilt = true;
      counts.rebuilt_in_replay += 1;
    }
    if (!rebuilt) {
      at::Tensor held = storages_[index].held;
      int64_t held_version = storages_[index].held_version;
      remat_tensor_release(runtime_, storages_[index].id);
      if (held.defined() && held_version == version) return held;
    }
  }
  if (managed && !storages_[index].droppable) {
    throw std::runtime_error("remat cannot recompute what storage " + std::to_string(index) +
                             " held when it was saved: it was written since, and its content "
                             "cannot be replayed (" + storages_[index].why_kept + ")");
  }
  Storage& s = storages_[index];
  if (s.version == version) {
    // Still alive (the program holds it): nothing to run.
    c10::intrusive_ptr<c10::StorageImpl> alive = s.weak.lock();
    if (alive && alive->data() != nullptr && s.nbytes == static_cast<int64_t>(alive->nbytes())) {
      c10::Storage st(std::move(alive));
      const int64_t n = s.nbytes / static_cast<int64_t>(c10::elementSize(s.dtype));
      at::Tensor t = ViewOf(st, s.dtype, {n}, {1}, 0);
      memo[key] = t;
      return t;
    }
  }
  int32_t producer = storages_[index].producer;
  int32_t output = storages_[index].output;
  at::Tensor base;
  if (version == 0) {
    auto run = runs.find(producer);
    if (run == runs.end()) {
      run = runs.emplace(producer, Run(producer, memo, runs, -1, at::Tensor())).first;
    }
    base = run->second.at(output);
  } else {
    base = Run(producer, memo, runs, -1, at::Tensor()).at(output);
  }
  std::vector<int32_t> writers = storages_[index].writers;
  for (int64_t w = 0; w < version && w < static_cast<int64_t>(writers.size()); ++w) {
    Run(writers[w], memo, runs, index, base);
  }
  memo[key] = base;
  return base;
}

std::vector<at::Tensor> Step::Run(int32_t index, Memo& memo,
                                  std::unordered_map<int32_t, std::vector<at::Tensor>>& runs,
                                  int32_t rebuild_storage, const at::Tensor& rebuild) {
  std::vector<c10::IValue> stack = calls_[index].args;
  const size_t n = calls_[index].refs.size();
  for (size_t i = 0; i < n; ++i) {
    const Ref r = calls_[index].refs[i];
    const Slot slot = calls_[index].slots[i];
    bool written = false;
    for (int32_t w : calls_[index].written) written = written || w == static_cast<int32_t>(i);
    at::Tensor base;
    if (rebuild_storage >= 0 && r.storage == rebuild_storage) {
      base = rebuild;
    } else if (storages_[r.storage].leaf) {
      if (((r.version >= 0 && VersionOf(r.leaf) != r.version) ||
           storages_[r.storage].version != r.storage_writes) &&
          !written) {
        throw std::runtime_error("remat cannot recompute " + OpName(calls_[index].op) +
                                 ": an input made before the context was modified in place "
                                 "after the forward used it");
      }
      base = r.leaf;
    } else {
      base = Materialize(r.storage, r.version, memo, runs, false);
    }
    at::Tensor v;
    if (storages_[r.storage].leaf && !(rebuild_storage >= 0 && r.storage == rebuild_storage)) {
      // The tensor itself: its metadata too (a Python number's wrapped-number
      // flag, which type promotion reads).
      v = r.leaf;
    } else {
      v = ViewOf(base.storage(), r.dtype, r.sizes, r.strides, r.offset);
    }
    if (written && !(rebuild_storage >= 0 && r.storage == rebuild_storage)) v = v.clone();
    c10::IValue& arg = stack[slot.arg];
    if (slot.item < 0) {
      arg = c10::IValue(v);
    } else if (arg.isTensorList()) {
      auto list = arg.toTensorList().copy();
      list.set(slot.item, v);
      arg = c10::IValue(std::move(list));
    } else {
      auto list = arg.toList().copy();
      list.set(slot.item, c10::IValue(v));
      arg = c10::IValue(std::move(list));
    }
  }
  const Call& call = calls_[index];
  counts.recomputed_calls += 1;
  c10::AutoGradMode grad(call.grad);
  std::vector<std::pair<at::Generator, at::Tensor>> live;
  std::shared_ptr<ForeignRng> live_foreign;
  if (call.rng) {
    for (const auto& [gen, state] : call.rng->states) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      live.emplace_back(g, g.get_state());
      g.set_state(state);
    }
    if (call.rng->foreign) {
      live_foreign = call.rng->foreign->Take();
      call.rng->foreign->Put();
    }
  }
  try {
    call.op.callBoxed(stack);
  } catch (...) {
    Restore(live);
    if (live_foreign) live_foreign->Put();
    throw;
  }
  Restore(live);
  if (live_foreign) live_foreign->Put();
  std::vector<at::Tensor> out;
  ForEachTensor(stack, [&](const at::Tensor& t, int32_t, int32_t) { out.push_back(t); });
  return out;
}

void Step::Close() {
  if (closed_) return;
  closed_ = true;
  std::exception_ptr deferred = deferred_;
  deferred_ = nullptr;
  ReleasePins();
  dead_.clear();
  for (int32_t index : registered_) {
    Storage& s = storages_[index];
    if (s.pinned_forever && !s.freed) {
      s.pinned_forever = false;
      remat_tensor_release(runtime_, s.id);
    }
    if (!s.freed) {
      // Dropped with a copy, and not needed again by the backward: such a
      // drop did no harm (as Free reports it).
      if (s.backup.defined() && !s.held.defined() && backward_read_) SawReplay(index, true);
      s.freed = true;
      remat_tensor_free(runtime_, s.id);
    }
  }
  session_->EndStep();
  session_->last_sizes = {calls_.size(), storages_.size(), registered_.size()};
  for (Storage& s : storages_) {
    s.held = at::Tensor();
    s.host = at::Tensor();
    s.backup = at::Tensor();
  }
  for (Call& c : calls_) c.refs.clear();
  by_impl_.clear();
  by_id_.clear();
  moved_.clear();
  if (deferred) std::rethrow_exception(deferred);
}

// --- Session ------------------------------------------------------------------------------

Session::Session(uint64_t budget_bytes, const std::string& policy, bool recompute, bool offload,
                 double link_gbps, int64_t link_latency_ns)
    : budget_bytes_(budget_bytes) {
  remat_allocator_options ao;
  remat_allocator_options_init(&ao);
  ao.device = REMAT_DEVICE_SIM;
  ao.sim_backed = 0;
  ao.sim_capacity_bytes = uint64_t{16} << 40;  // addresses only: the books of the saved bytes
  if (remat_allocator_create(&ao, &allocator_) != REMAT_OK) {
    throw std::runtime_error(std::string("remat_allocator_create: ") + remat_last_error());
  }
  remat_runtime_options ro;
  remat_runtime_options_init(&ro);
  ro.policy = policy.c_str();
  ro.enable_drop = recompute ? 1 : 0;
  ro.enable_offload = offload ? 1 : 0;
  // A drop is admitted by what its replay needs, as the runtime estimates it.
  ro.estimate_replays = offload && recompute ? 1 : 0;
  if (link_gbps > 0) ro.link_gbps = link_gbps;
  if (link_latency_ns >= 0) ro.link_latency_ns = link_latency_ns;
  ro.live_budget = budget_bytes;
  ro.host_pool_bytes = uint64_t{16} << 40;
  ro.learn_next_use = 1;
  if (remat_runtime_create_observed(allocator_, &ro, &Session::OnEvent, this, &runtime_) !=
      REMAT_OK) {
    std::string message = remat_last_error();
    remat_allocator_destroy(allocator_);
    allocator_ = nullptr;
    throw std::invalid_argument(message);
  }
}

Session::~Session() {
  remat_runtime_destroy(runtime_);
  remat_allocator_destroy(allocator_);
}

remat_runtime_stats Session::Stats() const {
  remat_runtime_stats st{};
  remat_runtime_get_stats(runtime_, &st);
  return st;
}

void Session::EndStep() { remat_runtime_end_step(runtime_); }

void Session::OnEvent(void* user, const remat_event* e) {
  auto* self = static_cast<Session*>(user);
  if (self->step_ != nullptr) self->step_->OnEvent(*e);
}

int Session::OnRecompute(void* user, void* const*, size_t, void* const*, const size_t*,
                         const int* regenerate, size_t num_outputs, uint64_t) {
  auto* ref = static_cast<GroupRef*>(user);
  Step* step = ref->session->step();
  if (step == nullptr) {
    remat_recompute_set_error("remat: a recompute outside a step");
    return 1;
  }
  return step->OnRecompute(ref->group, regenerate, num_outputs);
}

}  // namespace remat_torch
