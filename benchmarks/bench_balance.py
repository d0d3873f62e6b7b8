"""What ``--balance compute`` buys on long-context rows: the steps' idle fraction, rows and fill.

Builds a long-tailed corpus from a ShareGPT-format file (one JSON object per line with a
``conversations`` list of ``{from, value}``): its clean conversations (user and assistant turns in
turn, opening with the user and closing with an answer) are joined, in a seeded order, into longer
ones whose sizes follow a lognormal (``--median-tokens 3000``, ``--sigma 0.8``, at most
``--max-tokens 30000``; sizes are counted in characters, ``--chars-per-token`` 4.6, the default
tokenizer's ratio on ShareGPT text). Then packs it twice at ``--max-len`` over ``--world-size``
ranks, without and with ``--balance compute``, and prints for each the rows, the fill, the steps'
predicted idle fraction (the summary's ``step_balance``) and the rows against the plain run's; it
checks, from the shards, that no sample is split or written twice, that every row is within
``--max-len``, and that the idle recomputed from the shards is the summary's.

    python benchmarks/bench_balance.py --data /path/to/sharegpt.jsonl --conversations 4000 \\
        --max-len 32768 --world-size 8

A row's cost is its tokens plus, for each of its samples of L tokens, L^2 / K (K from
``--balance-model``, 7b by default: K = 7e9 / (32 x 4096), about 53,400); a step's GPU time is N times
its costliest row, its useful time the sum of its rows' costs (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

USER = {"human", "user"}
ASSISTANT = {"gpt", "chatgpt", "bard", "bing", "assistant"}


def clean_conversations(path: Path) -> list[list[dict[str, str]]]:
    """Return the conversations of a ShareGPT file whose turns alternate user, assistant, ... assistant."""
    out: list[list[dict[str, str]]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line).get("conversations") or []
            messages = []
            for i, turn in enumerate(turns):
                role = "user" if turn.get("from") in USER else "assistant" if turn.get("from") in ASSISTANT else None
                text = turn.get("value")
                if role != ("user" if i % 2 == 0 else "assistant") or not isinstance(text, str) or not text.strip():
                    messages = []
                    break
                messages.append({"role": role, "content": text})
            if len(messages) >= 2 and len(messages) % 2 == 0:
                out.append(messages)
    return out


def join_corpus(
    sources: list[list[dict[str, str]]],
    conversations: int,
    seed: int,
    median_tokens: float,
    sigma: float,
    max_tokens: int,
    chars_per_token: float,
) -> list[dict[str, Any]]:
    """Join source conversations, in a seeded order, into ``conversations`` long ones of lognormal size.

    Each joined conversation takes source conversations (cycling through the shuffled sources) until
    its size in characters is nearest its drawn size; one that would pass the most characters allowed
    (``max_tokens`` in characters) is left for the next. A source longer than that is never used.
    """
    rng = random.Random(seed)
    cap = int(max_tokens * chars_per_token)
    sizes = [sum(len(m["content"]) for m in conv) for conv in sources]
    usable = [i for i, s in enumerate(sizes) if s <= cap]
    rng.shuffle(usable)
    out: list[dict[str, Any]] = []
    k = 0
    for _ in range(conversations):
        target = min(cap, int(rng.lognormvariate(0.0, sigma) * median_tokens * chars_per_token))
        messages: list[dict[str, str]] = []
        chars = 0
        while chars < target:
            i = usable[k % len(usable)]
            # Stop where the size is nearest the target (never past the cap); a conversation takes one at least.
            if messages and (chars + sizes[i] > cap or chars + sizes[i] - target > target - chars):
                break
            messages.extend(sources[i])
            chars += sizes[i]
            k += 1
        out.append({"messages": messages})
    return out


def pack(data: Path, out: Path, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    """Run ``packcli pack`` in a process of its own; return its JSON summary."""
    cmd = [
        sys.executable, "-m", "packcli", "pack", str(data), "-o", str(out), "--overwrite",
        "--max-len", str(args.max_len), "--world-size", str(args.world_size),
        "--balance-model", args.balance_model, "--cache-dir", str(args.cache_dir),
        "--num-proc", str(args.num_proc), "--json", "--quiet", *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({done.returncode}): {done.stderr.strip()}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def sample_lengths(out: Path) -> dict[str, Any]:
    """Return the sample length distribution ``packcli stats`` gives of an output."""
    cmd = [sys.executable, "-m", "packcli", "stats", str(out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found: dict[str, Any] = json.loads(done.stdout)["sample_length"]
    return found


def check_shards(out: Path, max_len: int, world: int, k: float) -> tuple[float, float]:
    """Check the rows of an output from its shards; return the steps' idle fraction recomputed from them,
    and the largest spread of tokens in a step ((most - fewest) / most)."""
    manifest = json.loads((out / "manifest.json").read_text())
    costs: list[float] = []
    tokens: list[int] = []
    seen: set[int] = set()
    for shard in manifest["shards"]:
        table = pq.read_table(out / shard["file"], columns=["seq_lengths", "sample_index", "piece_index"])
        for lengths, index, piece in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True):
            if sum(lengths) > max_len:
                raise SystemExit(f"a row holds {sum(lengths)} tokens, more than {max_len}")
            if any(piece) or seen & set(index) or len(set(index)) != len(index):
                raise SystemExit("a sample is split or written twice")
            seen.update(index)
            costs.append(sum(lengths) + sum(n * n for n in lengths) / k)
            tokens.append(sum(lengths))
    steps = np.array(costs).reshape(-1, world)
    gpu = world * steps.max(axis=1)
    step_tokens = np.array(tokens).reshape(-1, world)
    spread = (step_tokens.max(axis=1) - step_tokens.min(axis=1)) / step_tokens.max(axis=1)
    return float((gpu - steps.sum(axis=1)).sum() / gpu.sum()), float(spread.max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a ShareGPT-format JSON lines file")
    ap.add_argument("--conversations", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--median-tokens", type=float, default=3000)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=30000)
    ap.add_argument("--chars-per-token", type=float, default=4.6)
    ap.add_argument("--max-len", type=int, default=32768)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--balance-model", default="7b")
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--workdir", type=Path, help="keep the corpus, the cache and the outputs here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        args.cache_dir = work / "cache"
        corpus = join_corpus(
            clean_conversations(args.data),
            args.conversations,
            args.seed,
            args.median_tokens,
            args.sigma,
            args.max_tokens,
            args.chars_per_token,
        )
        data = work / "long.jsonl"
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus), encoding="utf-8")
        plain = pack(data, work / "plain", args)
        balanced = pack(data, work / "balanced", args, "--balance", "compute")
        lengths = sample_lengths(work / "plain")
        print(
            f"{plain['records_read']:,} conversations, {plain['tokens']:,} tokens packed (median "
            f"{lengths['median']:,.0f} a sample, p90 {lengths['p90']:,.0f}, max {lengths['max']:,}); dropped "
            f"{plain['dropped']}; --max-len {args.max_len} --world-size {args.world_size}, model {args.balance_model}\n"
        )
        print(
            "| run | rows | fill | idle | idle recomputed from the shards | rows / plain rows "
            "| most tokens spread in a step | rank token spread |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, summary in (("plain", plain), ("--balance compute", balanced)):
            steps = summary["step_balance"]
            out = work / ("plain" if summary is plain else "balanced")
            again, spread = check_shards(out, args.max_len, args.world_size, steps["k"])
            print(
                f"| {name} | {summary['rows']:,} | {summary['fill']:.2%} | {steps['idle']:.2%} | {again:.2%} "
                f"| {summary['rows'] / plain['rows']:.4f} | {spread:.2%} | {summary['rank_token_spread']:.4%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
