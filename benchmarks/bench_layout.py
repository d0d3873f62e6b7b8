"""Benchmark the tokenizer alone in three layouts on all cores: worker processes, threads, its own pool.

The question behind it: packcli's local engine tokenizes in forked worker processes with one tokenizer
thread each. Is that as cheap, per token, as the tokenizer's own thread pool (the parallel ceiling of
bench_pipeline.py), or as threads of one process (``encode_batch`` releases the GIL)? Each layout runs
the same ``encode_batch`` calls over the same rendered conversations:

- ``processes``: N forked processes, ``TOKENIZERS_PARALLELISM=false``, each encoding every N-th text
  in batches of --batch texts (packcli's layout);
- ``threads``: N Python threads of one process, the same batches, the tokenizer's pool off;
- ``pool``: one process, batches of --pool-batch texts, the tokenizer's own thread pool on.

Every measurement runs in a fresh process (the tokenizer's pool cannot be used before a fork), and
rendering is not timed. Rounds run the layouts one after another, in an order that alternates, and
the ratios are taken inside each round (the machine is shared: only in-round ratios mean anything).

    python benchmarks/bench_layout.py --data benchmarks/data/chat.jsonl --rounds 3

(An ``--end-to-end`` mode compared whole runs with the encode moved into the main process, a layout
packcli shipped as an opt-in until 0.10.0; it lost, 0.96-0.99x end to end, and was removed. Its figures
are in benchmarks/README.md and the changelog.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

LAYOUTS = ("processes", "threads", "pool")


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_layout(layout: str, data: Path, workers: int, batch: int, pool_batch: int, limit: int | None) -> dict:
    """Encode every conversation of ``data`` in one layout; return wall and CPU seconds and tokens."""
    if layout != "pool":
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from packcli.tokenize.encoders.tokenizer import load_tokenizer
    from packcli.tokenize.templates.choice import chatml_template

    tokenizer = load_tokenizer(None)
    template = _compile_jinja_template(chatml_template())
    special = dict(tokenizer.special_tokens_map)
    texts = []
    with open(data, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.append(
                    template.render(messages=json.loads(line)["messages"], add_generation_prompt=False, **special)
                )
            if limit is not None and len(texts) >= limit:
                break
    backend = tokenizer.backend_tokenizer

    def encode(part: list[str], size: int) -> int:
        return sum(
            len(e)
            for i in range(0, len(part), size)
            for e in backend.encode_batch(part[i : i + size], add_special_tokens=False)
        )

    counted: list[int] = [0] * workers
    started, cpu_self, cpu_children = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    if layout == "processes":
        pids = []
        for k in range(workers):
            pid = os.fork()
            if pid == 0:
                encode(texts[k::workers], batch)
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        tokens = None  # counted by the children; the other layouts give the same count
    elif layout == "threads":

        def part(k: int) -> None:
            counted[k] = encode(texts[k::workers], batch)

        threads = [threading.Thread(target=part, args=(k,)) for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tokens = sum(counted)
    else:
        tokens = encode(texts, pool_batch)
    wall = time.perf_counter() - started
    cpu = _cpu(resource.RUSAGE_SELF) - cpu_self + _cpu(resource.RUSAGE_CHILDREN) - cpu_children
    return {"layout": layout, "texts": len(texts), "tokens": tokens, "seconds": wall, "cpu_seconds": cpu}


END_TO_END = ("workers", "main")


def _median_range(values: list[float]) -> tuple[float, float, float]:
    s = sorted(values)
    n = len(s)
    mid = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    return mid, s[0], s[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="benchmarks/data/chat.jsonl", help="JSONL chat file")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds [3]")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes or threads [CPUs]")
    parser.add_argument("--batch", type=int, default=256, help="texts per encode_batch call (packcli's batch) [256]")
    parser.add_argument("--pool-batch", type=int, default=1024, help="texts per call with the pool on [1024]")
    parser.add_argument("--limit", type=int, help="only the first N conversations")
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)
    parser.add_argument("--max-len", type=int, default=4096, help="--max-len of the packcli runs [4096]")
    args = parser.parse_args(argv)
    if args.layout:
        result = run_layout(args.layout, Path(args.data), args.workers, args.batch, args.pool_batch, args.limit)
        print(json.dumps(result))
        return 0
    rounds: list[dict[str, Any]] = []
    for k in range(args.rounds):
        order = LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]
        row = {}
        for layout in order:
            cmd = [sys.executable, __file__, "--layout", layout, "--data", args.data, "--workers", str(args.workers)]
            cmd += ["--batch", str(args.batch), "--pool-batch", str(args.pool_batch)]
            cmd += ["--limit", str(args.limit)] if args.limit else []
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row[layout] = json.loads(out.strip().splitlines()[-1])
            r = row[layout]
            print(f"[bench] round {k + 1} {layout}: {r['seconds']:.2f} s wall, {r['cpu_seconds']:.2f} s CPU",
                  file=sys.stderr, flush=True)  # fmt: skip
        rounds.append(row)
    texts, tokens = rounds[0]["threads"]["texts"], rounds[0]["threads"]["tokens"]
    print(f"{texts:,} conversations, {tokens:,} tokens; {args.workers} workers, batches of {args.batch} "
          f"({args.pool_batch} with the pool); {args.rounds} rounds, order alternating; load average "
          f"{os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print()
    print("| layout | seconds (median) | CPU seconds (median) | wall / processes (median, range) | "
          "CPU / processes (median, range) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for layout in LAYOUTS:
        wall = _median_range([r[layout]["seconds"] for r in rounds])[0]
        cpu = _median_range([r[layout]["cpu_seconds"] for r in rounds])[0]
        if layout == "processes":
            print(f"| {layout} (packcli's) | {wall:.2f} | {cpu:.2f} | | |")
            continue
        w = _median_range([r[layout]["seconds"] / r["processes"]["seconds"] for r in rounds])
        c = _median_range([r[layout]["cpu_seconds"] / r["processes"]["cpu_seconds"] for r in rounds])
        print(f"| {layout} | {wall:.2f} | {cpu:.2f} | {w[0]:.2f} ({w[1]:.2f}–{w[2]:.2f}) "
              f"| {c[0]:.2f} ({c[1]:.2f}–{c[2]:.2f}) |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
