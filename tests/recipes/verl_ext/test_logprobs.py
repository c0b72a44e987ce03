"""recipes.verl_ext.plugin.logprobs: verl's log-probs without flash-attn, against log_softmax + gather in fp64."""

from __future__ import annotations

import pytest
import torch

from recipes.verl_ext.plugin.logprobs import CHUNK, chunked_logprobs


def _reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), -1).gather(-1, labels[..., None]).squeeze(-1)


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace-backward", "copy-backward"])
def test_values_and_gradient_match_log_softmax_across_chunk_edges(inplace):
    torch.manual_seed(0)
    rows = 2 * CHUNK + 37  # three chunks, the last one short
    base = torch.randn(rows, 96) * 3
    labels = torch.randint(0, 96, (rows,))
    weights = torch.randn(rows)
    expected_leaf = base.double().requires_grad_()
    (_reference(expected_leaf, labels) * weights.double()).sum().backward()
    leaf = base.clone().requires_grad_()
    logits = leaf * 1.0  # logits are a non-leaf in verl's engine
    out = chunked_logprobs(logits, labels, inplace_backward=inplace)
    assert out.dtype == torch.float32 and out.shape == labels.shape
    torch.testing.assert_close(out.double(), _reference(base, labels), atol=2e-6, rtol=0)
    kept = logits.detach().clone()
    (out * weights).sum().backward()
    torch.testing.assert_close(leaf.grad.double(), expected_leaf.grad, atol=2e-6, rtol=0)
    # flash-attn's in-place backward writes the gradient into the logits' storage; the copy leaves them alone
    assert torch.equal(logits.detach(), kept) is (not inplace)


def test_keeps_the_labels_shape_of_a_batch():
    logits, labels = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    torch.testing.assert_close(chunked_logprobs(logits, labels).double(), _reference(logits, labels), atol=1e-6,
                               rtol=0)
