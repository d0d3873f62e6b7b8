"""How ``packcli pack`` scales with the number of samples: seconds per million samples and peak memory.

For each N (100k, 1M, 10M) and length profile it writes a synthetic corpus under ``--workdir`` (a /tmp
directory by default, never the repository), packs it with ``packcli pack --max-len 4096 --no-cache``
(the default engine, ``--num-proc`` = all cores) in a new process, and prints per run: seconds, seconds
per million samples, samples/s, CPU seconds per million samples (user + system of all the run's
processes: the figure to compare on a shared machine, where wall time follows the load), the summary's
``stage_seconds``, and the peak resident memory of every process of the run (the driver, and the
largest worker).

**Records.** Short chat records (``{"messages": [user, assistant, ...]}``), not plain text: a chat
record takes the path real fine-tuning data takes (the chat template, the answer's span located, the
label mask), which is where per-sample costs live; a text record skips half of it. The text is cut from
one fixed pool of words at positions drawn per record, so writing a record costs a slice and a format,
no JSON encoder (the pool needs no escaping): 10M records take about a minute, far less than packing.

**Profiles.**

- ``short``: one exchange, a user turn of 20-200 characters and an answer of 40-400 (about 80 tokens a
  sample with the template): per-sample overhead dominates, as it does at scale.
- ``long``: like real chat, mostly short turns with a lognormal tail: a record's size in characters is
  lognormal (median 600, sigma 1.2), capped at 60,000, spread over 1 + size // 3,000 exchanges (the
  answer takes three quarters of each); 0.35% of records are longer than 4,096 tokens and dropped
  as too long.

Deterministic: block ``b`` of 10,000 records is drawn from its own generator seeded by ``(seed, b)``,
so the first N records are the same whatever N. Corpora are streamed to disk and kept between runs
(``--workdir``); remove them with ``--clean``.

**Memory.** The driver's peak is its own ``VmHWM`` (``/proc/PID/status``); the workers' are read from
``/proc`` every 0.25 s while the run lasts (each process's ``VmHWM`` is its peak so far, so only a
process that starts and ends between two polls is missed; the tokenizer's workers live for the whole
tokenize stage, the writers for the whole write stage). Linux only.

    python benchmarks/bench_scale.py --sizes 100k,1m --profiles short,long
    python benchmarks/bench_scale.py --sizes 10m --profiles short     # last, alone on the machine

``--plan-only`` times the plan and the accounting alone on N samples made in memory (no corpus, no
tokenizer) and reports the process's peak RSS: the driver's share that grows with N, measurable at 10M
in a minute. ``--json FILE`` also writes every run's figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BLOCK = 10_000
POOL_CHARS = 1 << 22  # 4 MiB of words, cut at random offsets
WORDS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their has been if more when will would who so no time about "
    "data model token sample batch train loss layer weight value answer question user system prompt tensor "
    "gradient epoch shard packing length window memory process thread queue file record column row index "
    "python function return class import error string number list table query result output input config"
)
WORDS = WORDS_TEXT.split()


def parse_size(text: str) -> int:
    text = text.strip().lower()
    for suffix, factor in (("k", 1_000), ("m", 1_000_000)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * factor)
    return int(text)


def size_name(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def word_pool(seed: int) -> str:
    """A fixed string of words and some punctuation, the same for a seed."""
    rng = np.random.default_rng([seed, 1 << 30])
    weights = 1.0 / np.arange(1, len(WORDS) + 1)  # Zipf-like
    picks = rng.choice(len(WORDS), size=POOL_CHARS // 4, p=weights / weights.sum())
    marks = rng.random(len(picks))
    parts = []
    for w, m in zip(picks.tolist(), marks.tolist(), strict=True):
        parts.append(WORDS[w] + ("." if m < 0.06 else "," if m < 0.12 else ""))
    return " ".join(parts)[:POOL_CHARS]


def _turns(pool: str, offsets: np.ndarray, sizes: np.ndarray) -> list[str]:
    return [pool[o : o + s] for o, s in zip(offsets.tolist(), sizes.tolist(), strict=True)]


def block_lines(pool: str, profile: str, seed: int, block: int, n: int) -> str:
    """The JSON lines of ``n`` records of block ``block``."""
    rng = np.random.default_rng([seed, block])
    top = len(pool) - 70_000
    if profile == "short":
        user = rng.integers(20, 201, n)
        answer = rng.integers(40, 401, n)
        us = _turns(pool, rng.integers(0, top, n), user)
        ans = _turns(pool, rng.integers(0, top, n), answer)
        return "".join(
            f'{{"messages":[{{"role":"user","content":"{u}"}},{{"role":"assistant","content":"{a}"}}]}}\n'
            for u, a in zip(us, ans, strict=True)
        )
    size = np.minimum(rng.lognormal(np.log(600), 1.2, n), 60_000).astype(np.int64) + 20
    exchanges = 1 + size // 3000
    offsets = rng.integers(0, top, n).tolist()
    lines = []
    for s, k, o in zip(size.tolist(), exchanges.tolist(), offsets, strict=True):
        per = s // k
        u = max(per // 4, 5)
        turns = []
        for j in range(k):
            start = o + j * per
            turns.append(f'{{"role":"user","content":"{pool[start : start + u]}"}}')
            turns.append(f'{{"role":"assistant","content":"{pool[start + u : start + per]}"}}')
        lines.append('{"messages":[' + ",".join(turns) + "]}\n")
    return "".join(lines)


def make_corpus(path: Path, n: int, profile: str, seed: int) -> float:
    """Write ``n`` records of ``profile`` to ``path`` (streamed, block by block); return the seconds."""
    started = time.perf_counter()
    pool = word_pool(seed)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as out:
        for block in range((n + BLOCK - 1) // BLOCK):
            out.write(block_lines(pool, profile, seed, block, min(BLOCK, n - block * BLOCK)))
    tmp.replace(path)
    return time.perf_counter() - started


def corpus(workdir: Path, n: int, profile: str, seed: int) -> tuple[Path, float | None]:
    path = workdir / f"scale-{profile}-{size_name(n)}-seed{seed}.jsonl"
    if path.exists():
        return path, None
    workdir.mkdir(parents=True, exist_ok=True)
    return path, make_corpus(path, n, profile, seed)


# -- the run, and the memory of its processes ---------------------------------------------------------


def _status(pid: int) -> tuple[int, int] | None:
    """(VmHWM, PPid) of a process, VmHWM in kB; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    hwm = ppid = 0
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
        elif line.startswith("PPid:"):
            ppid = int(line.split()[1])
    return hwm, ppid


def _descendants(root: int) -> list[int]:
    """Every process under ``root`` (from /proc/PID/task/TID/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def run_pack(data: Path, out: Path, max_len: int, num_proc: int) -> dict[str, Any]:
    """``packcli pack`` in a new process; its summary, wall seconds and the peak RSS of its processes."""
    argv = [sys.executable, "-m", "packcli", "pack", str(data), "--max-len", str(max_len), "--no-cache"]
    argv += ["--num-proc", str(num_proc), "-o", str(out), "--overwrite", "--quiet", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    driver_kb = 0
    workers: dict[int, int] = {}  # pid -> VmHWM kB
    while proc.poll() is None:
        status = _status(proc.pid)
        if status is not None:
            driver_kb = max(driver_kb, status[0])
        for pid in _descendants(proc.pid):
            child = _status(pid)
            if child is not None:
                workers[pid] = max(workers.get(pid, 0), child[0])
        time.sleep(0.25)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run's processes, waited for
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"packcli pack failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    summary = json.loads(stdout)
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "summary": summary,
        "driver_peak_mb": round(driver_kb / 1024, 1),
        "worker_peak_mb": round(max(workers.values(), default=0) / 1024, 1),
        "workers": len(workers),
    }


# The plan and the accounting alone, on a store of N samples made in memory (lengths as in ``short``):
# what the driver holds at N samples without tokenizing them.
PLAN_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import numpy as np
from packcli.config import PackConfig
from packcli.plan.planner import make_plan
from packcli.run import accounting
from packcli.run.options import plan_options
from packcli.store.tokens import TokenStore

n = int(sys.argv[1])
lengths = np.random.default_rng(0).integers(20, 200, n).astype(np.int32)
meta = {"tokenizer": {}, "pad_id": 0, "records_read": n, "dropped": {}, "segments": [], "files": {},
        "sources": [{"path": "a", "unit": "line"}], "source_starts": [0], "meta_sha256": ""}
store = TokenStore(path=Path("unused"), sample_index=np.arange(n, dtype=np.int64), piece_index=np.zeros(n, np.int32),
                   lengths=lengths, trainable=lengths // 2, first_trained=np.ones(n, np.int32),
                   positions=np.arange(n, dtype=np.int32), meta=meta, content_key=np.zeros((n, 2), "<u8"))
held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
config = PackConfig(inputs=("a",), max_len=4096, output="unused")
t0 = time.perf_counter()
plan = make_plan(plan_options(config), store)
t1 = time.perf_counter()
accounting.summary(config, store, plan, "off")
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"store_mb": round(held), "peak_mb": round(peak), "plan_s": round(t1 - t0, 2),
                  "summary_s": round(t2 - t1, 2), "rows": plan.n_rows}))
"""


def plan_alone(n: int) -> dict[str, Any]:
    """The plan and the accounting of N samples in a new process: seconds and peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PLAN_CHILD, str(n)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the plan alone failed: {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100k,1m", help="comma-separated sample counts (100k, 1m, 10m)")
    parser.add_argument("--profiles", default="short,long", help="short, long or both")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "packcli-scale")
    parser.add_argument("--json", type=Path, help="also write every run's figures to this file")
    parser.add_argument("--generate-only", action="store_true", help="write the corpora, pack nothing")
    parser.add_argument("--clean", action="store_true", help="remove each corpus once it is packed")
    parser.add_argument(
        "--plan-only", action="store_true", help="only the plan and accounting of N samples made in memory"
    )
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.plan_only:
        for n in sizes:
            got = plan_alone(n)
            print(
                f"{size_name(n):>4} plan {got['plan_s']} s, summary {got['summary_s']} s, rows {got['rows']:,}; "
                f"peak RSS {got['peak_mb']} MB (the store's arrays and the imports: {got['store_mb']} MB)",
                flush=True,
            )
        return
    profiles = args.profiles.split(",")
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {time.strftime('%F')}")
    print(f"# packcli pack DATA --max-len {args.max_len} --no-cache --num-proc {args.num_proc}")
    runs = []
    for profile in profiles:
        for n in sizes:
            data, made = corpus(args.workdir, n, profile, args.seed)
            if made is not None:
                print(f"# wrote {data} ({data.stat().st_size / 1e6:.0f} MB) in {made:.1f} s", flush=True)
            if args.generate_only:
                continue
            out = args.workdir / f"out-{profile}-{size_name(n)}"
            run = run_pack(data, out, args.max_len, args.num_proc)
            shutil.rmtree(out, ignore_errors=True)
            if args.clean:
                data.unlink()
            summary = run["summary"]
            stages = {k: v for k, v in summary["stage_seconds"].items() if k != "total"}
            row = {
                "n": n,
                "profile": profile,
                "seconds": run["seconds"],
                "s_per_1m": round(run["seconds"] / n * 1e6, 1),
                "samples_per_s": round(n / run["seconds"]),
                "cpu_seconds": run["cpu_seconds"],
                "cpu_s_per_1m": round(run["cpu_seconds"] / n * 1e6, 1),
                "tokens": summary["tokens"],
                "rows": summary["rows"],
                "dropped": summary["dropped"],
                "driver_peak_mb": run["driver_peak_mb"],
                "worker_peak_mb": run["worker_peak_mb"],
                "workers": run["workers"],
                "stage_seconds": stages,
                "summary_total": summary["seconds"]["total"],
            }
            runs.append(row)
            shown = ", ".join(f"{k} {v:g}" for k, v in stages.items())
            print(
                f"{size_name(n):>4} {profile:<5} {row['seconds']:8.1f} s  {row['s_per_1m']:7.1f} s/1M  "
                f"{row['samples_per_s']:7,} samples/s  CPU {row['cpu_s_per_1m']:.1f} s/1M  "
                f"tokens {row['tokens']:,}  rows {row['rows']:,}  "
                f"peak RSS driver {row['driver_peak_mb']:.0f} MB, largest worker {row['worker_peak_mb']:.0f} MB "
                f"({row['workers']} workers)\n      stage_seconds: {shown}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
