"""Rows and padding of a preference set: packed pairs (packcli) against padded pairs (a DPO trainer's batches).

A preference set is derived from the synthetic chat corpus (``make_chat_corpus.py``): the prompt is a
conversation up to its last answer, ``chosen`` that answer, and ``rejected`` the same answer cut
after a fraction of its characters drawn in [0.15, 0.85] (at a word boundary), from a generator
seeded by (seed, conversation), so the set depends only on the corpus and ``--seed``.

For each ``--max-len`` it runs ``packcli pack`` (whole pairs only, ``--overflow drop``) and reads the
sample lengths back from the shards (``--overflow truncate`` cuts the prompts of pairs that do not
fit instead, from the left); the padded layouts are computed from the same kept pairs:

- ``packed``: packcli's rows, each padded to ``--max-len`` (the worst case; padding-free training
  pads nothing);
- ``padded to max-len``: every chosen and rejected sample its own row of ``--max-len`` tokens, as a
  trainer that pads to ``max_length`` runs them;
- ``padded batches of B pairs``: B consecutive pairs (input order) make a batch of 2B sequences
  padded to the batch's longest sample, as TRL's DPOTrainer collates by default.

    python benchmarks/make_chat_corpus.py --conversations 2000 --seed 0 -o benchmarks/data/chat2k.jsonl
    python benchmarks/bench_preference.py --data benchmarks/data/chat2k.jsonl --max-len 4096,8192
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def preference_set(conversations: Path, out: Path, seed: int) -> int:
    """Write the preference records derived from a chat corpus; return how many."""
    n = 0
    with open(conversations, encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            messages = json.loads(line)["messages"]
            answer = messages[-1]["content"]
            rng = random.Random(seed * 1_000_003 + i)
            cut = int(len(answer) * rng.uniform(0.15, 0.85))
            space = answer.rfind(" ", 0, cut)
            rejected = answer[: space if space > 0 else cut].rstrip()
            record = {
                "prompt": messages[:-1],
                "chosen": [{"role": "assistant", "content": answer}],
                "rejected": [{"role": "assistant", "content": rejected or answer[:1]}],
            }
            dst.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_pairs(directory: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """Return the chosen and rejected lengths of every kept pair (by record), and the row count."""
    lengths: dict[tuple[int, int], int] = {}
    rows = 0
    for shard in sorted(directory.glob("shard-*.parquet")):
        table = pq.read_table(shard, columns=["seq_lengths", "sample_index", "sample_role"])
        rows += table.num_rows
        for seq, index, role in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True):
            for n, i, r in zip(seq, index, role, strict=True):
                lengths[(i, r)] = n
    records = sorted({i for i, _ in lengths})
    return np.array([lengths[(i, 1)] for i in records]), np.array([lengths[(i, 2)] for i in records]), rows


def padded_batches(chosen: np.ndarray, rejected: np.ndarray, pairs_per_batch: int) -> tuple[int, int]:
    """Return (sequences, tokens run) when B consecutive pairs form a batch padded to its longest sample."""
    tokens = 0
    for start in range(0, len(chosen), pairs_per_batch):
        c, r = chosen[start : start + pairs_per_batch], rejected[start : start + pairs_per_batch]
        tokens += 2 * len(c) * int(max(c.max(), r.max()))
    return 2 * len(chosen), tokens


def run(data: Path, max_len: int, workdir: Path, num_proc: int, overflow: str) -> dict[str, object]:
    out = workdir / f"packed-{max_len}"
    cmd = [sys.executable, "-m", "packcli", "pack", str(data), "--max-len", str(max_len), "-o", str(out)]
    cmd += ["--overflow", overflow, "--overwrite", "--no-cache", "--num-proc", str(num_proc), "--json", "--quiet"]
    started = time.perf_counter()
    summary = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    seconds = time.perf_counter() - started
    chosen, rejected, rows = read_pairs(out)
    tokens = int(chosen.sum() + rejected.sum())
    assert tokens == summary["tokens"] and rows == summary["rows"]
    layouts = {"packed (rows padded to max-len)": (rows, rows * max_len)}
    layouts["padded to max-len"] = (2 * len(chosen), 2 * len(chosen) * max_len)
    for b in (4, 8):
        layouts[f"padded batches of {b} pairs"] = padded_batches(chosen, rejected, b)
    return {
        "max_len": max_len,
        "records": summary["records_read"],
        "pairs": len(chosen),
        "dropped": summary["dropped"],
        "truncated": summary["truncated"],
        "tokens": tokens,
        "lower_bound_l2": summary["lower_bound_l2"],
        "pack_seconds": round(seconds, 1),
        "layouts": {
            name: {"rows": seq, "tokens_run": run_tokens, "padding_fraction": round(1 - tokens / run_tokens, 4)}
            for name, (seq, run_tokens) in layouts.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data/chat2k.jsonl"), help="chat corpus (JSONL)")
    parser.add_argument("--max-len", default="4096,8192", help="comma-separated max lengths [4096,8192]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rejected answers [0]")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--overflow", default="drop", choices=("drop", "truncate"), help="pairs over --max-len [drop]")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-preference-") as tmp:
        work = Path(tmp)
        data = work / "preference.jsonl"
        n = preference_set(args.data, data, args.seed)
        results = [run(data, int(m), work, args.num_proc, args.overflow) for m in args.max_len.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{n:,} preference records from {args.data}")
    for r in results:
        print(
            f"\n--max-len {r['max_len']} --overflow {args.overflow}: {r['pairs']:,} pairs kept "
            f"({r['truncated']:,} prompts cut), dropped {r['dropped'] or 'none'}, "
            f"{r['tokens']:,} tokens, L2 bound {r['lower_bound_l2']:,} rows, pack {r['pack_seconds']} s"
        )
        print(f"  {'layout':34} {'rows':>8} {'tokens run':>13} {'padding':>8}")
        for name, layout in r["layouts"].items():
            print(f"  {name:34} {layout['rows']:>8,} {layout['tokens_run']:>13,} {layout['padding_fraction']:>8.1%}")


if __name__ == "__main__":
    main()
