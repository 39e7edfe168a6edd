"""remat.torch.budget bitwise equal to a plain step on patterns that step
around autograd: random custom ops, in-place writes autograd forbids, writes
through numpy and `.data`, and tensors made under torch.inference_mode()."""

import random

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
np = pytest.importorskip("numpy")

import remat.torch  # noqa: E402

# Drops alone, and drops with offloads (the hybrid policy).
CONFIGS = {"drop": dict(offload=False, recompute=True, policy="dtr"),
           "hybrid": dict(offload=True, recompute=True, policy="hybrid")}


def _seed(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _same_rng(a, b):
    return (torch.equal(a[0], b[0]) and a[1][0] == b[1][0] and np.array_equal(a[1][1], b[1][1])
            and a[1][2:] == b[1][2:] and a[2] == b[2])


def _run(make, b=None):
    """One step of make's model (built afresh, same seeds): the gradients by
    name, the loss, the generator states after the step and the stats."""
    model, step = make(0)
    _seed(1)
    if b is None:
        loss = step()
        loss.backward()
    else:
        with b:
            loss = step()
            loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, loss.detach(), _rng_states(), None if b is None else b.stats


def _saved_bytes(make):
    model, step = make(0)
    _seed(1)
    with remat.torch.budget(1 << 40) as run:
        step().backward()
    return run.stats["peak_saved_bytes"]


def _check_exact(make, config, ratio):
    """A budgeted step (at `ratio` of the saved bytes, None: unlimited) is
    bitwise the plain step: every gradient, the loss and the generators'
    states after it. Returns its stats."""
    plain_grads, plain_loss, plain_rng, _ = _run(make)
    budget = 1 << 40 if ratio is None else int(_saved_bytes(make) * ratio)
    grads, loss, rng, stats = _run(make, remat.torch.budget(budget, **CONFIGS[config]))
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], plain_grads[name]), f"gradient of {name} differs"
    assert torch.equal(loss, plain_loss)
    assert _same_rng(rng, plain_rng), "the generators' states after the step differ"
    if ratio is not None and ratio < 0.5:
        assert stats["drops"] > 0 and stats["recomputes"] > 0, "nothing replayed: proves nothing"
    return stats


# --- random custom ops ------------------------------------------------------------------

@torch.library.custom_op("remat_exact_test::torch_dropout", mutates_args=())
def _torch_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    # A fused dropout as libraries expose one: its mask drawn inside the op
    # (untagged: nothing says it is random).
    mask = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
    return x * mask, mask


@torch.library.custom_op("remat_exact_test::numpy_dropout", mutates_args=())
def _numpy_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.from_numpy((np.random.rand(*x.shape) >= p).astype(np.float32)) / (1 - p)
    return x * mask, mask


@torch.library.custom_op("remat_exact_test::python_dropout", mutates_args=())
def _python_dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tensor([float(random.random() >= p) for _ in range(x.numel())]).view(x.shape)
    return x * mask, mask


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _backward(ctx, grad, _grad_mask):
    mask, = ctx.saved_tensors
    return grad * mask, None


for _op in (_torch_dropout, _numpy_dropout, _python_dropout):
    _op.register_autograd(_backward, setup_context=_setup)
    _op.register_fake(lambda x, p: (torch.empty_like(x), torch.empty_like(x)))

DROPOUTS = {"torch": _torch_dropout, "numpy": _numpy_dropout, "python": _python_dropout}


def _dropout_net(op, device="cpu"):
    def make(seed):
        _seed(seed)
        model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)]).to(device)
        x = torch.randn(16, 32, device=device)

        def step():
            h = x
            for lin in model:
                h = torch.tanh(op(lin(h), 0.3)[0])
            return h.square().mean()
        return model, step
    return make


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("ratio", [0.3, 0.6, None])
@pytest.mark.parametrize("source", list(DROPOUTS))
def test_a_custom_op_drawing_random_numbers_replays_its_draws(source, ratio, config):
    # Replayed under the generator states it drew from, whichever it drew
    # from, and the live states are as a plain step leaves them.
    _check_exact(_dropout_net(DROPOUTS[source]), config, ratio)


def test_only_an_op_with_a_python_body_saves_numpys_and_pythons_rng():
    # Their states cost some tens of microseconds to save: an operator whose
    # kernels are all C++ (its fake kernel may be Python) draws from neither.
    from remat.torch._recorder import _op_info
    assert _op_info(torch.ops.remat_exact_test.numpy_dropout.default).python_body
    for op in (torch.ops.aten.sin.default, torch.ops.aten.native_dropout.default):
        assert not _op_info(op).custom and not _op_info(op).python_body
    cpp = getattr(getattr(torch.ops, "quantized", None), "linear_dynamic", None)
    if cpp is not None:
        assert _op_info(cpp.default).custom and not _op_info(cpp.default).python_body


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_custom_op_drawing_on_cuda_replays_its_draws(config):
    # Its draws come from the CUDA device's generator: saved and set as the
    # CPU's are, and left where a plain step leaves it.
    make = _dropout_net(_torch_dropout, "cuda")
    states = []
    for b in (None, remat.torch.budget(int(_saved_bytes(make) * 0.3), **CONFIGS[config])):
        grads, loss, _, stats = _run(make, b)
        states.append((grads, loss, torch.cuda.get_rng_state()))
    (plain, plain_loss, plain_rng), (grads, loss, rng) = states
    for name in plain:
        assert torch.equal(grads[name], plain[name]), f"gradient of {name} differs"
    assert torch.equal(loss, plain_loss) and torch.equal(rng, plain_rng)
    assert stats["recomputes"] > 0


# --- tensors made under torch.inference_mode() ------------------------------------------

def _frozen_features(inside):
    """A frozen backbone run under torch.inference_mode() (before the
    budget, or inside it), and a trainable head on its features."""
    def make(seed):
        _seed(seed)
        backbone = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU())
        head = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(64, 64),
                                                                    torch.nn.Tanh())])
        x = torch.randn(32, 32)
        with torch.inference_mode():
            before = backbone(x)

        def step():
            if inside:
                with torch.inference_mode():
                    feat = backbone(x)
                    feat.mul_(2)
            else:
                feat = before
            # (autograd saves no inference tensor: the head reads a copy)
            h = (feat.clone() + 1).sin()
            return (head(h) * feat.sum()).square().mean()
        return head, step
    return make


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("ratio", [0.3, 0.6, None])
@pytest.mark.parametrize("inside", [False, True])
def test_inference_tensors_are_read_as_constants(inside, ratio, config):
    _check_exact(_frozen_features(inside), config, ratio)


# --- in-place writes autograd forbids ---------------------------------------------------

def _raised(step):
    """The message the step's backward raised with (a RuntimeError), or None."""
    try:
        step()
    except RuntimeError as e:
        return str(e)
    return None


def _inplace_step(which):
    _seed(0)
    lin = torch.nn.Linear(64, 64)
    tail = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(32, 64)

    def step():
        h = lin(x)
        if which == "input":
            y = h.sin()          # saves h
            h.mul_(2)
        elif which == "output":
            y = h.tanh()         # saves y
            y.mul_(2)
        else:                    # a detached alias of a saved output, the output gone
            y = h.exp()
            d = y.detach()
            y = y * 1
            d.add_(1)
        loss = tail(y).square().mean()
        loss.backward()
    return step


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("budget", [28 * 1024, 48 * 1024, 1 << 40])
@pytest.mark.parametrize("which", ["input", "output", "detached"])
def test_a_saved_tensor_modified_in_place_raises_as_in_a_plain_step(which, budget, config):
    plain = _raised(_inplace_step(which))
    assert plain is not None and "modified by an inplace operation" in plain
    step = _inplace_step(which)
    with remat.torch.budget(budget, **CONFIGS[config]):
        assert _raised(step) == plain


def _gan(seed):
    _seed(seed)
    g = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))
    d = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
    z = torch.randn(32, 16)

    def step():
        out = d(g(z))
        loss_d = out.mean()
        loss_g = -out.mean()
        loss_d.backward(retain_graph=True)
        opt_d.step()             # D's weights, saved for loss_g's backward, move on
        loss_g.backward()
    return step


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("budget", [12 * 1024, 30 * 1024, 1 << 40])
def test_an_optimizer_step_between_two_backwards_raises_as_in_a_plain_step(budget, config):
    plain = _raised(_gan(0))
    assert plain is not None and "modified by an inplace operation" in plain
    step = _gan(0)
    with remat.torch.budget(budget, **CONFIGS[config]):
        assert _raised(step) == plain


def test_the_in_place_error_names_anomaly_modes_hint():
    with torch.autograd.set_detect_anomaly(True):
        with pytest.warns(UserWarning):
            plain = _raised(_inplace_step("input"))
        step = _inplace_step("input")
        with remat.torch.budget(1 << 40):
            with pytest.warns(UserWarning):
                assert _raised(step) == plain
    assert "Good luck" in plain


# --- writes outside autograd: numpy, `.data =` ------------------------------------------

def _written_outside(how):
    """Saved activations written where no ATen call is recorded: through a
    numpy array over their bytes (or the input's, which made them), or by
    `.data =` (the tensor is moved onto other bytes). Each is read by the
    backward, and by later calls whose outputs are saved."""
    def make(seed):
        _seed(seed)
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(16)])
        x = torch.randn(32, 64)

        def step():
            first, *rest = model
            h = first(x)
            y = h.sin()                       # saves h (as an input)
            z = h.tanh()                      # saves z (as an output)
            if how == "numpy input":
                xs = x.numpy()
                xs *= 0.5                     # the input's bytes, read by h's call
            elif how == "numpy":
                a = h.detach().numpy()
                np.clip(a, -0.1, 0.1, out=a)  # h's bytes, written
                b = z.detach().numpy()
                b *= 0.5                      # z's bytes, written
                del a, b
            else:
                h.data = h.data * 0.5         # h moved onto new bytes
                z.data = z.data * 0.5         # so is z
            u = (h * 3).exp()                 # reads h as written
            out = y + z + u
            for lin in rest:
                out = torch.tanh(lin(out))
            return out.square().mean()
        return model, step
    return make


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("ratio", [0.4, 0.7, None])  # (what must stay resident: 0.3 is too small)
@pytest.mark.parametrize("how", ["numpy", "numpy input", "data"])
def test_a_write_outside_autograd_reads_as_in_a_plain_step(how, ratio, config):
    _check_exact(_written_outside(how), config, ratio)


# --- reads of what the step writes where no version counter moves ------------------------

def _written_unseen(which):
    """Steps whose saved tensors are made from bytes written later in ways
    a tensor's version counter does not show: through `.data`, by batch
    norm's kernel (its running statistics), under inference mode; and a
    Python number's type promotion, which a replay must keep."""
    torch.manual_seed(0)
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64)
    k = torch.randint(0, 10, (64, 64))
    bn = torch.nn.BatchNorm1d(64)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2)
    lin = torch.nn.Linear(64, 64)
    x2 = torch.randn(64, 64) * 3 + 2
    state = {n: v.clone() for n, v in bn.state_dict().items()}
    w0 = w.clone()

    def step():
        x.grad = None
        lin.zero_grad()
        w.copy_(w0)
        bn.load_state_dict(state)
        # (Each intermediate is let go as soon as it is read: a replay must
        # then run its call again, from what that call read.)
        if which == "data":
            h = torch.sin(x) * 1.0
            g = h + w                     # reads w (and saves nothing)
            del h
            w.data.mul_(0.5)              # written through .data: w's counter stays
            y = g.sin()                   # saves g
            del g
        elif which == "inference mode":
            h = torch.sin(x) * 1.5        # the program keeps h
            g = h * 2                     # reads h (and saves nothing)
            y = g.sin()                   # saves g
            del g
        elif which == "batch norm in evaluation":
            bn.eval()
            a = bn(lin(x))                # reads the running statistics
            y = a.sin()
            del a
            bn.train()
            b = bn(lin(x2))               # writes them, in its kernel
            y = (y * 2).tanh() + (b.cos() * 2).tanh()
            del b
        else:                             # a Python number's promotion
            s = k * 0.5                   # int64 tensor times a float: float32
            y = x * s                     # saves s
            del s
        z = (y * 3).cos()
        del y
        u = (z * 2).tanh()
        del z
        if which == "inference mode":
            with torch.inference_mode():
                h.add_(1)                 # after g's call read h
        u.sum().backward()
        return x.grad.clone() if which != "batch norm in evaluation" else lin.weight.grad.clone()
    return step


@pytest.mark.parametrize("which", ["data", "inference mode", "batch norm in evaluation",
                                   "python number"])
def test_what_a_replay_reads_is_what_the_call_read(which):
    plain = _written_unseen(which)()
    replayed = 0
    for nbytes in (20_000, 40_000, 60_000, 1 << 40):
        step = _written_unseen(which)
        try:
            with remat.torch.budget(nbytes, **CONFIGS["drop"]) as run:
                got = step()
        except remat.torch.BudgetTooSmall:
            continue  # (what it must keep does not fit: said, not wrong)
        assert torch.equal(got, plain), f"{which}, budget {nbytes}"
        replayed += run.stats["recomputes"]
    assert replayed > 0, "nothing replayed: proves nothing"
