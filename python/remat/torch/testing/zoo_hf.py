"""Hugging Face transformers models at tiny sizes, randomly initialised
(nothing is downloaded), for the tests and the sweep (bench/torch_zoo.py
--hf): decoder LMs with rotary embeddings, grouped-query attention and a
mixture of experts, an encoder with padding, an encoder-decoder, a vision
transformer, and transformers' own gradient checkpointing. Each
`make(seed, device="cpu")` returns (model, step) as remat.torch.testing.zoo's do.
Needs transformers (pip install transformers)."""
import torch
import transformers

VOCAB = 96
_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
_SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              vocab_size=VOCAB, **_IDS)


def _ids(batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, seq), generator=g)


def _causal_lm(config, seed, device):
    # A batch of two, one row left-padded (its padding masked out of the
    # attention and the loss).
    torch.manual_seed(seed)
    m = getattr(transformers, config.architectures[0])(config).to(device)
    ids = _ids(2, 16, 5).to(device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    labels = ids.masked_fill(mask == 0, -100)

    def step():
        return m(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    return m, step


def gpt2(seed, device="cpu"):
    c = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32,
                                vocab_size=VOCAB, architectures=["GPT2LMHeadModel"], **_IDS)
    return _causal_lm(c, seed, device)


def llama(seed, device="cpu"):
    c = transformers.LlamaConfig(num_key_value_heads=2, architectures=["LlamaForCausalLM"],
                                 **_SMALL)
    return _causal_lm(c, seed, device)


def llama_checkpointed(seed, device="cpu"):
    # transformers' own activation checkpointing, inside the budget.
    m, step = llama(seed, device)
    kw = {"use_reentrant": False}
    if hasattr(m, "activation_checkpointing_enable"):  # transformers 5.x
        m.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    return m, step


def mixtral(seed, device="cpu"):
    # A mixture of experts: each token routed to two of four (data-dependent
    # gathers and scatters).
    c = transformers.MixtralConfig(num_key_value_heads=2, num_local_experts=4,
                                   num_experts_per_tok=2, architectures=["MixtralForCausalLM"],
                                   **_SMALL)
    return _causal_lm(c, seed, device)


def bert(seed, device="cpu"):
    # Masked LM: one row padded at the end, a third of the tokens scored.
    torch.manual_seed(seed)
    m = transformers.BertForMaskedLM(transformers.BertConfig(**_SMALL)).to(device)
    ids = _ids(2, 16, 5).to(device)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]

    def step():
        return m(input_ids=ids, attention_mask=mask, labels=labels).loss
    return m, step


def t5(seed, device="cpu"):
    # Encoder-decoder, relative position biases, cross-attention.
    torch.manual_seed(seed)
    c = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                              vocab_size=VOCAB, decoder_start_token_id=0, **_IDS)
    m = transformers.T5ForConditionalGeneration(c).to(device)
    ids, labels = _ids(2, 16, 5).to(device), _ids(2, 8, 7).to(device)

    def step():
        return m(input_ids=ids, labels=labels, use_cache=False).loss
    return m, step


def vit(seed, device="cpu"):
    torch.manual_seed(seed)
    c = transformers.ViTConfig(image_size=16, patch_size=4, num_labels=5, hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    m = transformers.ViTForImageClassification(c).to(device)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 16, 16, generator=g).to(device)
    y = torch.tensor([1, 3]).to(device)

    def step():
        return m(pixel_values=x, labels=y).loss
    return m, step


HF = {f.__name__: f for f in (gpt2, llama, llama_checkpointed, mixtral, bert, t5, vit)}

# The longest batch varlen's models take.
LONGEST = 63


def varlen(name="gpt2", seed=0):
    """A causal LM ("gpt2" or "llama", tiny) trained on batches whose length
    changes from step to step (as dynamic padding makes them): returns
    (model, step), where step(n, budget=None) runs one step on a batch of
    two of n tokens (n <= LONGEST; the tokens drawn from n), inside `budget`
    if one is given, and returns its loss and a copy of its gradients."""
    import contextlib
    torch.manual_seed(seed)
    if name == "gpt2":
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, n_positions=LONGEST + 1, vocab_size=VOCAB, **_IDS))
    elif name == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=LONGEST + 1,
            **_IDS))
    else:
        raise ValueError(f"varlen models: gpt2 or llama, not {name!r}")

    def step(n, budget=None):
        ids = _ids(2, n, n)
        m.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with budget if budget is not None else contextlib.nullcontext():
            loss = m(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters()}
    return m, step
