"""Cache parts: what a run that adds an input, swaps a --mix source or resumes after a kill costs.

Writes a seeded chat corpus (``make_chat_corpus.py``, short conversations) as one file of
``--records`` records and as ``--files`` files that split it, then times, in paired rounds:

- **add**: a cold run of all the files (empty cache) against a run of all the files on a cache that
  holds the parts of all but the middle one (made by an untimed run before);
- **mix**: a cold ``--mix A --mix C`` against the same after ``--mix A --mix B``;
- **resume**: a cold run of the one big file against a run after one that was killed (SIGKILL) once
  ``--kill-at`` of its parts were committed;
- with ``--baseline DIR`` (a checkout of packcli from before cache parts), a cold run of that code
  against this one's (time, and the cache's size on disk, hard links counted once).

Every run's shards are checked equal to the cold run's, and the summary's ``cache_parts`` (what was
reused and tokenized) is printed. Prints each round's seconds and ratios, then their medians and
spread. Every run: ``--max-len 2048 --num-proc 2``.

    python benchmarks/bench_cache_parts.py --records 300000 --files 5 --rounds 3 --baseline ../main-before
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKCLI = HERE.parent


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _argv(inputs: list[str], out: Path, cache: Path) -> list[str]:
    options = ["--max-len", "2048", "--num-proc", "2", "-o", str(out), "--cache-dir", str(cache)]
    return [sys.executable, "-m", "packcli", "pack", *inputs, *options, "--overwrite", "--json", "-q"]


def pack(inputs: list[str], out: Path, cache: Path, tree: Path = PACKCLI) -> tuple[float, dict[str, Any]]:
    """Run one pack; return its wall seconds and its summary."""
    began = time.perf_counter()
    # cwd: not a checkout, whose packcli ``python -m`` would import before PYTHONPATH's
    done = subprocess.run(_argv(inputs, out, cache), env=_env(tree), capture_output=True, text=True, cwd=out.parent)
    seconds = time.perf_counter() - began
    if done.returncode:
        sys.exit(f"pack failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds, json.loads(done.stdout)


def shards(out: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(out.glob("shard-*.parquet")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def disk_bytes(root: Path) -> int:
    """Bytes the directory holds on disk, each hard-linked file once (``du -sb``)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def committed_parts(cache: Path) -> int:
    found = 0
    for entry in cache.iterdir() if cache.is_dir() else []:
        meta = entry / "meta.json"
        if meta.is_file():
            with contextlib.suppress(ValueError):  # being written
                found += "part" in json.loads(meta.read_text())
    return found


def killed_run(inputs: list[str], out: Path, cache: Path, parts: int) -> float:
    """Start a pack and SIGKILL it once ``parts`` parts are committed; return when it was killed (s)."""
    began = time.perf_counter()
    proc = subprocess.Popen(
        _argv(inputs, out, cache), env=_env(PACKCLI), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, cwd=out.parent,
    )  # fmt: skip
    while committed_parts(cache) < parts:
        if proc.poll() is not None:
            sys.exit("the run to kill ended before enough parts were committed; lower --kill-at")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers
    proc.wait()
    return time.perf_counter() - began


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000, help="records of the one big file [300000]")
    ap.add_argument("--files", type=int, default=5, help="files the records are split into [5]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kill-at", type=float, default=0.6, help="share of the big file's parts committed [0.6]")
    ap.add_argument("--baseline", type=Path, help="a packcli checkout from before cache parts, to compare cold runs")
    ap.add_argument("--only", choices=("add", "mix", "resume", "baseline"), action="append")
    args = ap.parse_args()
    only = set(args.only or ("add", "mix", "resume", "baseline"))
    work = Path(tempfile.mkdtemp(prefix="bench-parts-"))
    big = work / "big.jsonl"
    corpus = ["--conversations", str(args.records), "--median-tokens", "100", "--seed", "0", "-o", str(big)]
    subprocess.run([sys.executable, str(HERE / "make_chat_corpus.py"), *corpus], check=True, capture_output=True)
    lines = big.read_bytes().splitlines(keepends=True)
    per = math.ceil(len(lines) / args.files)
    files = []
    for k in range(args.files):
        path = work / f"part{k}.jsonl"
        path.write_bytes(b"".join(lines[k * per : (k + 1) * per]))
        files.append(str(path))
    middle = args.files // 2
    print(f"{len(lines):,} records; {args.files} files of {per:,}; work in {work}")
    ratios: dict[str, list[float]] = {k: [] for k in ("add", "mix", "resume", "baseline", "disk")}

    def fresh(name: str) -> Path:
        path = work / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    for r in range(args.rounds):
        if "add" in only:
            cold_s, cold = pack(files, fresh("out-cold"), fresh("cache-cold"))
            pack(files[:middle] + files[middle + 1 :], fresh("out-four"), fresh("cache-add"))
            add_s, added = pack(files, fresh("out-add"), work / "cache-add")
            assert shards(work / "out-add") == shards(work / "out-cold"), "add: other shards than the cold run's"
            ratios["add"].append(add_s / cold_s)
            print(
                f"round {r} add: cold {cold_s:.1f} s, one input added {add_s:.1f} s, "
                f"ratio {add_s / cold_s:.3f}; {added['cache_parts']}"
            )
        if "mix" in only:
            a, b, c = files[0], files[1], files[2]
            ac = ["--mix", f"{a}=0.5", "--mix", f"{c}=0.5"]
            cold_s, _ = pack(ac, fresh("out-mix-cold"), fresh("cache-mix-cold"))
            pack(["--mix", f"{a}=0.5", "--mix", f"{b}=0.5"], fresh("out-ab"), fresh("cache-mix"))
            swap_s, swapped = pack(ac, fresh("out-ac"), work / "cache-mix")
            assert shards(work / "out-ac") == shards(work / "out-mix-cold"), "mix: other shards than the cold run's"
            ratios["mix"].append(swap_s / cold_s)
            print(
                f"round {r} mix: cold {cold_s:.1f} s, B swapped for C {swap_s:.1f} s, "
                f"ratio {swap_s / cold_s:.3f}; {swapped['cache_parts']}"
            )
        if "resume" in only:
            cold_s, cold = pack([str(big)], fresh("out-big"), fresh("cache-big"))
            made = cold["cache_parts"]["parts_made"]
            kill_s = killed_run([str(big)], fresh("out-killed"), fresh("cache-killed"), math.ceil(args.kill_at * made))
            resume_s, resumed = pack([str(big)], fresh("out-resumed"), work / "cache-killed")
            assert shards(work / "out-resumed") == shards(work / "out-big"), "resume: other shards than the cold run's"
            ratios["resume"].append(resume_s / cold_s)
            print(
                f"round {r} resume: cold {cold_s:.1f} s ({made} parts), killed after {kill_s:.1f} s, "
                f"resumed {resume_s:.1f} s, ratio {resume_s / cold_s:.3f}; {resumed['cache_parts']}"
            )
        if "baseline" in only and args.baseline is not None:
            # alternate which goes first
            runs = [("new", PACKCLI), ("old", args.baseline)]
            if r % 2:
                runs.reverse()
            timed = {}
            for name, tree in runs:
                seconds, _ = pack(files, fresh(f"out-{name}"), fresh(f"cache-{name}"), tree)
                timed[name] = (seconds, disk_bytes(work / f"cache-{name}"))
            assert shards(work / "out-new") == shards(work / "out-old"), "baseline: other shards than the old code's"
            ratios["baseline"].append(timed["old"][0] / timed["new"][0])
            ratios["disk"].append(timed["new"][1] / timed["old"][1])
            print(
                f"round {r} cold: old {timed['old'][0]:.1f} s, new {timed['new'][0]:.1f} s, old/new "
                f"{timed['old'][0] / timed['new'][0]:.3f}; cache on disk old {timed['old'][1]:,} B, "
                f"new {timed['new'][1]:,} B"
            )
    print("medians (min-max) over rounds:")
    for key, words in (
        ("add", "one input added / cold"),
        ("mix", "one --mix source swapped / cold"),
        ("resume", "resumed after a kill / cold"),
        ("baseline", "cold: before parts / with parts (>1: faster now)"),
        ("disk", "cache on disk: with parts / before"),
    ):
        if ratios[key]:
            print(f"  {words}: {_spread(ratios[key])}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
