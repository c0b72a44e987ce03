"""The actor's switch from training to generation and back, as a context manager.

Entering: save the training RNG state (torch CPU, every CUDA device when CUDA is initialised, Python ``random``,
NumPy's global state when NumPy is importable), swap in the generation state, stream the weights through the
resharder into the engine (or into a dict the context holds). Leaving, also on an exception: keep the generation
state for the next switch, restore the training state exactly, drop what generation held, ask the engine to release
its weights, collect garbage and empty the CUDA cache.

The generation state is seeded once with ``seed + generation DP rank`` (the rank's generation engine,
``HybridGroups.rank_info(rank).engine``), so all ranks of one generation TP group (one engine) draw the same numbers
and different engines draw different ones, like verl's sharding managers (``gen_random_states``). Each switch
continues the generation stream where the last one left it.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from hybrid_engine.reshard.shards import LocalShards

__all__ = ["GenerationContext", "ModeSwitch", "RngState"]

try:  # NumPy is optional
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


@dataclass
class RngState:
    """Every global RNG state a training step or a sampler may touch."""

    torch_cpu: torch.Tensor
    cuda: list[torch.Tensor] | None
    python: tuple
    numpy: tuple | None

    @classmethod
    def capture(cls) -> RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(
            torch_cpu=torch.get_rng_state(),
            cuda=cuda,
            python=random.getstate(),
            numpy=_np.random.get_state() if _np is not None else None,
        )

    @classmethod
    def seeded(cls, seed: int) -> RngState:
        """The state every generator has after seeding with ``seed``, without disturbing the current state."""
        saved = cls.capture()
        try:
            torch.manual_seed(seed)
            random.seed(seed)
            if _np is not None:
                _np.random.seed(seed % 2**32)
            return cls.capture()
        finally:
            saved.restore()

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if _np is not None and self.numpy is not None:
            _np.random.set_state(self.numpy)

    def equals(self, other: RngState) -> bool:
        same_cuda = (self.cuda is None) == (other.cuda is None) and (
            self.cuda is None or all(torch.equal(a, b) for a, b in zip(self.cuda, other.cuda, strict=True))
        )
        same_numpy = (self.numpy is None) == (other.numpy is None) and (
            self.numpy is None or all(_same(a, b) for a, b in zip(self.numpy, other.numpy, strict=True))
        )
        return torch.equal(self.torch_cpu, other.torch_cpu) and same_cuda and self.python == other.python and same_numpy


def _same(a, b) -> bool:
    if _np is not None and isinstance(a, _np.ndarray):
        return bool(_np.array_equal(a, b))
    return a == b


@dataclass
class GenerationContext:
    """What the ``with`` block sees: the generation seed, the weights (when no loader took them), the stats."""

    seed: int
    gen_dp_rank: int
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    stats: object | None = None
    loaded: int = 0
    """Tensors handed to ``load_weights``."""


class ModeSwitch:
    """Training <-> generation switch of one rank; keep one per rank for the whole run.

    ``resharder``: a ``Resharder`` (its groups give the generation DP rank) or None (then give ``gen_dp_rank``).
    """

    def __init__(self, resharder=None, *, seed: int = 0, gen_dp_rank: int | None = None):
        if gen_dp_rank is None:
            if resharder is None:
                raise ValueError("ModeSwitch needs a resharder or a gen_dp_rank")
            gen_dp_rank = resharder.groups.rank_info(resharder.rank).engine
        self.resharder = resharder
        self.gen_dp_rank = gen_dp_rank
        self.seed = seed + gen_dp_rank
        self._generation_state: RngState | None = None
        self.in_generation = False

    @contextmanager
    def generation(
        self,
        shards: LocalShards | None = None,
        *,
        load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], object] | None = None,
        release: Callable[[], object] | None = None,
    ) -> Iterator[GenerationContext]:
        """Switch to generation for the ``with`` block.

        ``shards``: this rank's training shards; when given, the resharder streams the generation weights into
        ``load_weights`` (called once with the ``(name, tensor)`` iterator, like vLLM's ``model.load_weights``) or,
        without a loader, into ``context.weights``. ``release``: called on the way out (the engine drops its weights
        / KV cache, e.g. vLLM ``sleep``).
        """
        if self.in_generation:
            raise RuntimeError("already in generation mode")
        training_state = RngState.capture()
        context = GenerationContext(seed=self.seed, gen_dp_rank=self.gen_dp_rank)
        self.in_generation = True
        try:
            if self._generation_state is None:
                self._generation_state = RngState.seeded(self.seed)
            self._generation_state.restore()
            if shards is not None:
                if self.resharder is None:
                    raise ValueError("ModeSwitch without a resharder cannot stream weights")
                stream = self.resharder.stream(shards)
                if load_weights is not None:
                    load_weights(_counting(stream, context))
                else:
                    for name, tensor in stream:
                        context.weights[name] = tensor
                context.stats = self.resharder.stats
            yield context
        finally:
            self.in_generation = False
            self._generation_state = RngState.capture()
            training_state.restore()
            context.weights.clear()
            try:
                if release is not None:
                    release()
            finally:
                gc.collect()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()


def _counting(stream, context: GenerationContext):
    for item in stream:
        context.loaded += 1
        yield item
