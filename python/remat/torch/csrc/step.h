// remat.torch's per-call path: the forward's ATen calls recorded, saved
// tensors handed to remat's runtime, and dropped ones replayed through the
// dispatcher, all in C++ (python/remat/torch/_native.py builds and loads it).
//
// A Session owns one runtime (and its simulated allocator, which keeps the
// books of the saved bytes) across a budget's steps; a Step is one `with`.
// Python opens a step, installs pack/unpack as saved-tensor hooks and the
// recorder as a thread-local RecordFunction callback, and closes the step:
// nothing per call crosses into Python but the two hooks, which are C
// functions.
//
// Invariants:
// - storages_[i].weak keeps its StorageImpl's address from being reused, so
//   a StorageImpl* names one storage for the whole step.
// - A storage the runtime holds (registered, not freed) has `held` defined
//   exactly while the runtime says it is resident; the event callback drops
//   `held` when the runtime drops the storage.
// - Calls and storages refer to each other by index, never by pointer:
//   nothing dangles when the vectors grow.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/Stream.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat.h"

namespace remat_torch {

// A tensor argument of a recorded call: the storage under it, its view, and
// the content version it read (for a leaf: its version counter, -1 where it
// has none, an inference tensor).
struct Ref {
  int32_t storage = -1;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  int64_t version = 0;
  at::ScalarType dtype = at::kFloat;
  at::Tensor leaf;  // the tensor itself, where the storage is a leaf
  // A leaf's writes the recorder saw in its storage before the call (a
  // write through `.data` or an alias moves no counter of the tensor's).
  int64_t storage_writes = 0;
};

// Where a Ref sits in the boxed arguments: argument `arg`, and item `item`
// of it where it is a list (-1: the argument itself).
struct Slot {
  int32_t arg;
  int32_t item;
};

// A state of generators outside torch (numpy's global one, Python's
// `random`), which a custom op whose body is Python may draw from: held by
// the host language (python/remat/torch/csrc/module.cc), set back by Put.
struct ForeignRng {
  virtual ~ForeignRng() = default;
  virtual void Put() = 0;
  // The live state now, to put back after a replay.
  virtual std::shared_ptr<ForeignRng> Take() = 0;
};

// Random-number states a random call drew from, as they were before it.
struct RngState {
  std::vector<std::pair<at::Generator, at::Tensor>> states;
  std::shared_ptr<ForeignRng> foreign;
};

struct Call {
  explicit Call(c10::OperatorHandle o) : op(std::move(o)) {}
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // as called, each tensor taken out (Slots say where)
  std::vector<Slot> slots;        // one per ref
  std::vector<Ref> refs;
  std::vector<int32_t> written;   // indices into refs of the arguments it writes
  std::optional<RngState> rng;
  bool grad = true;               // grad mode when it ran
  std::string why_not;            // why it cannot be replayed exactly ("" if it can)
  int64_t cost_ns = 0;
  int32_t group = -1;             // its runtime call: an index into Step::groups_
};

// A view of a storage that autograd saved.
struct Region {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
};

struct Storage {
  explicit Storage(c10::weak_intrusive_ptr<c10::StorageImpl> w) : weak(std::move(w)) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;
  bool leaf = true;               // made before the step or by something unrecorded
  int32_t producer = -1;          // the call that made it, and which output
  int32_t output = -1;
  std::vector<int32_t> writers;   // calls that wrote it: version i+1 = writers[i]
  int64_t version = 0;             // a leaf: the writes the recorder saw into it
  at::ScalarType dtype = at::kFloat;
  int64_t nbytes = 0;
  // The runtime's side, once saved.
  uint64_t id = 0;
  bool registered = false;
  bool freed = false;
  int64_t reg_version = 0;        // the content version the runtime holds
  at::Tensor held;                // a tensor over it while resident
  int64_t held_version = 0;       // the content version `held` holds
  bool pinned_forever = false;    // written after it was saved: the live bytes stay
  bool droppable = false;
  bool allow_drop = false;
  int64_t handles = 0;
  int32_t group = -1;
  std::string why_kept;
  std::string why_pinned;         // why it is kept to the step's end
  std::vector<Region> regions;    // the views of it saved so far
  std::vector<int32_t> readers;   // saved storages whose replay reads it (a leaf's)
  bool exported = false;          // its bytes were handed outside autograd
  // Offload (a step whose plan allows it).
  c10::Device device{c10::kCPU};  // where its bytes live when resident
  at::Tensor host;                // offloaded: the whole storage's bytes in host memory
  int64_t host_version = 0;       // the content version `host` holds
  at::Tensor backup;              // a host copy made as it was dropped (want_backup)
  int64_t backup_version = -1;
  bool want_backup = false;       // a drop of it is copied first (the planner's admission)
  bool has_kind = false;          // `kind` made (BesideKind)
  uint64_t kind = 0;              // its kind in what steps learn (the planner's books)
  int32_t order = -1;             // its place among the saved (registered_)
};

// Which operators' properties recording needs, read once per operator.
// Operators whose FLOPs the cost model counts (the rest cost the bytes they
// move, or a launch).
enum class FlopsKind : uint8_t { kNone, kMm, kAddmm, kBmm, kBaddbmm, kConvolution, kAttention };

struct OpInfo {
  std::optional<c10::OperatorHandle> op;
  FlopsKind flops = FlopsKind::kNone;
  bool random = false;
  bool python_body = false;       // a custom op whose kernel is Python: may draw from numpy's RNG
  bool is_view = false;
  bool writes = false;
  bool writes_unread = false;
  bool moves = false;             // `t.data = u` (aten::set_data)
  // Its autograd kernel is its decomposition (CompositeImplicitAutograd):
  // not recorded, the calls it makes are.
  bool composite = false;     // batch norm: writes its running statistics, outputs do not read them
  bool nondeterministic = false;
  std::string why_not;
  std::vector<int32_t> written_args;
};

// A device's rates, at which a call's cost is modelled:
// max(launch_ns, FLOPs / tflops, bytes moved / hbm_gbps).
struct CostRates {
  double tflops = 400.0;
  double hbm_gbps = 3000.0;
  int64_t launch_ns = 1000;
};

// What one call costs on a device by the model: its FLOPs (matmuls,
// convolutions, attention) and the bytes of its tensor arguments and
// results, at `rates`.
int64_t ModelCostNs(const OpInfo& info, const std::vector<c10::IValue>& inputs,
                    const std::vector<c10::IValue>& outputs, const CostRates& rates);

struct StepOptions {
  bool recompute = true;
  bool allow_nondeterministic = false;
  // A call's cost: the model (ModelCostNs) at `rates`, so that a loop's
  // steps cost their calls alike. Without model_costs, a call on the CPU
  // costs its measured host time (a GPU's calls, whose kernels run behind
  // the host, are modelled still).
  CostRates rates;
  bool model_costs = false;
  // The plan's offloads (the session's runtime must allow them): offload
  // allowed; drops first (offload only what cannot be dropped).
  bool offload = false;
  bool drop_first = false;
  // With offload and recompute both allowed: the budget's step planner,
  // which admits each drop by its replay's size and what earlier steps
  // learned of its kind, and learns from this step's replays; `replay_room`
  // is what a replay must fit in.
  remat_planner* planner = nullptr;
  uint64_t replay_room = 0;
  bool backups = true;  // false: no drop is copied first (tests of replays with no copy)
};

class Session;

class Step {
 public:
  // The step keeps its session (and so the runtime) alive while anything
  // holds the step: a handle autograd keeps past the step's end.
  Step(std::shared_ptr<Session> session, StepOptions options);
  ~Step();
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // The recorder's halves (RecordFunction callbacks on the step's thread).
  // outermost: no recorded call is running on this thread.
  bool WantsCall(const at::RecordFunction& fn, bool outermost) const;
  void Record(const OpInfo& info, const c10::OperatorHandle& op,
              std::vector<c10::IValue>&& inputs, const std::vector<c10::IValue>& outputs,
              std::optional<RngState> rng, bool grad, int64_t cost_ns);

  // Saved-tensor hooks. Pack: -1 where autograd keeps the tensor itself,
  // else the storage index a handle names (with its view). grad_leaf: t is
  // a leaf that requires grad (a parameter, wherever it was made).
  // own: t is a shallow copy of the caller's own (tensor_data), which the
  // step may hold as it is rather than copy again.
  int32_t Pack(const at::Tensor& t, bool grad_leaf, bool own = false);
  at::Tensor Unpack(int32_t storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    int64_t offset, at::ScalarType dtype);
  void HandleDied(int32_t storage);

  // The arguments `info`'s call writes, as called with `inputs` (batch
  // norm writes its running statistics only in training).
  static std::vector<int32_t> WrittenArgs(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs);

  // A call about to write `inputs`' written arguments (the recorder's
  // start): what a replay would read from a leaf it writes comes back now,
  // while the leaf holds what the replay read, and stays.
  void BeforeWrite(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs);
  // t's bytes are handed outside autograd (numpy, DLPack, data_ptr): they
  // may be written there, unseen. Never dropped from now on, and no replay
  // reads them.
  void Exported(const at::Tensor& t);
  // `t.data = ...` moves t onto other bytes: remat's hold stays on the old.
  void DataSet(const at::Tensor& t);
  // An error the recorder met, raised at the next hook or at Close.
  void Defer(std::exception_ptr error) {
    if (!deferred_) deferred_ = error;
  }

  // Ends the step: every pin and tensor it holds goes.
  void Close();
  bool closed() const { return closed_; }
  const StepOptions& options() const { return options_; }

  bool internal = false;  // remat's own calls (a replay): not recorded

  // Held by whatever works on the step from a hook or the recorder
  // (module.cc's HooksLock): autograd's device threads and jit.fork's tasks
  // reach one step from several threads at once. Recursive: a replay inside
  // an unpack records and saves again.
  std::recursive_mutex hooks_mu;

  // `internal` set for a scope, and put back as it was however it ends.
  class InternalScope {
   public:
    explicit InternalScope(Step* step) : step_(step), was_(step->internal) {
      step->internal = true;
    }
    ~InternalScope() { step_->internal = was_; }
    InternalScope(const InternalScope&) = delete;
    InternalScope& operator=(const InternalScope&) = delete;

   private:
    Step* step_;
    bool was_;
  };
  // What the step did, for stats["debug"].
  struct Counts {
    int64_t saved_tensors = 0;      // handed to the runtime
    int64_t saved_unmanaged = 0;    // left to autograd (leaves, parameters, ...)
    int64_t kept_not_replayable = 0;
    int64_t pinned_by_write = 0;    // written after they were saved: kept to the end
    int64_t recomputed_calls = 0;
    int64_t recorded_calls = 0;
    int64_t saved_by_cpp_hooks = 0;  // through the C++ hooks (module.cc), not Python's
    // With offload and recompute: drops refused by the planner's admission
    // (its replay over its share of the room; beside what the backward
    // pins; seen to fail), and the copies made as tensors were dropped.
    int64_t offload_not_drop = 0;
    int64_t offload_not_drop_seen = 0;
    int64_t offload_not_drop_failed = 0;
    int64_t backups = 0;
    int64_t backup_bytes = 0;
    int64_t backups_used = 0;
    int64_t backups_skipped = 0;
    int64_t rebuilt_in_replay = 0;   // an input a replay could not bring back, rebuilt in it
    int64_t restores = 0;            // offloaded tensors copied back
  } counts;
  double recompute_seconds = 0;
  double copy_seconds = 0;  // host time spent making offload copies
  remat_runtime_stats start_stats{};  // the runtime's counters as the step began

  // The step raised BudgetTooSmall: a dropped tensor whose replay failed it
  // (with no copy to come back from) is one its plan's next steps offload.
  void ReportUnfit();
  // (op, kind) of each saved tensor given a kind, in the order handed over.
  std::vector<std::pair<std::string, uint64_t>> KindsHanded() const;

  // The runtime's callbacks.
  void OnEvent(const remat_event& e);
  int OnRecompute(int32_t group, const int* regenerate, size_t num_outputs);

 private:
  int32_t StorageOf(c10::StorageImpl* impl) const;
  int32_t NewStorage(const c10::Storage& st, bool leaf);
  void Register(int32_t s, const at::Tensor& t, bool own);
  struct Frontier {  // (inline vectors: made for each saved tensor)
    c10::SmallVector<int32_t, 8> inputs;
    int64_t cost = 0;
    std::string why_not;
    c10::SmallVector<int32_t, 4> read;  // the leaves it reads
  };
  Frontier FrontierOf(int32_t s, int64_t version);
  bool BringsBack(const Storage& s, int64_t version) const;
  bool Overlaps(const Storage& s, const Ref& r);
  void PinForever(int32_t s, const std::string& why);
  void KeepReaders(int32_t leaf, const std::string& why);
  int32_t Sibling(int32_t s) const;
  void Acquire(int32_t s);
  bool Refill(int32_t s);
  void PrefetchBefore(int32_t s);
  uint64_t KindOf(int32_t s);
  void SawReplay(int32_t s, bool fit);
  bool WeighsReplays() const {
    return options_.offload && options_.recompute && options_.planner != nullptr;
  }
  // The whole storage under `held`, copied to host memory (on a GPU: pinned,
  // on a side stream), and back to `device`.
  at::Tensor CopyOut(const at::Tensor& held, int64_t nbytes);
  at::Tensor CopyIn(const at::Tensor& host, c10::Device device);
  void ReleasePins();
  void FreeDead();
  void Free(int32_t s);
  using Memo = std::unordered_map<int64_t, at::Tensor>;
  at::Tensor Materialize(int32_t s, int64_t version, Memo& memo,
                         std::unordered_map<int32_t, std::vector<at::Tensor>>& runs, bool top);
  std::vector<at::Tensor> Run(int32_t call, Memo& memo,
                              std::unordered_map<int32_t, std::vector<at::Tensor>>& runs,
                              int32_t rebuild_storage, const at::Tensor& rebuild);
  [[noreturn]] void Fail(remat_status status, int32_t index, const std::string& what);

  std::shared_ptr<Session> session_;
  remat_runtime* runtime_;
  StepOptions options_;
  bool closed_ = false;
  std::vector<Storage> storages_;
  std::vector<Call> calls_;
  ska::flat_hash_map<const c10::StorageImpl*, int32_t> by_impl_;
  ska::flat_hash_map<uint64_t, int32_t> by_id_;
  std::vector<c10::SmallVector<int32_t, 2>> groups_;  // (most have one member: inline)
  std::vector<int32_t> registered_;
  std::vector<uint64_t> pins_;
  std::vector<int32_t> dead_;
  std::unordered_map<std::string, int64_t> kinds_handed_;  // KindOf's counts by (op, output)
  std::optional<c10::Stream> side_;  // the copies' stream on a GPU
  int32_t unfit_ = -1;        // ReportUnfit's tensor, as the last acquire left it
  bool backward_read_ = false;  // a backward has read a saved tensor of the step
  int64_t pin_bytes_ = 0;       // the bytes of pins_
  int64_t forever_bytes_ = 0;   // and of the storages pinned to the step's end
  const void* pin_node_ = nullptr;
  int pin_task_ = -2;
  bool in_replay_ = false;
  // REMAT_NATIVE_VERIFY=1 (remat's own debugging): each drop keeps a copy,
  // each recompute is compared with it.
  bool verify_ = false;
  std::unordered_map<int32_t, std::pair<at::Tensor, int64_t>> verify_copies_;
  void Verify(int32_t index, const at::Tensor& t);
  std::vector<at::Tensor> moved_;  // tensors moved by `.data =` (DataSet)
  std::exception_ptr error_;  // what a replay inside an acquire raised
  std::exception_ptr deferred_;
  void RaiseDeferred() {
    if (deferred_) {
      std::exception_ptr e = deferred_;
      deferred_ = nullptr;
      std::rethrow_exception(e);
    }
  }
};

// One runtime across a budget's steps.
class Session {
 public:
  // offload: the runtime may offload, its copies priced at the link's
  // rate each way and latency per copy (0 and -1: the runtime's defaults).
  Session(uint64_t budget_bytes, const std::string& policy, bool recompute, bool offload = false,
          double link_gbps = 0, int64_t link_latency_ns = -1);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  remat_runtime* runtime() const { return runtime_; }
  uint64_t budget_bytes() const { return budget_bytes_; }
  Step* step() const { return step_; }
  void set_step(Step* step) { step_ = step; }
  remat_runtime_stats Stats() const;
  void EndStep();

  // How big the last step's books grew: the next reserves as much at its
  // start, so that a loop's steps grow no vector or table call by call.
  struct Sizes {
    size_t calls = 0;
    size_t storages = 0;
    size_t registered = 0;
  };
  Sizes last_sizes;

  static void OnEvent(void* user, const remat_event* e);
  static int OnRecompute(void* user, void* const* inputs, size_t num_inputs,
                         void* const* outputs, const size_t* output_bytes,
                         const int* regenerate, size_t num_outputs, uint64_t stream);

 private:
  uint64_t budget_bytes_;
  remat_allocator* allocator_ = nullptr;
  remat_runtime* runtime_ = nullptr;
  Step* step_ = nullptr;
};

// A runtime call's callback data: which session, which group of the step.
struct GroupRef {
  Session* session;
  int32_t group;
};

// The error a step raises where the budget cannot hold what it must.
class BudgetTooSmall : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor over `storage` with the given view, made without a dispatch.
at::Tensor ViewOf(const c10::Storage& storage, at::ScalarType dtype, c10::IntArrayRef sizes,
                  c10::IntArrayRef strides, int64_t offset);

const OpInfo& InfoOf(const at::RecordFunction& fn);

// An operator as Python prints it (aten.add_.Tensor).
std::string OpName(const c10::OperatorHandle& op);

// Whether a custom operator's own kernel is Python (set by the module: the
// answer comes from Python).
extern bool (*g_python_body)(const c10::OperatorHandle& op);

}  // namespace remat_torch
