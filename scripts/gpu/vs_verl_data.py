"""The data set of the side-by-side runs against verl (scripts/gpu/vs_verl.sh): verl's RL parquet, long prompts.

    python scripts/gpu/vs_verl_data.py TOKENIZER_DIR OUT_DIR [--train 1024] [--val 32] [--min-tokens 128]
        [--max-tokens 480] [--seed 0]

Each prompt is a paragraph of the tiny task's words followed by the tiny task's question ``"a+b="``, so that verl's
own reward loader can score it with the file recipes/verl_ext/demo/reward.py (standard library only: plain verl loads
it by path, without the pack). Prompt lengths are drawn uniformly between --min-tokens and --max-tokens, counted with
TOKENIZER_DIR's tokenizer after its chat template (the model folder of scripts/gpu/random_model.py), so that every
prompt fits verl's ``data.max_prompt_length=512`` and ``data.filter_overlong_prompts`` keeps them all. Writes
OUT_DIR/train.parquet and OUT_DIR/val.parquet, and prints one line: rows and the prompt lengths' range and mean.
Nothing is written where OUT_DIR/train.parquet exists.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATA_SOURCE = "tiny_arith"  # the data_source recipes/verl_ext/demo/reward.py scores
WORDS = (
    "the a an is are was be to of and in on at for with as by from that this it not or but if then so what which "
    "who how when where why answer question number sum plus equals add result one two three four five six seven "
    "eight nine ten zero hello world model token reward learn step train value policy actor critic ratio clip loss"
).split()


def prompt_tokens(tokenizer, text: str) -> int:
    """Tokens of one user message after the chat template, with the generation prompt (what verl counts)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a BatchEncoding


def one_prompt(tokenizer, rng: random.Random, target: int) -> tuple[str, int, dict]:
    """A paragraph grown word by word until the templated prompt reaches ``target`` tokens, then the question."""
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    question = f" Answer with the number only. {a}+{b}="
    words = [rng.choice(WORDS) for _ in range(target)]  # at least one token a word: never too few
    lo, hi = 0, len(words)  # the most words whose prompt stays within target tokens (bisection)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prompt_tokens(tokenizer, " ".join(words[:mid]) + question) <= target:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo]) + question
    return text, prompt_tokens(tokenizer, text), {"a": a, "b": b}


def rows(tokenizer, n: int, split: str, lo: int, hi: int, seed: int) -> tuple[list[dict], list[int]]:
    rng = random.Random(f"{seed}-{split}")
    out, lengths = [], []
    for index in range(n):
        text, length, ab = one_prompt(tokenizer, rng, rng.randint(lo, hi))
        lengths.append(length)
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": text}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(ab["a"] + ab["b"])},
            "extra_info": {"split": split, "index": index, "prompt_tokens": length, **ab},
        })
    return out, lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=1024)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=480)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.min_tokens > args.max_tokens:
        parser.error(f"--min-tokens {args.min_tokens} > --max-tokens {args.max_tokens}")
    if (args.out / "train.parquet").is_file():
        print(f"vs_verl_data: {args.out}/train.parquet exists, kept")
        return 0
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    args.out.mkdir(parents=True, exist_ok=True)
    all_lengths = []
    for split, n in (("val", args.val), ("train", args.train)):  # train last: its file marks the set complete
        table, lengths = rows(tokenizer, n, split, args.min_tokens, args.max_tokens, args.seed)
        all_lengths += lengths
        pd.DataFrame(table).to_parquet(args.out / f"{split}.parquet.tmp", index=False)
        (args.out / f"{split}.parquet.tmp").rename(args.out / f"{split}.parquet")
    print(f"vs_verl_data: {args.train} train + {args.val} val prompts in {args.out}, prompt tokens "
          f"{min(all_lengths)}..{max(all_lengths)}, mean {statistics.mean(all_lengths):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
