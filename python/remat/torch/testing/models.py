"""Small models for the tests and the benchmark: each `make(seed, ...)`
returns (model, step) where step() runs the forward and returns the loss.
`ckpt=True` wraps every block in torch.utils.checkpoint (the baseline that
users reach for today)."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Checkpointed(nn.Module):
    """A module whose activations torch.utils.checkpoint recomputes."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return checkpoint(self.inner, *args, use_reentrant=False)


def _wrap(module, ckpt):
    return Checkpointed(module) if ckpt else module


def mlp(seed, width=256, depth=6, batch=64, ckpt=False, device="cpu"):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers.append(_wrap(nn.Sequential(nn.Linear(width, width), nn.GELU()), ckpt))
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(batch, width, device=device)

    def step():
        return model(x).square().mean()
    return model, step


class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.heads = heads
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = self.drop(att.masked_fill(~mask, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class Gpt(nn.Module):
    """A GPT-2-style decoder with dropout."""

    def __init__(self, vocab=128, d=64, heads=4, layers=2, seq=32, p=0.1, ckpt=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(_wrap(Block(d, heads, p), ckpt) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.drop = nn.Dropout(p)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.drop(self.tok(ids) + self.pos(torch.arange(t, device=ids.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt(seed, batch=4, seq=32, layers=2, d=64, vocab=128, ckpt=False, device="cpu"):
    """A GPT-2-style decoder with dropout (0.1)."""
    torch.manual_seed(seed)
    model = Gpt(vocab=vocab, d=d, layers=layers, seq=seq, ckpt=ckpt).to(device)
    model.train()
    ids = torch.randint(0, vocab, (batch, seq + 1), device=device)

    def step():
        logits = model(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return model, step


class BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)), inplace=True)
        return F.relu(self.b2(self.c2(y)) + x)


def resnet(seed, batch=8, channels=16, blocks=3, image=16, classes=10, ckpt=False,
           device="cpu"):
    """A small ResNet: batch norm in training mode, in-place ReLUs."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False),
                          nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                          *[_wrap(BasicBlock(channels), ckpt) for _ in range(blocks)],
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(channels, classes)).to(device)
    model.train()
    x = torch.randn(batch, 3, image, image, device=device)
    labels = torch.randint(0, classes, (batch,), device=device)

    def step():
        return F.cross_entropy(model(x), labels)
    return model, step


class Lstm(nn.Module):
    def __init__(self, vocab, hidden, layers, ckpt=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.cells = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        self.ckpt = ckpt
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        steps = list(self.emb(tokens).unbind(0))
        for cell in self.cells:
            h = steps[0].new_zeros(steps[0].shape[0], cell.hidden_size)
            c = torch.zeros_like(h)
            out = []
            for x in steps:
                if self.ckpt:
                    h, c = checkpoint(cell, x, (h, c), use_reentrant=False)
                else:
                    h, c = cell(x, (h, c))
                out.append(h)
            steps = out
        return self.head(torch.stack(steps))


def lstm(seed, vocab=64, hidden=64, layers=2, seq=16, batch=8, ckpt=False, device="cpu"):
    """An LSTM language model stepped cell by cell."""
    torch.manual_seed(seed)
    model = Lstm(vocab, hidden, layers, ckpt).to(device)
    tokens = torch.randint(0, vocab, (seq + 1, batch), device=device)

    def step():
        logits = model(tokens[:-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[1:].flatten())
    return model, step


class TreeLstm(nn.Module):
    """A binary tree-structured LSTM (the N-ary Tree-LSTM of Tai et al.,
    2015) over a complete binary tree, evaluated node by node: every node's
    gates, cell and state are tensors of their own, so a step makes
    thousands of small ones."""

    def __init__(self, vocab, hidden):
        super().__init__()
        self.hidden = hidden
        self.emb = nn.Embedding(vocab, hidden)
        self.leaf = nn.Linear(hidden, 3 * hidden)       # i, o, u from the word
        self.inner = nn.Linear(2 * hidden, 5 * hidden)  # i, o, u, f_left, f_right
        self.head = nn.Linear(hidden, vocab)

    def forward(self, leaves):
        level = []
        for words in leaves.unbind(0):
            # Each leaf's words looked up on their own, so that no tensor
            # holds the whole tree's embeddings (leaves x batch x hidden).
            i, o, u = self.leaf(self.emb(words)).chunk(3, dim=1)
            c = torch.sigmoid(i) * torch.tanh(u)
            level.append((torch.sigmoid(o) * torch.tanh(c), c))
        while len(level) > 1:
            up = []
            for (hl, cl), (hr, cr) in zip(level[0::2], level[1::2]):
                i, o, u, fl, fr = self.inner(torch.cat([hl, hr], dim=1)).chunk(5, dim=1)
                c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl +
                     torch.sigmoid(fr) * cr)
                up.append((torch.sigmoid(o) * torch.tanh(c), c))
            level = up
        return self.head(level[0][0])


def tree_lstm(seed, vocab=64, hidden=32, leaves=128, batch=16, device="cpu"):
    """A binary Tree-LSTM classifying `batch` trees of `leaves` words each
    (2 * leaves - 1 nodes), its root's state read out over `vocab` classes."""
    if leaves < 1 or leaves & (leaves - 1):
        raise ValueError(f"leaves must be a power of two, not {leaves}")
    torch.manual_seed(seed)
    model = TreeLstm(vocab, hidden).to(device)
    words = torch.randint(0, vocab, (leaves, batch), device=device)
    labels = torch.randint(0, vocab, (batch,), device=device)

    def step():
        return F.cross_entropy(model(words), labels)
    return model, step
