"""Fixed costs: start-up, cache hits, small increments, memory on more cores, and the cold pack against its floor.

    python benchmarks/bench_fixed.py --data chats.jsonl [--rounds 3]
                                     [--cases quickstart,hit,increments,memory,floor,break-even]
                                     [--releases v0.9.0,v0.4.1] [--gemma DIR] [--workdir DIR]
                                     [--no-byte-code]

``--data``: a chat corpus of JSON lines (17.6k real ShareGPT conversations in the figures of
docs/benchmarks.md). Releases are materialised with ``bench_release.materialise`` (a tag, or in a clone
without tags the commit that set the version). Every command runs in a new process, start-up included;
where a ratio is printed it is the median of the ratios taken inside each round, with their range.
Each tree's modules are compiled to byte code first, as pip does when it installs a package (where
``PYTHONDONTWRITEBYTECODE`` is set, nothing else would write it, and every start would compile packcli's
modules again: 0.1 s of a cache hit); ``--no-byte-code`` removes it, for every start to compile them (with
``PYTHONDONTWRITEBYTECODE`` set).

- ``quickstart``: ``pack examples/chat.jsonl --max-len 2048 --no-cache`` (200 records), the tree against each
  release in paired rounds: the time ratio (tree / release, below 1 the tree is faster), peak RSS of each.
- ``hit``: the corpus packed cold (a fresh cache), then again from the cache (a hit): the hit's share of
  the cold run, per round.
- ``increments``: the corpus's first 6,000 conversations in five files. Against a cold pack of all five
  (a fresh cache): adding the fifth to four cached ones; a mix whose fourth source is swapped for the
  fifth (the others cached); a rerun after a kill at 60% of the cold run's time. Each as a share of the
  cold run, and whether the shards equal the cold run's.
- ``memory``: the whole process tree's peak summed PSS at ``--num-proc`` 1, 2 and 3 on the corpus's first
  5,000 conversations: the tree and the oldest release with ``--no-cache``, and the tree with a cache that
  knows the tokenizer (its record and the fast encoder's facts; each run tokenizes anew); with ``--gemma
  DIR``, the tree with that tokenizer at ``--num-proc 2``, both ways.
- ``break-even``: ``--encoder tokenizers`` against ``--encoder fast`` on inputs of 150 to 1,200 conversations, at
  ``--num-proc`` 1 and 2, with a cache that knows the tokenizer and without one: where the fast encoder pays
  (``FAST_MIN_BYTES`` and ``FAST_MIN_BYTES_KNOWN`` in ``packcli/tokenize/encoders/encoder_choice.py``).
- ``floor``: ``benchmarks/floor.py`` (read, decode, render, encode; nothing else) against the tree's cold
  pack of the corpus (``--no-cache``), paired; and the oldest release's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_release  # noqa: E402  (a sibling script: releases materialised by tag or version commit)


def run(root: Path, argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``python -m packcli ARGV`` of the tree at ``root``; return (seconds, peak RSS MB of its largest process)."""
    began = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-m", "packcli", *argv],
        cwd=root,  # python -m puts the working directory first on the path: the tree run is the one there
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - began
    if proc.returncode:
        raise SystemExit(f"packcli {' '.join(argv)} failed ({root}):\n{proc.stderr[-2000:]}")
    rss = next((int(line.split()[-1]) / 1024 for line in proc.stderr.splitlines() if "Maximum resident" in line), 0.0)
    return seconds, rss


def ratio_line(name: str, ratios: list[float], extra: str = "") -> str:
    med = statistics.median(ratios)
    return f"{name}: {med:.3f} (range {min(ratios):.3f}-{max(ratios):.3f}){extra}"


def quickstart(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    argv = ["pack", str(REPO / "examples" / "chat.jsonl"), "--max-len", "2048", "--no-cache", "--overwrite", "-q", "-o"]
    out: dict[str, Any] = {}
    for name in roots:
        if name == "tree":
            continue
        ratios: list[float] = []
        rss: dict[str, list[float]] = {"tree": [], name: []}
        for r in range(args.rounds):
            order = ["tree", name] if r % 2 else [name, "tree"]
            took = {}
            for who in order:
                took[who], peak = run(roots[who], [*argv, str(work / f"qs-{who}")])
                rss[who].append(peak)
            ratios.append(took["tree"] / took[name])
        tree_rss, release_rss = statistics.median(rss["tree"]), statistics.median(rss[name])
        out[name] = {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "rss_tree": tree_rss, "rss_release": release_rss}  # fmt: skip
        print(
            ratio_line(f"quickstart tree/{name}", ratios, f"; peak RSS {tree_rss:.0f} MB against {release_rss:.0f} MB")
        )
    return out


def hit(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    shares = []
    for _ in range(args.rounds):
        cache = work / "hit-cache"
        shutil.rmtree(cache, ignore_errors=True)
        base = ["pack", str(args.data), "--max-len", "4096", "--overwrite", "-q", "--cache-dir", str(cache)]
        cold, _ = run(roots["tree"], [*base, "-o", str(work / "hit-cold")])
        warm, _ = run(roots["tree"], [*base, "-o", str(work / "hit-warm")])
        shares.append(warm / cold)
        print(f"  cold {cold:.2f} s, hit {warm:.2f} s", file=sys.stderr)
    print(ratio_line("hit / cold", shares))
    return {"share": statistics.median(shares), "min": min(shares), "max": max(shares)}


def five_files(args: argparse.Namespace, work: Path) -> list[Path]:
    lines = args.data.read_bytes().splitlines()[:6000]
    files = []
    for k in range(5):
        path = work / f"part{k}.jsonl"
        path.write_bytes(b"\n".join(lines[k * 1200 : (k + 1) * 1200]) + b"\n")
        files.append(path)
    return files


def shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def increments(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    tree = roots["tree"]
    files = [str(f) for f in five_files(args, work)]
    base = ["--max-len", "4096", "--overwrite", "-q", "--num-proc", "2"]
    mix = [f"--mix={f}=0.25" for f in files[:4]]
    swapped = [f"--mix={f}=0.25" for f in [*files[:3], files[4]]]
    cases: dict[str, list[float]] = {"add the fifth": [], "swap a mix source": [], "rerun after a kill at 60%": []}
    same: dict[str, bool] = {}

    def fresh() -> list[str]:
        cache = work / "inc-cache"
        shutil.rmtree(cache, ignore_errors=True)
        return ["--cache-dir", str(cache)]

    for _ in range(args.rounds):
        cold, _ = run(tree, ["pack", *files, *base, *fresh(), "-o", str(work / "inc-cold")])
        cold_mix, _ = run(tree, ["pack", *swapped, *base, *fresh(), "-o", str(work / "inc-cold-mix")])
        cache = fresh()
        run(tree, ["pack", *files[:4], *base, *cache, "-o", str(work / "inc-four")])
        added, _ = run(tree, ["pack", *files, *base, *cache, "-o", str(work / "inc-added")])
        cases["add the fifth"].append(added / cold)
        same["add the fifth"] = shards(work / "inc-added") == shards(work / "inc-cold")
        cache = fresh()
        run(tree, ["pack", *mix, *base, *cache, "-o", str(work / "inc-mix")])
        swap, _ = run(tree, ["pack", *swapped, *base, *cache, "-o", str(work / "inc-swap")])
        cases["swap a mix source"].append(swap / cold_mix)
        same["swap a mix source"] = shards(work / "inc-swap") == shards(work / "inc-cold-mix")
        cache = fresh()
        killed = subprocess.Popen(
            [sys.executable, "-m", "packcli", "pack", *files, *base, *cache, "-o", str(work / "inc-killed")],
            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        time.sleep(0.6 * cold)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        rerun, _ = run(tree, ["pack", *files, *base, *cache, "-o", str(work / "inc-rerun")])
        cases["rerun after a kill at 60%"].append(rerun / cold)
        same["rerun after a kill at 60%"] = shards(work / "inc-rerun") == shards(work / "inc-cold")
    out = {}
    for name, shares in cases.items():
        print(ratio_line(f"{name} / cold", shares, f"; shards equal the cold run's: {same[name]}"))
        out[name] = {"share": statistics.median(shares), "min": min(shares), "max": max(shares), "same": same[name]}
    return out


def peak_pss(root: Path, argv: list[str], env: dict[str, str] | None = None) -> float:
    """The peak, over 50 ms samples, of the summed PSS (MB) of a packcli run's process tree."""
    sys.path.insert(0, str(HERE))
    proc = subprocess.Popen(
        [sys.executable, "-m", "packcli", *argv], cwd=root, env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, sum(_pss(pid) for pid in _tree(proc.pid)))
        time.sleep(0.05)
    return peak


def _tree(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                kids.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry.name)
                )
            except OSError:
                continue
    out, k = [pid], 0
    while k < len(out):
        out += kids.get(out[k], [])
        k += 1
    return out


def _pss(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0


def memory(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = work / "mem5k.jsonl"
    data.write_bytes(b"\n".join(args.data.read_bytes().splitlines()[:5000]) + b"\n")
    oldest = list(roots)[-1]
    cache = work / "mem-cache"
    out: dict[str, Any] = {}

    def measure(who: str, n: int, extra: list[str], label: str) -> None:
        for entry in cache.glob("*"):  # tokenized again each time; what was learned of the tokenizer kept
            if entry.is_dir() and entry.name != "tokenizers":
                shutil.rmtree(entry)
        argv = ["pack", str(data), "--max-len", "4096", "--overwrite", "-q", "--num-proc", str(n), *extra]
        out[f"{who} {label} num_proc {n}"] = peak_pss(roots[who], [*argv, "-o", str(work / f"mem-{who}")])
        print(f"peak summed PSS, {who}, {label}, --num-proc {n}: {out[f'{who} {label} num_proc {n}']:.0f} MB")

    for who in ("tree", oldest):
        for n in (1, 2, 3):
            measure(who, n, ["--no-cache"], "--no-cache")
    shutil.rmtree(cache, ignore_errors=True)
    run(roots["tree"], ["pack", str(data), "--max-len", "4096", "--overwrite", "-q", "--cache-dir", str(cache),
                        "-o", str(work / "mem-learn")])  # fmt: skip
    for n in (1, 2, 3):
        measure("tree", n, ["--cache-dir", str(cache)], "with the cache")
    if args.gemma:
        argv = ["--tokenizer", str(args.gemma), "--on-error", "skip"]
        measure("tree", 2, [*argv, "--no-cache"], "Gemma 3's tokenizer, --no-cache")
        run(roots["tree"], ["pack", str(data), "--max-len", "8192", "--overwrite", "-q", "--cache-dir", str(cache),
                            *argv, "-o", str(work / "mem-learn")])  # fmt: skip
        measure("tree", 2, [*argv, "--cache-dir", str(cache)], "Gemma 3's tokenizer, with the cache")
    return out


def floor(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    oldest = list(roots)[-1]
    argv = ["pack", str(args.data), "--max-len", "4096", "--no-cache", "--overwrite", "-q", "--num-proc", "2"]
    against_floor, against_old = [], []
    for _ in range(args.rounds):
        began = time.perf_counter()
        subprocess.run([sys.executable, str(HERE / "floor.py"), str(args.data), "--num-proc", "2"], check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(roots["tree"])})  # fmt: skip
        floor_s = time.perf_counter() - began
        tree_s, _ = run(roots["tree"], [*argv, "-o", str(work / "floor-tree")])
        old_s, _ = run(roots[oldest], [*argv, "-o", str(work / "floor-old")])
        against_floor.append(tree_s / floor_s)
        against_old.append(old_s / tree_s)
        print(f"  floor {floor_s:.2f} s, tree {tree_s:.2f} s, {oldest} {old_s:.2f} s", file=sys.stderr)
    print(ratio_line("cold pack / floor", against_floor))
    print(ratio_line(f"{oldest} / cold pack (above 1: the tree is faster)", against_old))
    return {"floor": statistics.median(against_floor), "oldest": statistics.median(against_old)}


def break_even(roots: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Each encoder on inputs of growing size (distinct conversations each), at ``--num-proc`` 1 and 2, with a
    cache that knows the tokenizer (its record and the fast encoder's facts: what a second run finds) and
    with ``--no-cache`` (the first run: the fast encoder probed): where ``fastokens`` starts to pay."""
    lines = args.data.read_bytes().splitlines()
    known = work / "be-known"
    shutil.rmtree(known, ignore_errors=True)
    head = work / "be-head.jsonl"
    head.write_bytes(b"\n".join(lines[:50]) + b"\n")
    run(roots["tree"], ["pack", str(head), "--max-len", "4096", "-q", "--overwrite", "--encoder", "fast",
                        "--cache-dir", str(known), "-o", str(work / "be-out")])  # fmt: skip
    out: dict[str, Any] = {}
    at = 50
    for n in (150, 300, 450, 600, 900, 1200):
        for num_proc in (1, 2):
            for cache in ("known", "none"):
                gains = []
                for _ in range(args.rounds):
                    data = work / "be.jsonl"
                    data.write_bytes(b"\n".join(lines[at : at + n]) + b"\n")
                    at = at + n if at + 2 * n < len(lines) else 50
                    took = {}
                    for encoder in ("tokenizers", "fast"):
                        where = ["--no-cache"]
                        if cache == "known":
                            shutil.rmtree(work / "be-cache", ignore_errors=True)
                            shutil.copytree(known, work / "be-cache")
                            where = ["--cache-dir", str(work / "be-cache")]
                        argv = ["pack", str(data), "--max-len", "4096", "-q", "--overwrite", "--encoder", encoder,
                                "--num-proc", str(num_proc), *where, "-o", str(work / "be-out")]  # fmt: skip
                        took[encoder], _ = run(roots["tree"], argv)
                    gains.append(took["tokenizers"] - took["fast"])
                mb = data.stat().st_size / 1e6
                key = f"{n} conversations (~{mb:.1f} MB), --num-proc {num_proc}, facts {cache}"
                out[key] = statistics.median(gains)
                print(f"{key}: tokenizers - fastokens {statistics.median(gains):+.2f} s "
                      f"(range {min(gains):+.2f} to {max(gains):+.2f})")  # fmt: skip
    return out


CASES: dict[str, Callable[[dict[str, Path], argparse.Namespace, Path], dict[str, Any]]] = {
    "quickstart": quickstart,
    "hit": hit,
    "increments": increments,
    "memory": memory,
    "floor": floor,
    "break-even": break_even,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--releases", default="v0.9.0,v0.4.1", help="releases to compare with, newest first")
    ap.add_argument("--gemma", type=Path, help="a directory with Gemma 3's tokenizer.json (the memory case)")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--no-byte-code", action="store_true", help="do not compile the trees' modules first")
    args = ap.parse_args()
    args.data = args.data.resolve()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    work.mkdir(parents=True, exist_ok=True)
    roots = {"tree": REPO}
    for tag in filter(None, args.releases.split(",")):
        roots[tag] = bench_release.materialise(tag, work)
    for root in roots.values():
        if args.no_byte_code:
            for cached in (root / "packcli").rglob("__pycache__"):
                shutil.rmtree(cached, ignore_errors=True)
        else:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "packcli")], check=True)
    figures = {case: CASES[case](roots, args, work) for case in args.cases.split(",")}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
