#!/usr/bin/python3
"""Exports the GPT test model of `kiln generate` (test/e2e/gpt-generate/),
both ways docs/generate.md describes, with PyTorch's greedy decoding of it.

The model is a small decoder-only GPT (vocab 64, width 32, 4 heads, 2
blocks, a context of 64 positions) with random weights from a fixed seed.
test/e2e/gpt-generate/ receives:

  model.onnx            without a cache: input_ids i64[batch,length] ->
                        logits f32[batch,length,64] (dynamic batch and length)
  model-kv.onnx         with its key/value cache as inputs and outputs (the
                        convention of docs/generate.md): input_ids
                        i64[batch,tokens], position i64[] and past_key_<i>,
                        past_value_<i> f32[batch,4,64,8] -> logits
                        f32[batch,tokens,64], present_key_<i>,
                        present_value_<i> (the caches with the new tokens'
                        keys and values written at [position, position+tokens))
  prompt.npy            the prompt, i64[2,5]
  expected_tokens.npy   PyTorch's greedy decoding: the prompt and 40 new
                        tokens, i64[2,45]
  expected_step_logits.npy  the logits each new token was chosen from,
                        f32[2,40,64]: the model's output at positions 4..43
                        of expected_tokens (teacher forcing)

The greedy reference recomputes the whole sequence at each step with the
plain model; the script checks that the cache model decodes the same tokens
(and logits within 1e-5), and that no step's top two logits are closer than
MIN_MARGIN, so that the last bits of float rounding cannot flip a token. It
needs Debian's python3-torch (1.13), python3-onnx and python3-numpy:

  /usr/bin/python3 scripts/export-gpt-generate.py [OUT_DIR]   # default: test/e2e/gpt-generate
"""
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17
VOCAB, D_MODEL, N_HEAD, CONTEXT, N_LAYER = 64, 32, 4, 64, 2
BATCH, PROMPT, NEW_TOKENS = 2, 5, 40
MIN_MARGIN = 1e-3


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = D_MODEL // N_HEAD
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def heads(self, x, b, t):
        return x.view(b, t, N_HEAD, self.head_dim).transpose(1, 2)

    def forward(self, x):
        """Causal self-attention over the whole sequence (no cache)."""
        b, t, c = x.shape
        q, k, v = (self.heads(y, b, t) for y in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)

    def forward_cached(self, x, position, past_k, past_v):
        """The same for tokens at [position, position + t), with the keys and
        values of earlier positions in fixed-capacity caches [b, H, CONTEXT,
        D]. The new keys and values are written into the caches by an
        elementwise select (so that a compiler may update them in place), and
        attention reads the whole capacity with the slots after each query's
        position masked out."""
        b, t, c = x.shape
        q, k, v = (self.heads(y, b, t) for y in self.qkv(x).split(c, dim=2))
        slots = torch.arange(CONTEXT)
        steps = torch.arange(t)
        # Slot s takes new token s - position when position <= s < position + t.
        source = torch.minimum((slots - position).clamp(min=0), steps[-1])
        write = ((slots >= position) & (slots < position + t)).view(CONTEXT, 1)
        k_all = torch.where(write, k.index_select(2, source), past_k)
        v_all = torch.where(write, v.index_select(2, source), past_v)
        att = (q @ k_all.transpose(-2, -1)) * self.scale
        visible = slots.view(1, CONTEXT) <= (position + steps).view(t, 1)
        att = att.masked_fill(~visible, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v_all).transpose(1, 2).reshape(b, t, c)
        return self.proj(y), k_all, v_all


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward_cached(self, x, position, past_k, past_v):
        y, k, v = self.attn.forward_cached(self.ln1(x), position, past_k, past_v)
        x = x + y
        return x + self.mlp(self.ln2(x)), k, v


class GPT(nn.Module):
    """Token and positional embeddings, N_LAYER pre-layer-norm blocks, a final
    layer norm and the language-model head. forward(input_ids) -> logits."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(t).unsqueeze(0))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class CachedGPT(nn.Module):
    """The same weights, exported with the key/value cache:
    forward(input_ids, position, past_key_0, past_value_0, ...) ->
    (logits, present_key_0, present_value_0, ...)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, position, *past):
        g = self.gpt
        t = input_ids.shape[1]
        x = g.tok(input_ids) + g.pos((position + torch.arange(t)).unsqueeze(0))
        present = []
        for i, block in enumerate(g.blocks):
            x, k, v = block.forward_cached(x, position, past[2 * i], past[2 * i + 1])
            present += [k, v]
        return (g.head(g.ln_f(x)), *present)


def empty_cache():
    shape = (BATCH, N_HEAD, CONTEXT, D_MODEL // N_HEAD)
    return [torch.zeros(shape) for _ in range(2 * N_LAYER)]


@torch.no_grad()
def greedy(gpt, prompt):
    """Greedy decoding recomputing the whole sequence each step: the tokens,
    the logits of each step, and the smallest gap between a step's top two
    logits."""
    ids = prompt.clone()
    steps, margin = [], math.inf
    for _ in range(NEW_TOKENS):
        logits = gpt(ids)[:, -1, :]
        top2 = logits.topk(2, dim=-1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        steps.append(logits)
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids, torch.stack(steps, dim=1), margin


@torch.no_grad()
def greedy_cached(cached, prompt):
    """Greedy decoding with the cache model: one prefill, then one token a step."""
    cache = empty_cache()
    out = cached(prompt, torch.tensor(0), *cache)
    ids, steps = prompt.clone(), []
    for step in range(NEW_TOKENS):
        logits, cache = out[0][:, -1, :], list(out[1:])
        steps.append(logits)
        token = logits.argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, token], dim=1)
        if step + 1 < NEW_TOKENS:
            out = cached(token, torch.tensor(ids.shape[1] - 1), *cache)
    return ids, torch.stack(steps, dim=1)


def export(module, args, path, input_names, output_names, dynamic_axes):
    torch.onnx.export(module, args, path, opset_version=OPSET, input_names=input_names, output_names=output_names,
                      dynamic_axes=dynamic_axes, do_constant_folding=True)
    onnx.checker.check_model(onnx.load(path))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "e2e",
                                                                 "gpt-generate")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    gpt = GPT().eval()
    cached = CachedGPT(gpt).eval()
    prompt = torch.randint(0, VOCAB, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))

    tokens, step_logits, margin = greedy(gpt, prompt)
    if margin < MIN_MARGIN:
        sys.exit(f"the greedy decoding has a step whose top two logits differ by {margin:.2e} < {MIN_MARGIN}; "
                 "pick another seed")
    cached_tokens, cached_logits = greedy_cached(cached, prompt)
    assert torch.equal(tokens, cached_tokens), "the cache model decodes other tokens"
    assert torch.allclose(step_logits, cached_logits, rtol=1e-5, atol=1e-6), "the cache model's logits differ"

    export(gpt, (prompt,), os.path.join(out_dir, "model.onnx"), ["input_ids"], ["logits"],
           {"input_ids": {0: "batch", 1: "length"}, "logits": {0: "batch", 1: "length"}})
    past_names = [f"past_{kind}_{i}" for i in range(N_LAYER) for kind in ("key", "value")]
    present_names = [n.replace("past_", "present_") for n in past_names]
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "logits": {0: "batch", 1: "tokens"}}
    for name in past_names + present_names:
        axes[name] = {0: "batch"}
    export(cached, (prompt, torch.tensor(0), *empty_cache()), os.path.join(out_dir, "model-kv.onnx"),
           ["input_ids", "position"] + past_names, ["logits"] + present_names, axes)

    np.save(os.path.join(out_dir, "prompt.npy"), prompt.numpy())
    np.save(os.path.join(out_dir, "expected_tokens.npy"), tokens.numpy())
    np.save(os.path.join(out_dir, "expected_step_logits.npy"), step_logits.numpy().astype(np.float32))
    print(f"{out_dir}: greedy tokens {tuple(tokens.shape)}, smallest top-2 logit gap {margin:.3e}")


if __name__ == "__main__":
    main()
