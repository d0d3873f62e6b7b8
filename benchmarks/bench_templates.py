"""What locating assistant answers costs: a template without generation blocks against one with them.

Runs ``packcli pack --no-cache`` on the same corpus with two templates, in paired rounds (A, B, A, B...,
so that the machine's load swings hit both alike), and prints tokens per second for each and the median
of the in-round throughput ratios with its spread:

- A: Qwen3's official template (no ``{% generation %}`` blocks: spans found by packcli.spans), read from
  the ``trl`` package, or ``--template FILE``;
- B: packcli's ChatML template, whose ``{% generation %}`` blocks give the spans directly.

    python benchmarks/make_chat_corpus.py --conversations 5000 --seed 0 -o benchmarks/data/chat5k.jsonl
    python benchmarks/bench_templates.py --data benchmarks/data/chat5k.jsonl --rounds 3

Whole-process time is measured (start-up included), as a user sees it.
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

ROOT = Path(__file__).resolve().parents[1]


def _qwen3_template() -> str:
    import trl

    return str(Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja")


def _run(data: str, template: str, max_len: int, num_proc: int, out: Path) -> tuple[float, int]:
    cmd = [
        sys.executable, "-m", "packcli", "pack", data, "--max-len", str(max_len), "-o", str(out), "--overwrite",
        "--no-cache", "--num-proc", str(num_proc), "--chat-template", template, "--json", "--quiet",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({done.returncode}): {done.stderr.strip()}")
    summary = json.loads(done.stdout)
    return seconds, int(summary["tokens"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="benchmarks/data/chat5k.jsonl", help="JSONL chat corpus")
    parser.add_argument("--template", default=None, help="template without generation blocks [trl's qwen3]")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    spans_template = args.template or _qwen3_template()
    blocks_template = str(ROOT / "packcli" / "templates" / "chatml.jinja")
    ratios, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            a_s, a_tok = _run(args.data, spans_template, args.max_len, args.num_proc, Path(tmp) / "a")
            b_s, b_tok = _run(args.data, blocks_template, args.max_len, args.num_proc, Path(tmp) / "b")
            ratio = (a_tok / a_s) / (b_tok / b_s)
            ratios.append(ratio)
            rows.append((r + 1, a_s, a_tok / a_s, b_s, b_tok / b_s, ratio))
    print(f"corpus {args.data}, --max-len {args.max_len}, --num-proc {args.num_proc}, --no-cache")
    print(f"A: {Path(spans_template).name} (spans located)   B: chatml.jinja (generation blocks)")
    print(f"{'round':>5} {'A s':>8} {'A tok/s':>10} {'B s':>8} {'B tok/s':>10} {'A/B tok/s':>10}")
    for r, a_s, a_tps, b_s, b_tps, ratio in rows:
        print(f"{r:>5} {a_s:>8.2f} {a_tps:>10.0f} {b_s:>8.2f} {b_tps:>10.0f} {ratio:>10.3f}")
    print(
        f"median A/B throughput {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
        f"span search costs {1 - statistics.median(ratios):.1%} of throughput"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
