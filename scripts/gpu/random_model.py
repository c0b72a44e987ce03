"""A local model folder of a shipped architecture with random weights, for GPU runs on a machine without a model hub.

    python scripts/gpu/random_model.py qwen2_5_0_5b OUT_DIR

Writes OUT_DIR/config.json and model.safetensors (hybrid_engine/model_configs/<name>, random weights, seed 0, in
the config's dtype) and the tiny task's tokenizer (recipes.verl_ext.demo): its ids are a subset of every shipped
vocabulary, and the model keeps its own vocabulary size, so the shape (and the logits' cost) is the real one. Ids
the tokenizer does not know decode to nothing. Prints OUT_DIR. Nothing is written where OUT_DIR/config.json exists.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build(name: str, out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybrid_engine.model_spec import MODEL_CONFIG_DIR
    from recipes.verl_ext.demo import ensure_tiny_assets

    if (out / "config.json").is_file():
        return out
    config = AutoConfig.from_pretrained(str(Path(MODEL_CONFIG_DIR) / name))
    torch.manual_seed(0)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.bfloat16
    # on the GPU where there is one: a 7B shape's random init takes minutes on the host's cores, seconds there
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    model.save_pretrained(staging)
    tiny = ensure_tiny_assets(Path(tempfile.mkdtemp(prefix="tiny-"))).model_dir
    for file in TOKENIZER_FILES:
        if (Path(tiny) / file).is_file():
            shutil.copy(Path(tiny) / file, staging / file)
    staging.rename(out)  # whole or not at all
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="a folder of hybrid_engine/model_configs, e.g. qwen2_5_0_5b")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(build(args.name, args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
