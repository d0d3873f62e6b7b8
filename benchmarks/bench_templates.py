"""What locating assistant answers costs: a template without generation blocks against one with them.

Runs ``packcli pack --no-cache`` on the same corpus with two templates, in paired rounds (A, B, A, B...,
so that the machine's load swings hit both alike), and prints tokens per second for each and the median
of the in-round throughput ratios with its spread:

- A: Qwen3's official template (no ``{% generation %}`` blocks: spans found by
  packcli.tokenize.templates.spans), read from the ``trl`` package, or ``--template FILE``;
- B: packcli's ChatML template, whose ``{% generation %}`` blocks give the spans directly.

    python benchmarks/make_chat_corpus.py --conversations 5000 --seed 0 -o benchmarks/data/chat5k.jsonl
    python benchmarks/bench_templates.py --data benchmarks/data/chat5k.jsonl --rounds 3

Whole-process time is measured (start-up included), as a user sees it, and CPU seconds (user and
system, of packcli and its workers), which move less when other jobs take the cores. ``--encoder-only`` instead
times the Encoder alone in this process (render, locate spans, encode; CPU seconds of all its
threads), alternating the two templates on the first ``--records`` conversations: the cost of the
span search itself, without the rest of the pipeline around it.
"""

from __future__ import annotations

import argparse
import json
import resource
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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(data: str, template: str, max_len: int, num_proc: int, out: Path) -> tuple[float, float, int]:
    cmd = [
        sys.executable, "-m", "packcli", "pack", data, "--max-len", str(max_len), "-o", str(out), "--overwrite",
        "--no-cache", "--num-proc", str(num_proc), "--chat-template", template, "--json", "--quiet",
    ]  # fmt: skip
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({done.returncode}): {done.stderr.strip()}")
    summary = json.loads(done.stdout)
    return seconds, cpu, int(summary["tokens"])


def _encoder_only(data: str, spans_template: str, blocks_template: str, rounds: int, records: int) -> list[float]:
    from packcli.records.formats import Sample
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    with open(data, encoding="utf-8") as fh:
        samples = [
            Sample("chat", messages=json.loads(line)["messages"]) for line, _ in zip(fh, range(records), strict=False)
        ]
    encoders = [Encoder(None, t, EncodeOptions()) for t in (spans_template, blocks_template)]

    def throughput(encoder: Encoder) -> float:
        start, tokens = time.process_time(), 0
        for i in range(0, len(samples), 256):
            tokens += sum(len(r[0]) for r in encoder.encode_batch(samples[i : i + 256]) if isinstance(r, tuple))
        return tokens / (time.process_time() - start)

    ratios = []
    for r in range(rounds):
        a, b = throughput(encoders[0]), throughput(encoders[1])
        ratios.append(a / b)
        print(f"round {r + 1}: A {a:,.0f} tokens per CPU second, B {b:,.0f}, A/B {a / b:.3f}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="benchmarks/data/chat5k.jsonl", help="JSONL chat corpus")
    parser.add_argument("--template", default=None, help="template without generation blocks [trl's qwen3]")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--encoder-only", action="store_true", help="time the Encoder alone, in this process")
    parser.add_argument("--records", type=int, default=1000, help="conversations for --encoder-only [1000]")
    args = parser.parse_args(argv)
    spans_template = args.template or _qwen3_template()
    blocks_template = str(ROOT / "packcli" / "templates" / "chatml.jinja")
    if args.encoder_only:
        ratios = _encoder_only(args.data, spans_template, blocks_template, args.rounds, args.records)
        print(f"median A/B {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
        return 0
    ratios, cpu_ratios, rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            a_s, a_cpu, a_tok = _run(args.data, spans_template, args.max_len, args.num_proc, Path(tmp) / "a")
            b_s, b_cpu, b_tok = _run(args.data, blocks_template, args.max_len, args.num_proc, Path(tmp) / "b")
            ratio, cpu_ratio = (a_tok / a_s) / (b_tok / b_s), (a_tok / a_cpu) / (b_tok / b_cpu)
            ratios.append(ratio)
            cpu_ratios.append(cpu_ratio)
            rows.append((r + 1, a_s, a_tok / a_s, a_cpu, b_s, b_tok / b_s, b_cpu, ratio, cpu_ratio))
    print(f"corpus {args.data}, --max-len {args.max_len}, --num-proc {args.num_proc}, --no-cache")
    print(f"A: {Path(spans_template).name} (spans located)   B: chatml.jinja (generation blocks)")
    print(
        f"{'round':>5} {'A s':>8} {'A tok/s':>10} {'A cpu s':>8} {'B s':>8} {'B tok/s':>10} {'B cpu s':>8} "
        f"{'A/B tok/s':>10} {'A/B tok/cpu s':>14}"
    )
    for r, a_s, a_tps, a_cpu, b_s, b_tps, b_cpu, ratio, cpu_ratio in rows:
        print(
            f"{r:>5} {a_s:>8.2f} {a_tps:>10.0f} {a_cpu:>8.2f} {b_s:>8.2f} {b_tps:>10.0f} {b_cpu:>8.2f} "
            f"{ratio:>10.3f} {cpu_ratio:>14.3f}"
        )
    print(
        f"median A/B throughput {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
        f"span search costs {1 - statistics.median(ratios):.1%} of throughput"
    )
    print(
        f"median A/B tokens per CPU second {statistics.median(cpu_ratios):.3f} "
        f"(range {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
