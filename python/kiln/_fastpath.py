"""PyTorch's fused inference ops in a graph that torch.compile hands to the "kiln" backend, rewritten as plain ops.

In eval mode without gradients, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` take a "fast path": one fused op each,
``torch._transformer_encoder_layer_fwd`` and
``torch._native_multi_head_attention``. Dynamo records them as they are, and
the ONNX exporter has no translation for them, so such a graph could not be
compiled. Exporting the module itself never meets them (the exporter traces
the ordinary path). Here each becomes a Python function computing the same
thing from the ops the exporter knows (linear, layer norm, softmax, ...),
following ATen's implementations (aten/src/ATen/native/transformers/).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple


def _torch():
    import torch

    return torch


def _masked_softmax(scores: Any, mask: Optional[Any], mask_type: Optional[int]) -> Any:
    """ATen's masked softmax over the last dim: True (or nonzero) mask entries are left out; a row with none left is 0."""
    torch = _torch()
    if mask is None:
        return torch.softmax(scores, dim=-1)
    mask = mask.to(torch.bool)
    batch, _, _, keys = scores.shape
    if mask_type == 1:  # a key padding mask [batch, keys]
        mask = mask.view(batch, 1, 1, keys)
    mask = mask.expand(scores.shape)
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return probs.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)


def native_multi_head_attention(
    query: Any,
    key: Any,
    value: Any,
    embed_dim: int,
    num_head: int,
    qkv_weight: Any,
    qkv_bias: Any,
    proj_weight: Any,
    proj_bias: Any,
    mask: Optional[Any] = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: Optional[int] = None,
) -> Tuple[Any, Any]:
    """``torch._native_multi_head_attention``: batch-first [batch, length, embed_dim] query, key and value."""
    torch = _torch()
    F = torch.nn.functional
    head_dim = embed_dim // num_head
    w_q, w_k, w_v = qkv_weight.chunk(3, dim=0)
    b_q, b_k, b_v = qkv_bias.chunk(3, dim=0)

    def heads(x: Any) -> Any:  # [batch, length, embed] -> [batch, heads, length, head_dim]
        return x.reshape(x.shape[0], x.shape[1], num_head, head_dim).transpose(1, 2)

    q = heads(F.linear(query, w_q, b_q)) / math.sqrt(head_dim)
    k = heads(F.linear(key, w_k, b_k))
    v = heads(F.linear(value, w_v, b_v))
    probs = _masked_softmax(torch.matmul(q, k.transpose(-2, -1)), mask, mask_type)
    attended = torch.matmul(probs, v).transpose(1, 2).reshape(query.shape[0], query.shape[1], embed_dim)
    out = F.linear(attended, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, (probs.mean(dim=1) if average_attn_weights else probs)


def transformer_encoder_layer_fwd(
    src: Any,
    embed_dim: int,
    num_heads: int,
    qkv_weight: Any,
    qkv_bias: Any,
    proj_weight: Any,
    proj_bias: Any,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: Any,
    norm_bias_1: Any,
    norm_weight_2: Any,
    norm_bias_2: Any,
    ffn_weight_1: Any,
    ffn_bias_1: Any,
    ffn_weight_2: Any,
    ffn_bias_2: Any,
    mask: Optional[Any] = None,
    mask_type: Optional[int] = None,
) -> Any:
    """``torch._transformer_encoder_layer_fwd``: one batch-first encoder layer, post- or pre-norm."""
    torch = _torch()
    F = torch.nn.functional

    def norm(x: Any, weight: Any, bias: Any) -> Any:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


def replace_fast_path_ops(gm: Any) -> Any:
    """``gm`` (a torch.fx.GraphModule) with each fused fast-path op calling its plain form above; changed in place."""
    torch = _torch()
    plain = {}
    for name, function in (("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd),
                           ("_native_multi_head_attention", native_multi_head_attention)):
        for op in (getattr(torch, name, None), getattr(torch.ops.aten, name, None),
                   getattr(getattr(torch.ops.aten, name, None), "default", None)):
            if op is not None:
                plain[op] = function
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in plain:
            node.target = plain[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm
