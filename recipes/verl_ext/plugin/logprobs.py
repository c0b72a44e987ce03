"""Log-probabilities of labels from logits without flash-attn: what verl gets from flash-attn's fused cross-entropy.

verl 0.9.1's ``verl.utils.torch_functional.logprobs_from_logits`` uses flash-attn's Triton cross-entropy where the
package is installed and otherwise ``logprobs_from_logits_v2``, a Python loop over every row: on the packed
``(tokens, vocab)`` logits of an update that is one ``log_softmax`` launch per token. On an H200 without flash-attn
that loop made verl's actor passes 4x slower at 289k tokens a batch (docs/performance.md, dynamic batch, run 2); at a
few thousand tokens a step it costs little (docs/gpu_e2e.md, call 13). :func:`chunked_logprobs` computes
``logit[label] - logsumexp(logits)`` in fp32, ``CHUNK`` rows at a time, and keeps flash-attn's memory behaviour:
with ``inplace_backward`` (what verl asks for unless it also takes the entropy from the same logits) the gradient is
written into the logits' own storage, so no copy of the logits is kept for backward; without it the gradient is a
new tensor and the logits are left as they were. Pure torch.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK", "chunked_logprobs"]

CHUNK = 512
"""Rows per chunk: the transient memory is two chunks' fp32 rows (2 * CHUNK * vocab * 4 bytes)."""


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat: torch.Tensor, labels: torch.Tensor, inplace: bool) -> torch.Tensor:
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        picked = flat.gather(-1, labels[:, None]).squeeze(-1).float()
        for start in range(0, flat.shape[0], CHUNK):
            lse[start : start + CHUNK] = torch.logsumexp(flat[start : start + CHUNK].float(), dim=-1)
        ctx.save_for_backward(flat, labels, lse)
        ctx.inplace = inplace
        return picked - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat, labels, lse = ctx.saved_tensors
        out = flat if ctx.inplace else torch.empty_like(flat)
        for start in range(0, flat.shape[0], CHUNK):
            rows = slice(start, start + CHUNK)
            g = grad[rows, None].float()
            probs = torch.exp(flat[rows].float() - lse[rows, None])
            # d(logit[label] - lse) / d logits = onehot(label) - softmax
            out[rows].copy_(-probs * g)
            out[rows].scatter_add_(-1, labels[rows, None], g.to(out.dtype))
        return out, None, None


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """``log softmax(logits)[label]`` over the last dimension, shaped like ``labels``, in fp32 (verl's signature)."""
    vocab = logits.shape[-1]
    out = _ChunkedLogProbs.apply(logits.reshape(-1, vocab), labels.reshape(-1), bool(inplace_backward))
    return out.view(labels.shape)
