// The Python face of the native step: the recorder (a thread-local
// RecordFunction callback), the saved-tensor hooks (C functions, with a
// handle type of their own), and the Session and Step objects _native.py
// drives once per step.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>
#include <ATen/SavedTensorHooks.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "step.h"

namespace py = pybind11;

namespace remat_torch {
namespace {

PyObject* g_budget_too_small = nullptr;  // remat.torch.BudgetTooSmall
PyObject* g_python_body_fn = nullptr;    // remat.torch._budget._native_python_body
PyObject* g_rng_get = nullptr;           // ... _native_foreign_rng (numpy's and Python's state)
PyObject* g_rng_set = nullptr;           // ... _native_set_foreign_rng

// numpy's and Python's RNG state, held as a Python object.
class PythonRng : public ForeignRng {
 public:
  static std::shared_ptr<PythonRng> Now() {
    py::gil_scoped_acquire gil;
    auto r = std::make_shared<PythonRng>();
    r->state_ = py::reinterpret_borrow<py::object>(g_rng_get)();
    return r;
  }
  ~PythonRng() override {
    py::gil_scoped_acquire gil;
    state_ = py::object();
  }
  void Put() override {
    py::gil_scoped_acquire gil;
    py::reinterpret_borrow<py::object>(g_rng_set)(state_);
  }
  std::shared_ptr<ForeignRng> Take() override { return Now(); }

 private:
  py::object state_;
};

bool PythonBody(const c10::OperatorHandle& op) {
  if (g_python_body_fn == nullptr) return true;
  py::gil_scoped_acquire gil;
  try {
    return py::reinterpret_borrow<py::object>(g_python_body_fn)(op.schema().name(),
                                                                op.schema().overload_name())
        .cast<bool>();
  } catch (const py::error_already_set&) {
    return true;  // (unsure: as if it were)
  }
}

// Raises the Python error for a C++ one (inside a C function: returns NULL).
PyObject* SetPythonError() {
  try {
    throw;
  } catch (const BudgetTooSmall& e) {
    PyErr_SetString(g_budget_too_small != nullptr ? g_budget_too_small : PyExc_RuntimeError,
                    e.what());
  } catch (const py::error_already_set& e) {
    py::error_already_set copy = e;
    copy.restore();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// A step's lock (Step::hooks_mu), taken by the hooks and the recorder. The
// Python hooks had the GIL to keep threads apart; the C++ ones run without
// it. Never waits holding the GIL: the holder may need it (a replay's
// Python body, an error's Python object).
class HooksLock {
 public:
  explicit HooksLock(Step& step) : lock_(step.hooks_mu, std::defer_lock) {
    if (lock_.try_lock()) return;
    std::optional<py::gil_scoped_release> unlocked;
    if (PyGILState_Check()) unlocked.emplace();
    lock_.lock();
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

// --- the recorder -------------------------------------------------------------------------

thread_local Step* tls_step = nullptr;

struct HandleData;

struct Frame : at::ObserverContext {
  // Tensors autograd saved inside this call (its own outputs, or an
  // argument it wrote): handed over once the call has ended and its
  // outputs and writes are recorded.
  std::vector<HandleData*> pending;
  const OpInfo* info = nullptr;
  std::vector<c10::IValue> inputs;
  std::optional<RngState> rng;
  bool grad = true;
  Frame* parent = nullptr;
  std::chrono::steady_clock::time_point start;
};

thread_local Frame* tls_top = nullptr;

bool OnGpu(const std::vector<c10::IValue>& values) {
  for (const c10::IValue& v : values) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cuda()) return true;
  }
  return false;
}

void Take(RngState& rng, at::Generator g) {
  for (const auto& [seen, state] : rng.states) {
    if (seen == g) return;
  }
  std::lock_guard<std::mutex> lock(g.mutex());
  rng.states.emplace_back(g, g.get_state());
}

std::unique_ptr<at::ObserverContext> OnCallStart(const at::RecordFunction& fn) {
  Step* step = tls_step;
  if (step == nullptr || !step->WantsCall(fn, tls_top == nullptr)) return nullptr;
  const OpInfo& info = InfoOf(fn);
  if (tls_top != nullptr && tls_top->info == &info) {
    // The call again, inside itself: a Python dispatch mode's handler runs
    // it with the dispatch state of the outer call. One call, recorded once
    // (as the outer one).
    return nullptr;
  }
  if (info.writes) {
    // Before the write: what replays read from a leaf it writes comes back now.
    try {
      HooksLock lock(*step);
      step->BeforeWrite(info, fn.inputs());
    } catch (...) {
      step->Defer(std::current_exception());
    }
  }
  if (info.moves && fn.inputs().size() > 0 && fn.inputs()[0].isTensor()) {
    HooksLock lock(*step);
    step->DataSet(fn.inputs()[0].toTensor());
  }
  if ((info.is_view && !info.writes) || !info.op || info.composite) {
    // A view's outputs share its input's storage: nothing to record (a
    // replay rebuilds views). A composite's work is the calls it makes,
    // recorded each (an autograd kernel's own calls, as the clone of an
    // in-place multiply's input, are recorded beside its call).
    return nullptr;
  }
  auto frame = std::make_unique<Frame>();
  frame->info = &info;
  auto inputs = fn.inputs();
  frame->inputs.assign(inputs.begin(), inputs.end());
  frame->grad = c10::GradMode::is_enabled();
  if (frame->info->random) {
    RngState rng;
    Take(rng, at::detail::getDefaultCPUGenerator());
    for (const c10::IValue& v : frame->inputs) {
      if (v.isGenerator()) Take(rng, v.toGenerator());
      // A factory call on a GPU (randn(..., device="cuda")) has no tensor
      // there: its device argument says whose generator it draws from.
      if (v.isDevice() && v.toDevice().is_cuda()) {
        Take(rng, at::globalContext().defaultGenerator(v.toDevice()));
      }
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cuda()) {
        Take(rng, at::globalContext().defaultGenerator(v.toTensor().device()));
      }
    }
    if (frame->info->python_body && g_rng_get != nullptr) rng.foreign = PythonRng::Now();
    frame->rng = std::move(rng);
  }
  frame->parent = tls_top;
  tls_top = frame.get();
  // (Modelled costs read no clock.)
  if (!step->options().model_costs) frame->start = std::chrono::steady_clock::now();
  return frame;
}

void ResolvePending(Frame* frame, bool hand_over);

void OnCallEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  auto* frame = static_cast<Frame*>(ctx);
  tls_top = frame->parent;
  Step* step = tls_step;
  bool failed = std::uncaught_exceptions() > 0;
  if (step == nullptr || step->closed() || !frame->info->op || failed) {
    if (!frame->pending.empty()) {
      try {
        std::optional<HooksLock> lock;
        if (step != nullptr) lock.emplace(*step);
        ResolvePending(frame, step != nullptr && !step->closed() && !failed);
      } catch (...) {
        if (step != nullptr) step->Defer(std::current_exception());
      }
    }
    return;
  }
  HooksLock lock(*step);
  try {
    const StepOptions& options = step->options();
    int64_t ns;
    if (options.model_costs || OnGpu(frame->inputs) || OnGpu(fn.outputs())) {
      // A GPU's kernels run behind the host: the host's time says nothing
      // of theirs.
      ns = ModelCostNs(*frame->info, frame->inputs, fn.outputs(), options.rates);
    } else {
      ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now() - frame->start)
               .count();
    }
    step->Record(*frame->info, *frame->info->op, std::move(frame->inputs), fn.outputs(),
                 std::move(frame->rng), frame->grad, ns);
    ResolvePending(frame, true);
  } catch (...) {
    // (RecordFunction swallows a callback's exception: the step raises it
    // at its next hook or at its end.)
    step->Defer(std::current_exception());
  }
  // Whatever failed, no handle may point at this frame once it is gone:
  // those not handed over stay with autograd.
  if (!frame->pending.empty()) ResolvePending(frame, false);
}

// --- saved-tensor handles -----------------------------------------------------------------

// What the pack hook hands autograd: a storage the runtime holds (with the
// view saved), or, where autograd keeps the tensor as it would without
// remat, the tensor itself (returning the tensor's own Python object from
// the hook costs microseconds more: its object then lives with the graph).
struct HandleData {
  std::shared_ptr<Step> step;
  at::Tensor kept;      // defined: autograd's tensor, kept as is
  int32_t storage;      // else the storage the runtime holds
  c10::SmallVector<int64_t, 5> sizes;  // (inline: no allocation per saved tensor)
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset;
  at::ScalarType dtype;
  bool grad_leaf;       // a leaf that requires grad (a parameter)
  Frame* pending_in;    // the call whose end hands it over, if any
  // What autograd's own in-place check needs (PyTorch skips it where
  // saved-tensor hooks are set): the version counter and its value at the
  // save, and how the tensor was saved, for the message.
  std::optional<c10::VariableVersion> counter;
  uint32_t version = 0;
  bool is_output = false;
  bool is_leaf = false;
  uint32_t output_nr = 0;
  c10::intrusive_ptr<torch::autograd::Node> grad_fn;  // saved as an input: its grad_fn
  // Saved as an input: the tensor itself, weakly. Autograd holds such a
  // tensor, so a `.data =` that moves it onto other bytes moves what the
  // backward reads; remat reads it there too.
  c10::weak_intrusive_ptr<c10::TensorImpl> source{c10::intrusive_ptr<c10::TensorImpl>()};
  c10::StorageImpl* source_storage = nullptr;
  c10::Device device{c10::kCPU};
};

PyObject* g_inplace_error = nullptr;  // remat.torch._budget._native_inplace_error

// Takes what the in-place check needs of t as it is saved.
void SaveFacts(HandleData* d, const at::Tensor& t) {
  if (t.is_inference()) return;  // (no version counter: a constant)
  d->counter = torch::autograd::impl::version_counter(t);
  d->device = t.device();
  d->version = d->counter->current_version();
  d->is_leaf = t.is_leaf();
  d->output_nr = static_cast<uint32_t>(t.output_nr());
  auto fn = t.grad_fn();
  d->is_output = fn && fn->sequence_nr() + 1 == at::sequence_number::peek();
  if (!d->is_output) {
    d->grad_fn = fn;
    d->source = c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr());
    if (t.has_storage()) d->source_storage = t.storage().unsafeGetStorageImpl();
  }
}

// Raises what autograd's unpack raises where a saved tensor was modified in
// place since its save; returns the tensor autograd would read where the
// program moved it with `.data =` (else an undefined tensor).
at::Tensor CheckSaved(HandleData* d) {
  at::Tensor moved;
  at::Tensor source;  // saved as an input and still alive: the tensor itself
  if (!d->is_output) {
    c10::intrusive_ptr<c10::TensorImpl> src = d->source.lock();
    if (src) {
      source = at::Tensor(std::move(src));
      if (source.has_storage() &&
          source.storage().unsafeGetStorageImpl() != d->source_storage) {
        moved = source.tensor_data();
      }
    }
  }
  if (!d->counter) return moved;
  uint32_t current = moved.defined() ? static_cast<uint32_t>(moved._version())
                                     : d->counter->current_version();
  if (current == d->version) return moved;
  // The node the message names: an input's grad_fn as it is now (an
  // in-place write moves it), as autograd reads it from the tensor it holds.
  py::gil_scoped_acquire gil;  // (the C++ hooks run without it)
  c10::intrusive_ptr<torch::autograd::Node> fn =
      source.defined() ? c10::intrusive_ptr<torch::autograd::Node>(source.grad_fn())
                       : d->grad_fn;
  py::object error = py::reinterpret_borrow<py::object>(g_inplace_error)(
      d->is_output, d->is_leaf, d->output_nr,
      fn ? py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(fn))
         : py::none(),
      py::reinterpret_steal<py::object>(THPVariable_Wrap(at::empty(
          {0}, at::TensorOptions().dtype(d->dtype).device(d->device)))),
      d->kept.defined() ? d->kept.sizes().vec()
                        : std::vector<int64_t>(d->sizes.begin(), d->sizes.end()),
      current, d->version);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

// Hands the saved tensor t to the step, or keeps it as autograd would.
// own: t is d->kept, a shallow copy the step may hold as it is.
void Resolve(HandleData* d, const at::Tensor& t, bool own = false) {
  int32_t storage = d->step->Pack(t, d->grad_leaf, own);
  if (storage < 0) {
    if (!d->kept.defined()) d->kept = t.tensor_data();
    return;
  }
  d->storage = storage;
  d->sizes.assign(t.sizes().begin(), t.sizes().end());
  d->strides.assign(t.strides().begin(), t.strides().end());
  d->offset = t.storage_offset();
  d->dtype = t.scalar_type();
  d->kept = at::Tensor();
}

void ResolvePending(Frame* frame, bool hand_over) {
  std::vector<HandleData*> pending;
  pending.swap(frame->pending);
  for (HandleData* d : pending) {
    if (d != nullptr) d->pending_in = nullptr;  // (null: its handle is gone)
  }
  if (!hand_over) return;
  std::exception_ptr error;
  for (HandleData* d : pending) {
    if (d == nullptr) continue;
    try {
      at::Tensor t = d->kept;
      Resolve(d, t, /*own=*/true);
    } catch (...) {
      if (!error) error = std::current_exception();  // (the rest are still handed over)
    }
  }
  if (error) std::rethrow_exception(error);
}

struct HandleObject {
  PyObject_HEAD HandleData* data;
};

// A handle autograd let go of (its saved variable is gone).
void ReleaseHandle(HandleData* d) {
  const std::shared_ptr<Step> step = d->step;  // (outlives the lock: d may hold the last)
  HooksLock lock(*step);
  if (d->pending_in != nullptr) {
    for (HandleData*& p : d->pending_in->pending) {
      if (p == d) p = nullptr;
    }
  }
  if (!d->kept.defined() && !step->closed()) step->HandleDied(d->storage);
  delete d;
}

void HandleDealloc(PyObject* self) {
  auto* h = reinterpret_cast<HandleObject*>(self);
  if (h->data != nullptr) ReleaseHandle(h->data);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject HandleType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void InitHandleType() {
  HandleType.tp_name = "remat.torch._native.SavedHandle";
  HandleType.tp_basicsize = sizeof(HandleObject);
  HandleType.tp_flags = Py_TPFLAGS_DEFAULT;
  HandleType.tp_doc = "A tensor autograd saved, held by remat's runtime.";
  HandleType.tp_dealloc = HandleDealloc;
  HandleType.tp_new = nullptr;  // made only by the pack hook
}

// The hooks' `self`: a capsule holding the step.
constexpr const char* kStepCapsule = "remat.torch._native.step";

std::shared_ptr<Step>* StepOf(PyObject* self) {
  return static_cast<std::shared_ptr<Step>*>(PyCapsule_GetPointer(self, kStepCapsule));
}

// The handle of t, saved by autograd for the step: the storage handed to
// the runtime (or kept, as autograd would keep it).
HandleData* PackHandle(const std::shared_ptr<Step>& step, const at::Tensor& t,
                       bool cpp_hooks) {
  HooksLock lock(*step);
  if (cpp_hooks) ++step->counts.saved_by_cpp_hooks;
  // (What a handle keeps is a shallow copy sharing the version counter: a
  // reference to t's own TensorImpl would make its Python object outlive
  // the hook, which costs microseconds.)
  auto d = std::make_unique<HandleData>(HandleData{step, at::Tensor(), -1, {}, {}, 0,
                                                   t.scalar_type(),
                                                   t.is_leaf() && t.requires_grad(), nullptr});
  SaveFacts(d.get(), t);
  if (tls_step == step.get() && tls_top != nullptr) {
    // Saved inside a call still running: its outputs and writes are not
    // recorded yet. Kept until the call ends, then handed over.
    d->kept = t.tensor_data();
    d->pending_in = tls_top;
    tls_top->pending.push_back(d.get());
  } else {
    try {
      Resolve(d.get(), t);
    } catch (...) {
      // The handle goes as one that kept its tensor (it names no storage).
      d->kept = t.tensor_data();
      d->storage = -1;
      ReleaseHandle(d.release());
      throw;
    }
  }
  return d.release();
}

// The tensor a handle stands for, brought back where the runtime dropped it.
at::Tensor UnpackHandle(HandleData* h) {
  HooksLock lock(*h->step);
  at::Tensor moved = CheckSaved(h);
  if (moved.defined()) return moved;
  if (h->kept.defined()) {
    // Still in its call, the handle's copy becomes the step's once the call
    // ends (Resolve): the caller gets a copy of its own to change.
    return h->pending_in != nullptr ? h->kept.tensor_data() : h->kept;
  }
  return h->step->Unpack(h->storage, h->sizes, h->strides, h->offset, h->dtype);
}

PyObject* PackHook(PyObject* self, PyObject* arg) {
  try {
    std::shared_ptr<Step>* step = StepOf(self);
    if (step == nullptr || !THPVariable_Check(arg)) {
      Py_INCREF(arg);
      return arg;
    }
    HandleData* d = PackHandle(*step, THPVariable_Unpack(arg), /*cpp_hooks=*/false);
    auto* h = PyObject_New(HandleObject, &HandleType);
    if (h == nullptr) {
      ReleaseHandle(d);
      return nullptr;
    }
    h->data = d;
    return reinterpret_cast<PyObject*>(h);
  } catch (...) {
    return SetPythonError();
  }
}

PyObject* UnpackHook(PyObject* /*self*/, PyObject* arg) {
  if (Py_TYPE(arg) != &HandleType) {
    Py_INCREF(arg);
    return arg;
  }
  try {
    return THPVariable_Wrap(UnpackHandle(reinterpret_cast<HandleObject*>(arg)->data));
  } catch (...) {
    return SetPythonError();
  }
}

PyMethodDef kPackDef = {"pack", PackHook, METH_O, "remat's pack hook"};
PyMethodDef kUnpackDef = {"unpack", UnpackHook, METH_O, "remat's unpack hook"};

// --- the same hooks, called from C++ ------------------------------------------------------
//
// For each tensor it saves, autograd asks the default engine for hooks
// (Engine::get_default_saved_variable_hooks). PyTorch's Python engine answers
// with the pair on top of saved_tensors_hooks' stack, called through Python:
// the GIL taken, the tensor wrapped in a Python object and the hook called,
// once to pack and once to unpack, about 3 us a saved tensor. Where that top
// is a step's own pack function, the engine below answers with C++ hooks over
// the same step instead, so a saved tensor never meets Python. Anything else
// on top (the program's own hooks, checkpoint's, keep_saved() having popped
// the step's) goes to PyTorch's engine as before, and so does every other
// call on this engine.

// An error out of a C++ hook as the Python error it would have raised from
// the Python one (remat.torch.BudgetTooSmall, the in-place error), carried
// across autograd's threads by PyTorch's python_error.
[[noreturn]] void ThrowAsPython() {
  py::gil_scoped_acquire gil;
  SetPythonError();  // (from the exception being handled)
  python_error error;
  error.persist();
  throw error;
}

PyObject* g_unpack_fn = nullptr;  // UnpackHook as a Python function of no step

class NativeHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit NativeHooks(std::shared_ptr<Step>* step) : step_(step) {}
  ~NativeHooks() override {
    if (handle_ != nullptr) {
      py::gil_scoped_acquire gil;
      Py_DECREF(handle_);  // (its data goes with it)
    } else if (data_ != nullptr) {
      ReleaseHandle(data_);
    }
  }
  void call_pack_hook(const at::Tensor& t) override {
    try {
      data_ = PackHandle(*step_, t, /*cpp_hooks=*/true);
    } catch (...) {
      ThrowAsPython();
    }
  }
  at::Tensor call_unpack_hook() override {
    try {
      return UnpackHandle(handle_ != nullptr ? reinterpret_cast<HandleObject*>(handle_)->data
                                             : data_);
    } catch (...) {
      ThrowAsPython();
    }
  }
  // Compiled autograd calls the unpack hook from its graph, in Python: the
  // Python hook, over a Python handle that takes this one's data.
  std::optional<std::pair<c10::SafePyObject, c10::SafePyObject>> retrieve_unpack_hook_data()
      const override {
    py::gil_scoped_acquire gil;
    if (handle_ == nullptr) {
      auto* h = PyObject_New(HandleObject, &HandleType);
      if (h == nullptr) throw python_error();
      h->data = data_;
      data_ = nullptr;
      handle_ = reinterpret_cast<PyObject*>(h);
    }
    Py_INCREF(g_unpack_fn);
    Py_INCREF(handle_);
    return std::make_pair(c10::SafePyObject(g_unpack_fn, getPyInterpreter()),
                          c10::SafePyObject(handle_, getPyInterpreter()));
  }

 private:
  // The capsule's (the pack function on the stack holds it while this is
  // made; data_ holds the step itself from the pack on).
  std::shared_ptr<Step>* step_;
  mutable HandleData* data_ = nullptr;
  mutable PyObject* handle_ = nullptr;  // once compiled autograd asked: the Python handle
};

// The step whose pack function is on top of this thread's saved-tensor hooks,
// or null. (Read without the GIL: the stack holds the function, and a
// function object and its capsule do not change once made.)
std::shared_ptr<Step>* StepOnTop() {
  const at::impl::SavedTensorDefaultHooksTLS& tls = at::SavedTensorDefaultHooks::get_tls_state();
  if (tls.stack.empty() || tls.is_tracing) return nullptr;
  const c10::SafePyObject& pack = tls.stack.top().first;
  PyObject* fn = pack.ptr(&pack.pyinterpreter());
  if (!Py_IS_TYPE(fn, &PyCFunction_Type) || PyCFunction_GET_FUNCTION(fn) != &PackHook) {
    return nullptr;
  }
  return StepOf(PyCFunction_GET_SELF(fn));
}

torch::autograd::Engine* g_python_engine = nullptr;  // PyTorch's default before ours

class HooksEngine final : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks()
      override {
    if (std::shared_ptr<Step>* step = StepOnTop(); step != nullptr && !(*step)->closed()) {
      return std::make_unique<NativeHooks>(step);
    }
    return g_python_engine->get_default_saved_variable_hooks();
  }
  torch::autograd::variable_list execute(const torch::autograd::edge_list& roots,
                                         const torch::autograd::variable_list& inputs,
                                         bool keep_graph, bool create_graph,
                                         bool accumulate_grad,
                                         const torch::autograd::edge_list& outputs) override {
    return g_python_engine->execute(roots, inputs, keep_graph, create_graph, accumulate_grad,
                                    outputs);
  }
  c10::intrusive_ptr<at::ivalue::Future> execute_with_graph_task(
      const std::shared_ptr<torch::autograd::GraphTask>& graph_task,
      c10::intrusive_ptr<torch::autograd::Node> graph_root,
      torch::autograd::InputBuffer&& input_buffer) override {
    return g_python_engine->execute_with_graph_task(graph_task, std::move(graph_root),
                                                    std::move(input_buffer));
  }
  std::unique_ptr<torch::autograd::AnomalyMetadata> make_anomaly_metadata() override {
    return g_python_engine->make_anomaly_metadata();
  }
  std::vector<std::unique_ptr<torch::autograd::NodeCreationHook>> get_node_creation_hooks()
      override {
    return g_python_engine->get_node_creation_hooks();
  }
  void thread_on_exception(const std::shared_ptr<torch::autograd::GraphTask>& graph_task,
                           const c10::intrusive_ptr<torch::autograd::Node>& fn,
                           std::exception& e) override {
    g_python_engine->thread_on_exception(graph_task, fn, e);
  }
};

torch::autograd::Engine& HooksEngineStub() {
  static HooksEngine* engine = new HooksEngine();  // (never destroyed: engines outlive modules)
  return *engine;
}

// Makes HooksEngine the default engine, once per process.
void InstallHooksEngine() {
  torch::autograd::Engine& current = torch::autograd::Engine::get_default_engine();
  if (&current == &HooksEngineStub()) return;
  g_python_engine = &current;
  torch::autograd::set_default_engine_stub(&HooksEngineStub);
}

// --- Step, as Python sees it --------------------------------------------------------------

class StepBox {
 public:
  StepBox(std::shared_ptr<Session> session, bool recompute, bool allow_nondeterministic,
          double tflops, double hbm_gbps, bool model_costs, bool offload, bool drop_first,
          uintptr_t planner, uint64_t replay_room, bool backups)
      : session_(std::move(session)) {
    if (session_->step() != nullptr) {
      throw std::runtime_error("remat: a native session runs one step at a time");
    }
    StepOptions options;
    options.recompute = recompute;
    options.allow_nondeterministic = allow_nondeterministic;
    options.rates.tflops = tflops;
    options.rates.hbm_gbps = hbm_gbps;
    options.model_costs = model_costs;
    options.offload = offload;
    options.drop_first = drop_first;
    options.planner = reinterpret_cast<remat_planner*>(planner);
    options.replay_room = replay_room;
    options.backups = backups;
    step_ = std::make_shared<Step>(session_, options);
    session_->set_step(step_.get());
    auto* holder = new std::shared_ptr<Step>(step_);
    capsule_ = py::reinterpret_steal<py::object>(
        PyCapsule_New(holder, kStepCapsule, [](PyObject* c) {
          delete static_cast<std::shared_ptr<Step>*>(PyCapsule_GetPointer(c, kStepCapsule));
        }));
    pack_ = py::reinterpret_steal<py::object>(PyCFunction_New(&kPackDef, capsule_.ptr()));
    unpack_ = py::reinterpret_steal<py::object>(PyCFunction_New(&kUnpackDef, capsule_.ptr()));
  }

  // Records this thread's calls from now on.
  void Start() {
    if (tls_step != nullptr) throw std::runtime_error("remat: a step is recording on this thread");
    tls_step = step_.get();
    tls_top = nullptr;
    AddCallback();
  }

  void AddCallback() {
    callback_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&OnCallStart, &OnCallEnd)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }

  void Stop() {
    Pause();
    if (tls_step == step_.get()) tls_step = nullptr;
    tls_top = nullptr;
  }

  // The recorder off while a backward runs on this thread (it records
  // nothing there, and every call through RecordFunction costs its boxing).
  // Pauses nest: a backward inside a backward's node (a reentrant
  // checkpoint) pauses and resumes inside the outer one's pause. (Resumed
  // there, the callback would go with the node's thread-local state, and the
  // recorder stay off for the rest of the step.)
  void Pause() {
    if (pauses_++ == 0 && callback_ != 0) {
      at::removeCallback(callback_);
      callback_ = 0;
    }
  }

  void Resume() {
    if (pauses_ > 0 && --pauses_ > 0) return;
    if (callback_ == 0 && tls_step == step_.get() && !step_->closed()) AddCallback();
  }

  void Close() {
    Stop();
    if (step_->closed()) return;
    try {
      HooksLock lock(*step_);
      step_->Close();
    } catch (...) {
      session_->set_step(nullptr);
      throw;
    }
    session_->set_step(nullptr);
  }

  // What the step's statistics show: its runtime's counters over the step
  // (since the step began), and the step's own counts.
  py::dict Figures() const {
    remat_runtime_stats st = session_->Stats();
    const remat_runtime_stats& start = step_->start_stats;
    py::dict d = Counts();
    d["peak_saved_bytes"] = st.peak_resident_bytes;
    d["saved_bytes"] = st.resident_bytes;
    d["drops"] = st.drops - start.drops;
    d["recomputes"] = st.recomputes - start.recomputes;
    d["offloads"] = st.offloads - start.offloads;
    d["restores"] = step_->counts.restores;
    d["recompute_seconds"] = step_->recompute_seconds;
    d["recompute_ns_estimate"] = st.recompute_ns - start.recompute_ns;
    d["copy_seconds"] = step_->copy_seconds;
    d["offloaded_bytes"] = st.offloaded_bytes - start.offloaded_bytes;
    d["restored_bytes"] = st.restored_bytes - start.restored_bytes;
    d["prefetches"] = st.prefetches - start.prefetches;
    d["refills"] = st.refills - start.refills;
    d["copies_ahead"] = 0;
    d["ahead_offloads"] = 0;
    d["pressure_events"] = st.pressure_events - start.pressure_events;
    d["learned_next_uses"] = st.learned_next_uses - start.learned_next_uses;
    d["step"] = st.steps_ended;
    return d;
  }

  py::dict Counts() const {
    const Step::Counts& c = step_->counts;
    py::dict d;
    d["saved_tensors"] = c.saved_tensors;
    d["saved_unmanaged"] = c.saved_unmanaged;
    d["kept_not_replayable"] = c.kept_not_replayable;
    d["pinned_by_write"] = c.pinned_by_write;
    d["recomputed_calls"] = c.recomputed_calls;
    d["recorded_calls"] = c.recorded_calls;
    d["saved_by_cpp_hooks"] = c.saved_by_cpp_hooks;
    if (step_->options().offload) {
      d["offload_not_drop"] = c.offload_not_drop;
      d["offload_not_drop_seen"] = c.offload_not_drop_seen;
      d["offload_not_drop_failed"] = c.offload_not_drop_failed;
      d["backups"] = c.backups;
      d["backup_bytes"] = c.backup_bytes;
      d["backups_used"] = c.backups_used;
      d["backups_skipped"] = c.backups_skipped;
    }
    d["rebuilt_in_replay"] = c.rebuilt_in_replay;
    return d;
  }
  void Exported(const at::Tensor& t) {
    HooksLock lock(*step_);
    step_->Exported(t);
  }
  double recompute_seconds() const { return step_->recompute_seconds; }
  double copy_seconds() const { return step_->copy_seconds; }
  int64_t restores() const { return step_->counts.restores; }
  void ReportUnfit() {
    HooksLock lock(*step_);
    step_->ReportUnfit();
  }
  bool closed() const { return step_->closed(); }
  py::object pack() const { return pack_; }
  // The kinds the saved tensors were given, in the order they were handed
  // to the runtime: (op, kind), for the tests of what steps learn.
  py::list Kinds() const {
    py::list out;
    for (const auto& [op, kind] : step_->KindsHanded()) out.append(py::make_tuple(op, kind));
    return out;
  }
  py::object unpack() const { return unpack_; }

 private:
  std::shared_ptr<Session> session_;
  std::shared_ptr<Step> step_;
  py::object capsule_, pack_, unpack_;
  at::CallbackHandle callback_ = 0;
  int pauses_ = 0;  // Pause()s not yet resumed
};

py::dict StatsOf(const Session& s) {
  remat_runtime_stats st = s.Stats();
  py::dict d;
#define REMAT_FIELD(name) d[#name] = st.name
  REMAT_FIELD(tensors_created);
  REMAT_FIELD(live_tensors);
  REMAT_FIELD(pressure_events);
  REMAT_FIELD(drops);
  REMAT_FIELD(released_drops);
  REMAT_FIELD(offloads);
  REMAT_FIELD(recomputes);
  REMAT_FIELD(recompute_ns);
  REMAT_FIELD(offloaded_bytes);
  REMAT_FIELD(restored_bytes);
  REMAT_FIELD(prefetches);
  REMAT_FIELD(resident_bytes);
  REMAT_FIELD(peak_resident_bytes);
  REMAT_FIELD(pinned_by_api);
  REMAT_FIELD(learned_next_uses);
  REMAT_FIELD(steps_ended);
  REMAT_FIELD(copies_ahead);
  REMAT_FIELD(ahead_offloads);
  REMAT_FIELD(refills);
#undef REMAT_FIELD
  return d;
}

}  // namespace
}  // namespace remat_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace remat_torch;
  InitHandleType();
  if (PyType_Ready(&HandleType) < 0) throw py::error_already_set();
  g_unpack_fn = PyCFunction_New(&kUnpackDef, nullptr);  // (kept for the process)
  if (g_unpack_fn == nullptr) throw py::error_already_set();
  InstallHooksEngine();
  Py_INCREF(&HandleType);
  m.add_object("SavedHandle", reinterpret_cast<PyObject*>(&HandleType));
  m.attr("TORCH_VERSION") = TORCH_VERSION;
  // A C++ BudgetTooSmall out of a Step method is remat.torch.BudgetTooSmall.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BudgetTooSmall& e) {
      PyErr_SetString(g_budget_too_small != nullptr ? g_budget_too_small : PyExc_RuntimeError,
                      e.what());
    }
  });
  m.def("set_python_hooks", [](py::object python_body, py::object rng_get, py::object rng_set) {
    g_python_body_fn = python_body.release().ptr();
    g_rng_get = rng_get.release().ptr();
    g_rng_set = rng_set.release().ptr();
    g_python_body = &PythonBody;
  });
  m.def("set_inplace_error", [](py::object fn) {
    Py_XDECREF(g_inplace_error);
    g_inplace_error = fn.release().ptr();
  });
  m.def("set_budget_too_small", [](py::object cls) {
    Py_XDECREF(g_budget_too_small);
    g_budget_too_small = cls.release().ptr();
  });
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init<uint64_t, std::string, bool, bool, double, int64_t>(),
           py::arg("budget_bytes"), py::arg("policy"), py::arg("recompute"),
           py::arg("offload") = false, py::arg("link_gbps") = 0.0,
           py::arg("link_latency_ns") = -1)
      .def("stats", [](const Session& s) { return StatsOf(s); });
  py::class_<StepBox>(m, "Step")
      .def(py::init<std::shared_ptr<Session>, bool, bool, double, double, bool, bool, bool,
                    uintptr_t, uint64_t, bool>(),
           py::arg("session"), py::arg("recompute"), py::arg("allow_nondeterministic"),
           py::arg("tflops"), py::arg("hbm_gbps"), py::arg("model_costs"),
           py::arg("offload") = false, py::arg("drop_first") = false, py::arg("planner") = 0,
           py::arg("replay_room") = 0, py::arg("backups") = true)
      .def("start", &StepBox::Start)
      .def("stop", &StepBox::Stop)
      .def("pause", &StepBox::Pause)
      .def("resume", &StepBox::Resume)
      .def("close", &StepBox::Close)
      .def("counts", &StepBox::Counts)
      .def("figures", &StepBox::Figures)
      .def("exported", &StepBox::Exported)
      .def("report_unfit", &StepBox::ReportUnfit)
      .def("kinds", &StepBox::Kinds)
      .def_property_readonly("recompute_seconds", &StepBox::recompute_seconds)
      .def_property_readonly("copy_seconds", &StepBox::copy_seconds)
      .def_property_readonly("restores", &StepBox::restores)
      .def_property_readonly("closed", &StepBox::closed)
      .def_property_readonly("pack", &StepBox::pack)
      .def_property_readonly("unpack", &StepBox::unpack);
}
