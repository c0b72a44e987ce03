"""The hf rollout's weight hand-off through Ray: a dict of tensors against the packed buffer, side by side.

    python scripts/bench_hf_handoff.py                      # qwen2_5_0_5b's tensors in fp32, 3 repeats
    python scripts/bench_hf_handoff.py --model tiny --repeat 5 --json out.json

Starts a local Ray cluster and one server actor holding zeroed copies of the model's tensors (HF names and shapes
from hybrid_engine.model_spec; a tied lm_head is not sent), then times, per repeat, from the actor side: a
``dict[str, Tensor]`` handed to ``server.load.remote`` (what the hf rollout sent before), and
``recipes.verl_ext.plugin.packed_weights.pack`` of the same tensors plus ``server.load_packed.remote`` (what it
sends now: pack, Ray, unpack, copy into the server's tensors). Both end with the server's tensors equal to the sent
ones (checked). Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ray  # noqa: E402
import torch  # noqa: E402

from hybrid_engine.model_spec import build_spec  # noqa: E402
from recipes.verl_ext.plugin.packed_weights import pack, unpack  # noqa: E402


class Server:
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.params = {name: torch.zeros(shape) for name, shape in shapes.items()}

    def _copy(self, state) -> float:
        for name, tensor in state.items():
            self.params[name].copy_(tensor)
        return float(sum(p.double().sum() for p in self.params.values()))

    def load(self, state: dict) -> float:
        return self._copy(state)

    def load_packed(self, packed) -> float:
        return self._copy(unpack(packed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2_5_0_5b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    spec = build_spec(args.model)
    shapes = {t.name: tuple(t.shape) for t in spec.tensors if t.tied_to is None}
    torch.manual_seed(0)
    state = {name: torch.randn(shape) for name, shape in shapes.items()}
    total = float(sum(t.double().sum() for t in state.values()))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        server = ray.remote(Server).options(num_cpus=0).remote(shapes)
        times: dict[str, list[float]] = {"dict_of_tensors": [], "packed": []}
        for _ in range(args.repeat):
            start = time.perf_counter()
            assert ray.get(server.load.remote(state)) == total
            times["dict_of_tensors"].append(time.perf_counter() - start)
            start = time.perf_counter()
            assert ray.get(server.load_packed.remote(pack(state.items()))) == total
            times["packed"].append(time.perf_counter() - start)
    finally:
        ray.shutdown()
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["dict_of_tensors"] / medians["packed"]
    print(f"model {args.model}: {len(shapes)} tensors, {nbytes / 1e9:.3f} GB fp32, {args.repeat} repeats")
    for name, values in times.items():
        print(f"  {name:16s} median {medians[name]:7.3f} s  (all: {', '.join(f'{v:.2f}' for v in values)})")
    print(f"  packed is {ratio:.1f}x faster; both loads check out against the sent tensors")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "tensors": len(shapes), "bytes": nbytes,
                                         "seconds": times, "median_s": medians, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
