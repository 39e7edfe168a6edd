"""Models written the ways people write them, for the tests and the sweep
(bench/torch_zoo.py): PyTorch's own recurrent and attention layers,
normalisation with running statistics, autocast, custom autograd functions,
data-dependent shapes, gradient accumulation, checkpointing inside the
budget. Each `make(seed, device="cpu")` returns (model, step) where step() runs the
forward (and, for accumulation, a backward of its own) and returns the loss
the caller's backward starts from; ZOO names them, and PATTERNS the
training steps that do more (an optimizer step, a double backward, two
backwards, hooks, a GAN's two losses) or reach for less common parts of
PyTorch (channels-last, complex tensors, distributions, packed sequences,
an embedding with max_norm, bfloat16)."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _on(device, *objects):
    """The model and the step's inputs on `device` (made on the CPU first,
    so that a seed gives the same values on every device)."""
    return tuple(o.to(device) for o in objects)


def run_step(make, budget=None, device="cpu"):
    """One step of a zoo model made afresh (seed 0, train mode, the step's
    random draws from seed 1), inside `budget` if one is given: its loss,
    its parameters' gradients and its buffers, to compare with a plain
    step's."""
    model, step = make(0, device=device)
    model.train()
    torch.manual_seed(1)
    if budget is None:
        loss = step()
        loss.backward()
    else:
        with budget:
            loss = step()
            loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, dict(model.named_buffers())


def _lm_loss(logits, targets, **kw):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), **kw)


def lstm(seed, device="cpu"):
    # nn.LSTM's CPU kernel makes the workspace its backward reads only with
    # grad mode on: a replay must run in the mode the call ran in.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"rnn": nn.LSTM(16, 32, num_layers=2, bidirectional=True, dropout=0.2),
                       "head": nn.Linear(64, 5)})
    x, y = torch.randn(12, 4, 16), torch.randint(0, 5, (4,))
    m, x, y = _on(device, m, x, y)

    def step():
        out, (_, c) = m["rnn"](x)
        return F.cross_entropy(m["head"](out[-1]), y) + 0.1 * c.square().mean()
    return m, step


def gru(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.ModuleDict({"emb": nn.Embedding(50, 32),
                       "rnn": nn.GRU(32, 48, num_layers=2, batch_first=True, dropout=0.1),
                       "head": nn.Linear(48, 50)})
    ids = torch.randint(0, 50, (4, 13))
    m, ids = _on(device, m, ids)

    def step():
        h, _ = m["rnn"](m["emb"](ids[:, :-1]))
        return _lm_loss(m["head"](h), ids[:, 1:])
    return m, step


def norms(seed, device="cpu"):
    # InstanceNorm with running statistics writes a repeat of them, then the
    # statistics themselves, during the forward.
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU(),
                      nn.Conv2d(8, 8, 3, padding=1),
                      nn.InstanceNorm2d(8, affine=True, track_running_stats=True), nn.Mish(),
                      nn.Flatten(2), nn.BatchNorm1d(8), nn.PReLU())
    x = torch.randn(4, 3, 8, 8)
    m, x = _on(device, m, x)

    def step():
        return m(x).square().mean()
    return m, step


def transformer(seed, device="cpu"):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
    m = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(3, 10, 32)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[1, 7:] = True
    m, x, pad = _on(device, m, x, pad)

    def step():
        return m(x, src_key_padding_mask=pad).square().mean()
    return m, step


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


def sdpa(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.Sequential(_Attention(), nn.GELU(), _Attention())
    x = torch.randn(2, 16, 32)
    m, x = _on(device, m, x)

    def step():
        return m(x).square().mean()
    return m, step


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 24, padding_idx=0)
        self.mid = nn.Linear(24, 24)
        self.out = nn.Linear(24, 40, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        return self.out(torch.tanh(self.mid(self.emb(ids))))


def tied_lm(seed, device="cpu"):
    torch.manual_seed(seed)
    m = _TiedLM()
    ids = torch.randint(0, 40, (4, 11))
    ids[0, 5:] = 0
    targets = ids[:, 1:].clone()
    targets[targets == 0] = -100
    m, ids, targets = _on(device, m, ids, targets)

    def step():
        return _lm_loss(m(ids[:, :-1]), targets, label_smoothing=0.1, ignore_index=-100)
    return m, step


def autocast(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64),
                      nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    m, x, y = _on(device, m, x, y)

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return F.cross_entropy(m(x), y)
    return m, step


class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 1)

    def forward(self, x):
        h = F.relu(self.a(x), inplace=True)
        g = self.b(h)
        g += h
        g.masked_fill_(g < -0.5, 0.0)
        g = g.sigmoid() * 2
        g.add_(1)
        return self.c(g)


def in_place(seed, device="cpu"):
    torch.manual_seed(seed)
    m = _InPlace()
    x = torch.randn(8, 16)
    m, x = _on(device, m, x)

    def step():
        return m(x).sum()
    return m, step


def data_dependent(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16))
    x = torch.randn(10, 8)
    m, x = _on(device, m, x)

    def step():
        h = m(x)
        nz = torch.nonzero(h > 0.3)
        rows = torch.unique(nz[:, 0])
        return (h[h > 0].square().sum() + h[nz[:, 0], nz[:, 1]].exp().sum() +
                h[rows].sigmoid().sum())
    return m, step


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        y = (x @ w).tanh()
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, y = ctx.saved_tensors
        d = dy * (1 - y * y)
        return d @ w.t(), x.t() @ d


def custom_function(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.ModuleDict({"inp": nn.Linear(16, 16), "out": nn.Linear(16, 1)})
    m.w = nn.Parameter(torch.randn(16, 16) * 0.3)
    x = torch.randn(8, 16)
    m, x = _on(device, m, x)

    def step():
        h = _Scale.apply(m["inp"](x), m.w)
        return m["out"](_Scale.apply(h.sin(), m.w)).sum()
    return m, step


def accumulation(seed, device="cpu"):
    # Two micro-batches in one step: the first one's backward runs inside
    # the step, the second's is the caller's.
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 32),
                      nn.LayerNorm(32), nn.Linear(32, 3))
    x, y = torch.randn(16, 16), torch.randint(0, 3, (16,))
    m, x, y = _on(device, m, x, y)

    def step():
        (F.cross_entropy(m(x[:8]), y[:8]) / 2).backward()
        return F.cross_entropy(m(x[8:]), y[8:]) / 2
    return m, step


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32))

    def forward(self, x):
        return x + self.f(x)


def checkpointed(seed, device="cpu"):
    # torch.utils.checkpoint on some blocks, inside the budget.
    torch.manual_seed(seed)
    m = nn.Sequential(*[_Block() for _ in range(3)])
    x = torch.randn(8, 32)
    m, x = _on(device, m, x)

    def step():
        h = x
        for i, block in enumerate(m):
            h = checkpoint(block, h, use_reentrant=False) if i != 1 else block(h)
        return h.square().mean()
    return m, step


def rnn_cell(seed, device="cpu"):
    # A recurrence written out step by step (nn.LSTMCell in a Python loop):
    # each step's gates read the state the step before made.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"cell": nn.LSTMCell(8, 16), "out": nn.Linear(16, 2)})
    x = torch.randn(10, 4, 8)
    m, x = _on(device, m, x)

    def step():
        h = c = torch.zeros(4, 16, device=x.device)
        outs = []
        for t in range(x.shape[0]):
            h, c = m["cell"](x[t], (h, c))
            outs.append(m["out"](h))
        return torch.stack(outs).square().mean()
    return m, step


def parametrized(seed, device="cpu"):
    # Weights computed in each forward (torch.nn.utils.parametrizations):
    # weight norm, and spectral norm, whose power iteration updates its
    # vectors in place under no_grad.
    torch.manual_seed(seed)
    layers = []
    for i in range(4):
        layer = nn.Linear(32, 32)
        wrap = nn.utils.parametrizations.weight_norm if i % 2 == 0 else \
            nn.utils.parametrizations.spectral_norm
        layers += [wrap(layer), nn.GELU(), nn.Dropout(0.1)]
    m = nn.Sequential(*layers, nn.Linear(32, 4))
    x = torch.randn(16, 32)
    m, x = _on(device, m, x)

    def step():
        return m(x).square().mean()
    return m, step


ZOO = {f.__name__: f for f in (lstm, gru, norms, transformer, sdpa, tied_lm, autocast,
                               in_place, data_dependent, custom_function, accumulation,
                               checkpointed, rnn_cell, parametrized)}


# Training steps that do more than one forward and one backward, or reach
# for less common parts of PyTorch.

def _mlp(width=32, depth=4, out=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers, nn.Linear(width, out))


def _mlp_task(seed, device, labels=False):
    """The patterns' MLP and a batch for it (with class labels if asked)."""
    torch.manual_seed(seed)
    m, x, y = _mlp(), torch.randn(16, 32), torch.randint(0, 4, (16,))
    m, x, y = _on(device, m, x, y)
    return (m, x, y) if labels else (m, x)


def optimizer_inside(seed, device="cpu"):
    # A whole training step inside the budget: backward, gradient clipping,
    # AdamW's step, then the next forward (the caller's backward is its).
    m, x, y = _mlp_task(seed, device, labels=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step():
        F.cross_entropy(m(x), y).backward()
        nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        return F.cross_entropy(m(x), y)
    return m, step


def gradient_penalty(seed, device="cpu"):
    # A double backward: the input gradient's norm joins the loss (WGAN-GP).
    m, x = _mlp_task(seed, device)

    def step():
        xi = x.clone().requires_grad_()
        out = m(xi).sum()
        g, = torch.autograd.grad(out, xi, create_graph=True)
        return out + ((g.norm(2, dim=1) - 1) ** 2).mean()
    return m, step


def retain_graph(seed, device="cpu"):
    # Two backwards over one graph.
    m, x = _mlp_task(seed, device)

    def step():
        out = m(x)
        out.square().mean().backward(retain_graph=True)
        return out.abs().mean()
    return m, step


def adversarial(seed, device="cpu"):
    # FGSM: a backward for the input's gradient, then the step on the
    # perturbed input.
    m, x, y = _mlp_task(seed, device, labels=True)

    def step():
        xa = x.clone().requires_grad_()
        F.cross_entropy(m(xa), y).backward()
        m.zero_grad()
        return F.cross_entropy(m((x + 0.1 * xa.grad.sign()).detach()), y)
    return m, step


def hooks(seed, device="cpu"):
    # Module forward hooks, full backward hooks and a tensor hook.
    m, x = _mlp_task(seed, device)
    seen = []
    for layer in m:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda mod, i, o: seen.append(o.detach().abs().mean()))
            layer.register_full_backward_hook(lambda mod, gi, go: None)

    def step():
        seen.clear()
        out = m(x.clone().requires_grad_())  # (a full backward hook wants an input with grad)
        out.register_hook(lambda g: g * 2)
        return out.square().mean() + 0 * torch.stack(seen).sum()
    return m, step


def gan(seed, device="cpu"):
    # The discriminator's backward inside the step (the generator's output
    # detached), then the generator's loss through the discriminator.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"g": _mlp(16, 3, 4),
                       "d": nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))})
    z, real = torch.randn(16, 16), torch.randn(16, 4)
    m, z, real = _on(device, m, z, real)
    ones, zeros = torch.ones(16, 1, device=z.device), torch.zeros(16, 1, device=z.device)

    def step():
        fake = m["g"](z)
        (F.binary_cross_entropy_with_logits(m["d"](real), ones) +
         F.binary_cross_entropy_with_logits(m["d"](fake.detach()), zeros)).backward()
        return F.binary_cross_entropy_with_logits(m["d"](fake), ones)
    return m, step


def channels_last(seed, device="cpu"):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    x = torch.randn(4, 3, 12, 12)
    m, x = _on(device, m, x)
    m = m.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)

    def step():
        return m(x).square().mean()
    return m, step


def embeddings(seed, device="cpu"):
    # An embedding with max_norm (its forward renormalises the rows it reads,
    # in place, in the parameter) and an EmbeddingBag.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"e": nn.Embedding(50, 16, max_norm=1.0),
                       "bag": nn.EmbeddingBag(50, 16, mode="mean"), "out": nn.Linear(32, 2)})
    ids = torch.randint(0, 50, (8, 6))
    m, ids = _on(device, m, ids)

    def step():
        h = torch.cat([m["e"](ids).mean(1), m["bag"](ids)], 1)
        return m["out"](torch.tanh(h)).square().mean()
    return m, step


def spectral_filter(seed, device="cpu"):
    # Complex tensors: a learned filter applied in the frequency domain.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"a": nn.Linear(32, 32), "b": nn.Linear(32, 32)})
    m.w = nn.Parameter(torch.randn(17, dtype=torch.cfloat))
    x = torch.randn(8, 32)
    m, x = _on(device, m, x)

    def step():
        f = torch.fft.rfft(m["a"](x), dim=-1) * m.w
        return m["b"](F.silu(torch.fft.irfft(f, n=32, dim=-1))).square().mean()
    return m, step


def vae(seed, device="cpu"):
    # A reparameterised sample (torch.distributions' rsample) and a KL term.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"enc": nn.Linear(16, 8), "dec": nn.Linear(4, 16)})
    x = torch.randn(32, 16)
    m, x = _on(device, m, x)

    def step():
        mu, logv = m["enc"](x).chunk(2, -1)
        q = torch.distributions.Normal(mu, (0.5 * logv).exp())
        kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(0., 1.)).sum(-1)
        rec = F.mse_loss(m["dec"](q.rsample()), x, reduction="none").sum(-1)
        return (rec + kl).mean()
    return m, step


def packed_gru(seed, device="cpu"):
    # Variable-length sequences through pack_padded_sequence.
    torch.manual_seed(seed)
    m = nn.ModuleDict({"r": nn.GRU(8, 16, batch_first=True), "o": nn.Linear(16, 2)})
    x = torch.randn(4, 9, 8)
    m, x = _on(device, m, x)
    lengths = torch.tensor([9, 7, 4, 2])

    def step():
        out, h = m["r"](nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True))
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return m["o"](out).square().mean() + h.square().mean()
    return m, step


def bf16(seed, device="cpu"):
    # Weights and activations in bfloat16 (no autocast).
    m, x = _mlp_task(seed, device)
    m, x = m.to(torch.bfloat16), x.to(torch.bfloat16)

    def step():
        return m(x).float().square().mean()
    return m, step


PATTERNS = {f.__name__: f for f in (optimizer_inside, gradient_penalty, retain_graph,
                                    adversarial, hooks, gan, channels_last, embeddings,
                                    spectral_filter, vae, packed_gru, bf16)}
