"""Throughput of ``packcli pack --engine ray`` against the default engine, start-up apart, in paired rounds.

Every run is ``packcli pack DATA --no-cache`` in a new process (the CLI's ``main``, called by a small
wrapper that also records the clock and the driver's peak memory), so each Ray run starts and stops its
own local instance with ``--num-proc N`` CPUs: N tokenizer actors, then N writer tasks at a time.

- **start-up**: the default engine's ``prepare`` stage (input hashes, loading the tokenizer); for Ray,
  everything until every tokenizer actor has loaded its tokenizer (that, starting Ray, and the actors'
  imports) plus stopping Ray at the end.
- **work**: the rest of the run's wall time: reading, tokenizing, planning, writing the shards.
- **tokens/s per CPU**: packed tokens / work seconds / N.

A round runs the default engine and Ray with the same N back to back, and the ratio of their tokens/s
per CPU is taken inside the round (the machine's speed drifts between rounds; within one it drifts
less); the table gives the median of the rounds' ratios and their range. Every run's shards are
compared byte for byte with those of the first default-engine run.

``--memory`` also runs both engines on the corpus and on the corpus four times over (four copies, so
the samples are four times as many) and reports the driver's peak resident memory (``ru_maxrss`` of
the driver process alone: Ray's workers are other processes).

    python benchmarks/make_chat_corpus.py --conversations 2000 --seed 0 -o benchmarks/data/chat2k.jsonl
    python benchmarks/bench_ray.py --rounds 3 --memory
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The run itself: packcli's CLI in this process, timed after the imports, then what the engine measured.
CHILD = r"""
import json, resource, sys, time
from packcli.cli import main
from packcli.run import pipeline
engines = []  # the run's engine, kept to read its figures (its last_run and received) afterwards
load_engine = pipeline.load_engine
pipeline.load_engine = lambda *args: engines.append(load_engine(*args)) or engines[-1]
t0 = time.perf_counter()
code = 0
try:
    main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code or 0
t1 = time.perf_counter()
run = {k: v for k, v in getattr(engines[0], "last_run", {}).items() if k != "nodes"}
received = dict(getattr(engines[0], "received", {"bytes": 0}))  # the local engine fetches nothing
out = {"code": code, "t0": t0, "t1": t1, "ray": run, "received": received,
       "driver_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
open(sys.argv[1], "w").write(json.dumps(out))
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


def run_pack(data: Path, out: Path, engine: str, workers: int, max_len: int, tmp: Path) -> dict[str, Any]:
    """One run in a new process; its summary, what the wrapper measured, and start-up and work seconds."""
    side = tmp / "run.json"
    argv = [sys.executable, "-c", CHILD, str(side), "pack", str(data), "-o", str(out), "--max-len", str(max_len)]
    argv += ["--no-cache", "--overwrite", "--json", "-q", "--num-proc", str(workers), "--engine", engine]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local instance, not a cluster
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    measured = json.loads(side.read_text()) if side.exists() else {"code": done.returncode}
    if done.returncode != 0 or measured["code"] != 0:
        raise SystemExit(f"packcli failed ({engine}, {workers} workers):\n{done.stderr}")
    summary = json.loads(done.stdout[done.stdout.index("{\n") :])
    wall = measured["t1"] - measured["t0"]
    if engine == "ray":
        # From the start of the run until every actor is ready, and stopping Ray at the end.
        ray = measured["ray"]
        startup = ray["ready_at"] - measured["t0"] + ray.get("shutdown_seconds", 0.0)
    else:
        startup = summary["stage_seconds"]["prepare"]
    return {
        "summary": summary,
        "wall": wall,
        "startup": startup,
        "work": wall - startup,
        "maxrss": measured["driver_maxrss_mb"],
        "received": measured["received"]["bytes"],
        "digests": shard_digests(out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data" / "chat2k.jsonl")
    parser.add_argument("--conversations", type=int, default=2000, help="corpus size when --data is made [2000]")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per worker count [3]")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--memory", action="store_true", help="driver peak memory, corpus x1 and x4")
    args = parser.parse_args()
    if not args.data.exists():
        make_corpus(args.data, args.conversations)
    conversations = sum(1 for line in args.data.open("rb") if line.strip())
    load_before = os.getloadavg()[0]
    reference: dict[str, str] | None = None
    table = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as name:
        tmp = Path(name)
        for workers in args.workers:
            runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
            ratios = []
            for _ in range(args.rounds):
                for engine in ("local", "ray"):
                    run = run_pack(args.data, tmp / "out", engine, workers, args.max_len, tmp)
                    reference = reference if reference is not None else run["digests"]
                    run["same"] = run["digests"] == reference
                    runs[engine].append(run)
                per_cpu = [r[-1]["summary"]["tokens"] / r[-1]["work"] / workers for r in (runs["local"], runs["ray"])]
                ratios.append(per_cpu[1] / per_cpu[0])
            table.append((workers, runs, ratios))
        memory = _memory(args, tmp) if args.memory else []
    load_after = os.getloadavg()[0]

    first = table[0][1]["local"][0]["summary"]
    print(
        f"Corpus: {conversations:,} conversations ({args.data.name}), --max-len {args.max_len}, "
        f"{first['tokens']:,} tokens packed into {first['rows']:,} rows; {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, Ray {_version('ray')}; load average {load_before:.1f} at the start and "
        f"{load_after:.1f} at the end; {args.rounds} paired rounds; medians. Each run is a new process (--no-cache)."
    )
    print()
    print(
        "| engine | workers | wall s | start-up s | work s | tokens/s per CPU (work) | Ray / default per CPU, "
        "median [min, max] | driver received | same shards |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---|")
    med = statistics.median
    for workers, runs, ratios in table:
        for engine in ("local", "ray"):
            rs = runs[engine]
            rate = med(r["summary"]["tokens"] / r["work"] / workers for r in rs)
            ratio = f"{med(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]" if engine == "ray" else ""
            received = f"{med(r['received'] for r in rs) / rs[0]['summary']['samples']:.1f} B/sample"
            print(
                f"| {'default' if engine == 'local' else 'ray'} | {workers} | {med(r['wall'] for r in rs):.2f} | "
                f"{med(r['startup'] for r in rs):.2f} | {med(r['work'] for r in rs):.2f} | {rate / 1e6:.3f} M | "
                f"{ratio} | {received if engine == 'ray' else ''} | {all(r['same'] for r in rs)} |"
            )
    if memory:
        print()
        print("| engine | workers | corpus | samples | driver peak RSS MB | wall s |")
        print("|---|---:|---|---:|---:|---:|")
        for engine, workers, label, run in memory:
            print(
                f"| {engine} | {workers} | {label} | {run['summary']['samples']:,} | {run['maxrss']:.0f} | "
                f"{run['wall']:.1f} |"
            )


def _memory(args: argparse.Namespace, tmp: Path) -> list[tuple[str, int, str, dict[str, Any]]]:
    big = tmp / f"{args.data.stem}x4.jsonl"
    with open(big, "wb") as out:
        for _ in range(4):
            with open(args.data, "rb") as src:
                shutil.copyfileobj(src, out)
    rows = []
    for engine in ("local", "ray"):
        for label, data in (("x1", args.data), ("x4", big)):
            rows.append((engine, 2, label, run_pack(data, tmp / "out", engine, 2, args.max_len, tmp)))
    return rows


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
