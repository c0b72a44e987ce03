"""Variable-length attention for HF transformers without the flash-attn package: ``attn_implementation="pack_varlen"``.

verl's remove-padding path (``use_remove_padding``) packs a micro-batch into one row (``input_ids`` of shape
(1, total_tokens), ``attention_mask=None``, ``position_ids`` restarting at 0 for every sequence) and relies on the model
running flash-attn's varlen kernel, which reads the sequence boundaries from ``position_ids``. The flash-attn package
is not on every machine (the benchmark's H200 has none and no network). This module registers, under the name
``pack_varlen``, the same computation with PyTorch's own FlashAttention-2 varlen kernel
(``torch.nn.attention.varlen.varlen_attn``, CUDA) or, where that is missing (the CPU), a loop of causal
``scaled_dot_product_attention`` calls, one per sequence:

- packed input (batch 1, no mask): boundaries from ``position_ids == 0``;
- padded input (a 2-D mask, as verl sends without remove-padding): the padding is removed inside attention and put
  back after, which is what transformers' ``flash_attention_2`` does with a padding mask (so both arms of the dynamic
  batch benchmark run the same attention kernel; only the linear layers and the logits differ in padded tokens).

Its mask function is transformers' ``flash_attention_mask`` (None or the 2-D padding mask, never a 4-D mask).
On a GPU machine without flash-attn the plugin registers it in every process that builds models and makes it the
attention of any model config that names none (``patches.apply_flash_attn_fallbacks``); the GPU benchmarks use it too.
"""

from __future__ import annotations

import inspect
import weakref

import torch
import torch.nn.functional as F

NAME = "pack_varlen"

_VARLEN = None
_VARLEN_KW: dict = {}
_GQA_NATIVE = False
KERNEL = "unregistered"
CACHE_BOUNDS = True
"""Find a packed micro-batch's sequence bounds once per forward, not in every layer: the layers share one
``position_ids`` tensor, and finding the bounds waits for the GPU three times (``bench_micro_batch.py`` turns it off
for its comparison arm)."""
_bounds: tuple | None = None  # (weak reference to position_ids, its version, total, cu_seqlens, max length)


def _setup_varlen() -> None:
    global _VARLEN, _VARLEN_KW, _GQA_NATIVE
    try:
        # lazy: the module exists only in newer torch builds; its absence leaves the per-sequence sdpa fallback
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        _VARLEN_KW = {"window_size": (-1, 0)}  # causal
    elif "is_causal" in params:
        _VARLEN_KW = {"is_causal": True}
    else:
        return
    _GQA_NATIVE = "enable_gqa" in params
    _VARLEN = varlen_attn


def register() -> str:
    """Register ``pack_varlen`` with transformers (attention and mask); returns the kernel it will use on CUDA."""
    global KERNEL
    # lazy: transformers' registries, needed only by a process that registers the attention (it builds models)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask  # lazy: as the line above

    _setup_varlen()
    AttentionInterface.register(NAME, pack_varlen_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    KERNEL = "torch.nn.attention.varlen.varlen_attn" if _VARLEN is not None else "sdpa per sequence"
    return KERNEL


def _cu_seqlens_from_positions(position_ids: torch.Tensor, total: int) -> torch.Tensor:
    starts = torch.nonzero(position_ids.reshape(-1) == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    return torch.cat([starts, starts.new_tensor([total])]).to(torch.int32)


def _packed_bounds(position_ids: torch.Tensor, total: int) -> tuple[torch.Tensor, int]:
    """(cu_seqlens, longest sequence) of a packed row; the last answer again while the same tensor, unchanged in
    place (its version), is asked about (every layer of one forward, and gradient checkpointing's recompute)."""
    global _bounds
    held = _bounds
    if CACHE_BOUNDS and held is not None and held[0]() is position_ids and held[1:3] == (position_ids._version, total):
        return held[3], held[4]
    cu = _cu_seqlens_from_positions(position_ids, total)
    max_len = int((cu[1:] - cu[:-1]).max())
    _bounds = (weakref.ref(position_ids), position_ids._version, total, cu, max_len) if CACHE_BOUNDS else None
    return cu, max_len


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale) -> torch.Tensor:
    """q (T, H, D), k/v (T, Hkv, D), sequences at cu -> (T, H, D), causal inside each sequence."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if q.is_cuda and _VARLEN is not None:
        kwargs = dict(_VARLEN_KW)
        if heads != kv_heads:
            if _GQA_NATIVE:
                kwargs["enable_gqa"] = True
            else:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
        return _VARLEN(q, k, v, cu, cu, max_len, max_len, scale=scale, **kwargs)
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi <= lo:
            continue
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=heads != kv_heads)
        out[lo:hi] = o.squeeze(0).transpose(0, 1)
    return out


def pack_varlen_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
):
    """transformers attention interface: query (B, H, S, D), key/value (B, Hkv, S, D) -> ((B, S, H, D), None)."""
    if dropout:
        raise NotImplementedError("pack_varlen: attention dropout is not supported")
    batch, heads, seq, dim = query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, S, H, D)
    if attention_mask is not None:
        mask = attention_mask.reshape(batch, -1)[:, -seq:].bool()
        lengths = mask.sum(-1, dtype=torch.int32)
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        index = torch.nonzero(mask.reshape(-1)).flatten()
        qf, kf, vf = (t.reshape(batch * seq, t.shape[2], dim).index_select(0, index) for t in (q, k, v))
        out = _varlen(qf, kf, vf, cu, int(lengths.max()), scaling)
        full = out.new_zeros(batch * seq, heads, dim)
        full.index_copy_(0, index, out)
        return full.reshape(batch, seq, heads, dim), None
    if batch == 1 and position_ids is not None:
        cu, max_len = _packed_bounds(position_ids, seq)
        out = _varlen(q[0], k[0], v[0], cu, max_len, scaling)
        return out.unsqueeze(0), None
    cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=q.device)
    out = _varlen(*(t.reshape(batch * seq, t.shape[2], dim) for t in (q, k, v)), cu, seq, scaling)
    return out.reshape(batch, seq, heads, dim), None


def self_check(device: torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict:
    """The kernel ``_varlen`` uses on ``device`` against causal sdpa run one sequence at a time in fp32 (forward
    and the gradient of q), on three sequences of uneven length with grouped kv heads (14 q heads over 2, as
    Qwen2.5-0.5B). Relative errors: bf16 operands land between 1e-3 and 1e-2."""
    _setup_varlen()
    g = torch.Generator(device="cpu").manual_seed(seed)
    lens, heads, kv_heads, dim = [37, 300, 91], 14, 2, 64
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(total, heads, dim, generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(total, kv_heads, dim, generator=g).to(device, dtype)
    v = torch.randn(total, kv_heads, dim, generator=g).to(device, dtype)
    out = _varlen(q, k, v, cu, max(lens), None)
    out.float().square().sum().backward()
    qr = q.detach().double().requires_grad_()
    ref = torch.empty(total, heads, dim, dtype=torch.float64, device=device)
    pieces = []
    for lo, hi in zip(cu.tolist()[:-1], cu.tolist()[1:], strict=True):
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in (qr, k.double(), v.double()))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        pieces.append(o.squeeze(0).transpose(0, 1))
    ref = torch.cat(pieces)
    ref.square().sum().backward()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b).norm() / b.norm())

    kernel = "torch.nn.attention.varlen.varlen_attn" if (device.type == "cuda" and _VARLEN is not None) else "sdpa"
    return {
        "kernel": kernel,
        "forward_rel_error": rel(out.detach(), ref.detach()),
        "grad_q_rel_error": rel(q.grad, qr.grad),
    }
