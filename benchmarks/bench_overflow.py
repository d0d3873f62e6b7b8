"""What each --overflow policy keeps of a long-tailed chat corpus, and what splitting costs in time.

Prints, per max length, the records, tokens and trainable tokens that ``drop``, ``truncate`` (right),
``truncate --truncate-side left`` and ``split`` keep (what ``packcli stats --max-len ...`` reports,
each figure equal to what ``pack`` with that policy writes), then times ``pack --no-cache`` with
``--overflow truncate`` against ``--overflow split`` at the first max length in paired rounds (truncate,
split, truncate, split...; the median of the in-round ratios and its spread; whole process).

    python benchmarks/make_chat_corpus.py --conversations 5000 --seed 0 -o benchmarks/data/chat5k.jsonl
    python benchmarks/bench_overflow.py --data benchmarks/data/chat5k.jsonl --max-len 1024,2048 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ("drop", "truncate", "truncate-left", "split")


def _pack(data: str, max_len: int, overflow: str, num_proc: int, out: Path) -> float:
    cmd = [
        sys.executable, "-m", "packcli", "pack", data, "--max-len", str(max_len), "--overflow", overflow,
        "-o", str(out), "--overwrite", "--no-cache", "--num-proc", str(num_proc), "--json", "--quiet",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({done.returncode}): {done.stderr.strip()}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a chat JSON lines file (make_chat_corpus.py)")
    ap.add_argument("--max-len", default="1024,2048")
    ap.add_argument("--rounds", type=int, default=3, help="paired timing rounds (0: no timing)")
    ap.add_argument("--no-policies", action="store_true", help="only the timing")
    ap.add_argument("--num-proc", type=int, default=2)
    args = ap.parse_args()
    import packcli

    lens = [int(x) for x in args.max_len.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_policies:
            result = packcli.stats(args.data, lens, cache_dir=Path(tmp) / "cache", num_proc=args.num_proc)
            print(
                f"{result['records_read']:,} records, {result['tokens']:,} tokens, "
                f"{result['trainable_tokens']:,} trainable; median {result['sample_length']['median']:,.0f} tokens, "
                f"p90 {result['sample_length']['p90']:,.0f}, max {result['sample_length']['max']:,}\n"
            )
            print("| max-len | policy | records kept | samples | tokens | trainable tokens kept |")
            print("|---:|---|---:|---:|---:|---:|")
            for line in result["max_lens"]:
                for policy in POLICIES:
                    p = line["policies"][policy]
                    print(
                        f"| {line['max_len']:,} | {policy} | {p['records']:,} "
                        f"({p['records'] / result['records_read']:.1%})"
                        f" | {p['samples']:,} | {p['tokens']:,} | {p['trainable_tokens']:,} "
                        f"({p['trainable_fraction']:.1%}) |"
                    )
        if args.rounds:
            out = Path(tmp) / "out"
            ratios, drop_s, split_s = [], [], []
            for r in range(args.rounds):
                a = _pack(args.data, lens[0], "truncate", args.num_proc, out)
                b = _pack(args.data, lens[0], "split", args.num_proc, out)
                drop_s.append(a)
                split_s.append(b)
                ratios.append(b / a)
                print(f"round {r}: truncate {a:.2f} s, split {b:.2f} s, split/truncate {b / a:.3f}", file=sys.stderr)
            print(
                "\n"
                + json.dumps(
                    {
                        "max_len": lens[0],
                        "truncate_median_s": round(statistics.median(drop_s), 2),
                        "split_median_s": round(statistics.median(split_s), 2),
                        "split_over_truncate_median": round(statistics.median(ratios), 3),
                        "ratio_min": round(min(ratios), 3),
                        "ratio_max": round(max(ratios), 3),
                    }
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
