"""Throughput of ``packcli pack --engine ray`` on a local Ray instance (1 and 2 workers) against the default engine.

Every run is ``python -m packcli pack DATA --no-cache`` in its own process, timed with the wall clock,
so each Ray run pays for starting and stopping its local instance (``--num-proc N`` gives it N CPUs:
N tokenizer actors, then N writer tasks at a time). The stage seconds are those of the summary
(``tokenize`` includes loading the tokenizer on the driver and starting Ray). Every run's shards are
compared byte for byte with those of the first default-engine run. A last row times starting and
stopping a local Ray instance that does nothing, the fixed cost of the engine on one machine.

The corpus is made with ``benchmarks/make_chat_corpus.py`` when the file is missing (git-ignored).

    python benchmarks/bench_ray.py                      # 2,000 conversations, --max-len 4096
    python benchmarks/bench_ray.py --repeat 3           # best of three per row
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

RAY_START = """
import time, ray
t0 = time.perf_counter()
ray.init("local", num_cpus={n}, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
t1 = time.perf_counter()
ray.shutdown()
print(t1 - t0, time.perf_counter() - t1)
"""


def make_corpus(path: Path, conversations: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    script = REPO / "benchmarks" / "make_chat_corpus.py"
    argv = [sys.executable, str(script), "--conversations", str(conversations), "--seed", "0", "-o", str(path)]
    subprocess.run(argv, check=True)


def shard_digests(out: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.name.startswith("shard-")
    }


def run_pack(data: Path, out: Path, engine: str, workers: int, max_len: int) -> tuple[float, dict[str, Any]]:
    argv = [sys.executable, "-m", "packcli", "pack", str(data), "-o", str(out), "--max-len", str(max_len)]
    argv += ["--no-cache", "--overwrite", "--json", "-q", "--num-proc", str(workers), "--engine", engine]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local instance, not a cluster
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({engine}, {workers} workers):\n{done.stderr}")
    return seconds, json.loads(done.stdout)


def ray_start_stop(workers: int) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-c", RAY_START.format(n=workers)], capture_output=True, text=True, check=True
    )
    start, stop = (float(x) for x in done.stdout.split())
    return start, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data" / "chat2000.jsonl")
    parser.add_argument("--conversations", type=int, default=2000, help="corpus size when --data is made [2000]")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is reported [1]")
    args = parser.parse_args()
    if not args.data.exists():
        make_corpus(args.data, args.conversations)
    conversations = sum(1 for line in args.data.open("rb") if line.strip())

    runs = [("local", 1), ("local", 2), ("ray", 1), ("ray", 2)]
    load_before = os.getloadavg()[0]
    rows = []
    reference: dict[str, str] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        for engine, workers in runs:
            best: tuple[float, dict[str, Any]] | None = None
            for _ in range(args.repeat):
                out = Path(tmp) / f"{engine}-{workers}"
                seconds, summary = run_pack(args.data, out, engine, workers, args.max_len)
                digests = shard_digests(out)
                reference = reference if reference is not None else digests
                same = digests == reference
                shutil.rmtree(out)
                if best is None or seconds < best[0]:
                    best = (seconds, summary)
            assert best is not None
            seconds, summary = best
            rows.append(
                {
                    "engine": engine,
                    "workers": workers,
                    "seconds": seconds,
                    "tokenize": summary["seconds"]["tokenize"],
                    "write": summary["seconds"]["write"],
                    "tokens": summary["tokens"],
                    "rows": summary["rows"],
                    "same_shards": same,
                }
            )
    start_stop = [ray_start_stop(w) for w in (1, 2)]
    load_after = os.getloadavg()[0]

    local1 = rows[0]["seconds"]
    print(
        f"Corpus: {conversations:,} conversations ({args.data.name}), --max-len {args.max_len}, "
        f"{rows[0]['tokens']:,} tokens packed into {rows[0]['rows']:,} rows; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, Ray {_version('ray')}; load average {load_before:.1f} at the start "
        f"and {load_after:.1f} at the end; best of {args.repeat}. Each run is a new process (--no-cache)."
    )
    print()
    print("| engine | workers | seconds | tokenize s | write s | tokens/s | vs local, 1 worker | same shards |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['workers']} | {r['seconds']:.2f} | {r['tokenize']:.2f} | {r['write']:.2f} | "
            f"{r['tokens'] / r['seconds'] / 1e6:.3f} M | {local1 / r['seconds']:.2f}x | {r['same_shards']} |"
        )
    for workers, (start, stop) in zip((1, 2), start_stop, strict=True):
        print(f"| Ray start + stop, no work | {workers} | {start + stop:.2f} | | | | | |")
    print()
    print(
        "workers = --num-proc. The default engine with 1 worker tokenizes in its own process, where the fast "
        "tokenizer's thread pool may use every core; Ray actors, like the default engine's worker processes, "
        "run one tokenizer thread each."
    )


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
