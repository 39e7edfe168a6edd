// The Python face of the native step: the recorder (a thread-local
// RecordFunction callback), the saved-tensor hooks (C functions, with a
// handle type of their own), and the Session and Step objects _native.py
// drives once per step.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <memory>

#include "step.h"

namespace py = pybind11;

namespace remat_torch {
namespace {

PyObject* g_budget_too_small = nullptr;  // remat.torch.BudgetTooSmall

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
  bool nested = false;  // a call of its own ran inside (a composite): not recorded itself
  Frame* parent = nullptr;
  std::chrono::steady_clock::time_point start;
};

thread_local Frame* tls_top = nullptr;

void Take(RngState& rng, at::Generator g) {
  for (const auto& [seen, state] : rng.states) {
    if (seen == g) return;
  }
  std::lock_guard<std::mutex> lock(g.mutex());
  rng.states.emplace_back(g, g.get_state());
}

std::unique_ptr<at::ObserverContext> OnCallStart(const at::RecordFunction& fn) {
  Step* step = tls_step;
  if (step == nullptr || !step->WantsCall(fn)) return nullptr;
  const OpInfo& info = InfoOf(fn);
  if (info.is_view && !info.writes) {
    // Its outputs share its input's storage: nothing to record (a replay
    // rebuilds views), but a composite that calls it is not a leaf call.
    if (tls_top != nullptr) tls_top->nested = true;
    return nullptr;
  }
  if (tls_top != nullptr) tls_top->nested = true;
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
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cuda()) {
        Take(rng, at::globalContext().defaultGenerator(v.toTensor().device()));
      }
    }
    frame->rng = std::move(rng);
  }
  frame->parent = tls_top;
  tls_top = frame.get();
  frame->start = std::chrono::steady_clock::now();
  return frame;
}

void ResolvePending(Frame* frame, bool hand_over);

void OnCallEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  auto* frame = static_cast<Frame*>(ctx);
  tls_top = frame->parent;
  Step* step = tls_step;
  bool failed = std::uncaught_exceptions() > 0;
  if (frame->nested || step == nullptr || step->closed() || !frame->info->op || failed) {
    if (!frame->pending.empty()) {
      try {
        ResolvePending(frame, step != nullptr && !step->closed() && !failed);
      } catch (...) {
        if (step != nullptr) step->Defer(std::current_exception());
      }
    }
    return;
  }
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - frame->start)
                   .count();
  try {
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
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset;
  at::ScalarType dtype;
  bool grad_leaf;       // a leaf that requires grad (a parameter)
  Frame* pending_in;    // the call whose end hands it over, if any
};

// Hands the saved tensor t to the step, or keeps it as autograd would.
void Resolve(HandleData* d, const at::Tensor& t) {
  int32_t storage = d->step->Pack(t, d->grad_leaf);
  if (storage < 0) {
    if (!d->kept.defined()) d->kept = t.tensor_data();
    return;
  }
  d->storage = storage;
  d->sizes = t.sizes().vec();
  d->strides = t.strides().vec();
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
      Resolve(d, t);
    } catch (...) {
      if (!error) error = std::current_exception();  // (the rest are still handed over)
    }
  }
  if (error) std::rethrow_exception(error);
}

struct HandleObject {
  PyObject_HEAD HandleData* data;
};

void HandleDealloc(PyObject* self) {
  auto* h = reinterpret_cast<HandleObject*>(self);
  if (h->data != nullptr) {
    if (h->data->pending_in != nullptr) {
      for (HandleData*& p : h->data->pending_in->pending) {
        if (p == h->data) p = nullptr;
      }
    }
    if (!h->data->kept.defined() && !h->data->step->closed()) {
      h->data->step->HandleDied(h->data->storage);
    }
    delete h->data;
  }
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

PyObject* PackHook(PyObject* self, PyObject* arg) {
  try {
    std::shared_ptr<Step>* step = StepOf(self);
    if (step == nullptr || !THPVariable_Check(arg)) {
      Py_INCREF(arg);
      return arg;
    }
    const at::Tensor& t = THPVariable_Unpack(arg);
    auto* h = PyObject_New(HandleObject, &HandleType);
    if (h == nullptr) return nullptr;
    // (What a handle keeps is a shallow copy sharing the version counter: a
    // reference to t's own TensorImpl would make its Python object outlive
    // the hook, which costs microseconds.)
    h->data = new HandleData{*step, at::Tensor(), -1, {}, {}, 0, t.scalar_type(),
                             t.is_leaf() && t.requires_grad(), nullptr};
    if (tls_step == step->get() && tls_top != nullptr) {
      // Saved inside a call still running: its outputs and writes are not
      // recorded yet. Kept until the call ends, then handed over.
      h->data->kept = t.tensor_data();
      h->data->pending_in = tls_top;
      tls_top->pending.push_back(h->data);
    } else {
      Resolve(h->data, t);
    }
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
    HandleData* h = reinterpret_cast<HandleObject*>(arg)->data;
    if (h->kept.defined()) return THPVariable_Wrap(h->kept);
    at::Tensor t = h->step->Unpack(h->storage, h->sizes, h->strides, h->offset, h->dtype);
    return THPVariable_Wrap(std::move(t));
  } catch (...) {
    return SetPythonError();
  }
}

PyMethodDef kPackDef = {"pack", PackHook, METH_O, "remat's pack hook"};
PyMethodDef kUnpackDef = {"unpack", UnpackHook, METH_O, "remat's unpack hook"};

// --- Step, as Python sees it --------------------------------------------------------------

class StepBox {
 public:
  StepBox(std::shared_ptr<Session> session, bool recompute, bool allow_nondeterministic)
      : session_(std::move(session)) {
    if (session_->step() != nullptr) {
      throw std::runtime_error("remat: a native session runs one step at a time");
    }
    StepOptions options;
    options.recompute = recompute;
    options.allow_nondeterministic = allow_nondeterministic;
    step_ = std::make_shared<Step>(session_.get(), options);
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
    callback_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&OnCallStart, &OnCallEnd)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }

  void Stop() {
    if (callback_ != 0) {
      at::removeCallback(callback_);
      callback_ = 0;
    }
    if (tls_step == step_.get()) tls_step = nullptr;
    tls_top = nullptr;
  }

  void Close() {
    Stop();
    if (step_->closed()) return;
    try {
      step_->Close();
    } catch (...) {
      session_->set_step(nullptr);
      throw;
    }
    session_->set_step(nullptr);
  }

  py::dict Counts() const {
    const Step::Counts& c = step_->counts;
    py::dict d;
    d["saved_tensors"] = c.saved_tensors;
    d["saved_unmanaged"] = c.saved_unmanaged;
    d["kept_not_replayable"] = c.kept_not_replayable;
    d["pinned_by_write"] = c.pinned_by_write;
    d["recomputed_calls"] = c.recomputed_calls;
    return d;
  }
  double recompute_seconds() const { return step_->recompute_seconds; }
  bool closed() const { return step_->closed(); }
  py::object pack() const { return pack_; }
  py::object unpack() const { return unpack_; }

 private:
  std::shared_ptr<Session> session_;
  std::shared_ptr<Step> step_;
  py::object capsule_, pack_, unpack_;
  at::CallbackHandle callback_ = 0;
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
  Py_INCREF(&HandleType);
  m.add_object("SavedHandle", reinterpret_cast<PyObject*>(&HandleType));
  m.attr("TORCH_VERSION") = TORCH_VERSION;
  m.def("set_budget_too_small", [](py::object cls) {
    Py_XDECREF(g_budget_too_small);
    g_budget_too_small = cls.release().ptr();
  });
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init<uint64_t, std::string, bool>(), py::arg("budget_bytes"), py::arg("policy"),
           py::arg("recompute"))
      .def("stats", [](const Session& s) { return StatsOf(s); });
  py::class_<StepBox>(m, "Step")
      .def(py::init<std::shared_ptr<Session>, bool, bool>(), py::arg("session"),
           py::arg("recompute"), py::arg("allow_nondeterministic"))
      .def("start", &StepBox::Start)
      .def("stop", &StepBox::Stop)
      .def("close", &StepBox::Close)
      .def("counts", &StepBox::Counts)
      .def_property_readonly("recompute_seconds", &StepBox::recompute_seconds)
      .def_property_readonly("closed", &StepBox::closed)
      .def_property_readonly("pack", &StepBox::pack)
      .def_property_readonly("unpack", &StepBox::unpack);
}
