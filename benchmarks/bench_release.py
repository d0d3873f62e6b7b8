"""The guard against slowdowns: the working tree against the last release, in paired rounds.

The release (the newest ``v*`` tag, or ``--tag``) is materialised with ``git archive TAG | tar -x`` into
the work directory and run with ``PYTHONPATH`` set to it; the working tree is run the same way with
``PYTHONPATH`` set to the repository. Each round packs every corpus once with each, in alternating
order (release first in even rounds), ``packcli pack DATA --no-cache --max-len L --num-proc N`` in a
new process, start-up included. Per corpus it prints each round's seconds, CPU seconds and the peak
RSS of the largest process of the run, then the median of the in-round ratios (release seconds /
tree seconds: above 1, the tree is faster) with their range, and whether the shards are byte-identical.
Both trees' modules are compiled to byte code first, as pip does when it installs a package (where
``PYTHONDONTWRITEBYTECODE`` is set, a fresh archive would be compiled at every start, the working tree
maybe not).

Corpora (made once, kept in the work directory):

- ``chat``: ``make_chat_corpus.py`` multi-turn conversations (median 1,500 tokens; ``--chat N``);
- ``short``: ``bench_scale.py``'s short chat records, one exchange of about 80 tokens (``--short N``):
  start-up and per-record costs dominate; also given as seconds per million samples.

Run it before landing a change to reading, tokenizing, the token store or writing (docs/development.md):

    python benchmarks/bench_release.py                      # 3 rounds, 3,000 chats, 100k short records
    python benchmarks/bench_release.py --rounds 5 --chat 17500 --short 1000000

The machine may be shared: the ratio inside a round is what to read, not the seconds. ``--json FILE``
writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale  # noqa: E402  (a sibling script: the short corpus)

# Where a version has been set: packcli/version.py since 0.6.0, before it the package or pyproject.toml.
VERSION_FILES = ("packcli/version.py", "packcli/__init__.py", "pyproject.toml")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def last_release() -> str:
    """The newest release, vX.Y.Z: the newest such tag, or, in a clone without tags, the newest version
    the history ever set (see ``release_commit``)."""
    tags = [t for t in _git("tag", "--list", "v*").split() if re.fullmatch(r"v\d+(\.\d+)*", t)]
    if tags:
        return max(tags, key=lambda t: _key(t[1:]))
    log = _git("log", "-p", "--format=", "--", *VERSION_FILES)
    versions = set(re.findall(r'^\+(?:__version__|version) = "(\d+(?:\.\d+)*)"', log, flags=re.M))
    if not versions:
        raise SystemExit("no release in this repository's history; pass --tag")
    return "v" + max(versions, key=_key)


def release_commit(tag: str) -> str:
    """The commit of release ``tag`` (vX.Y.Z): the tag's, or in a clone without tags (clones carry none) the
    commit that set the version to X.Y.Z, the oldest that added a ``__version__ = "X.Y.Z"`` line."""
    with_tag = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"{tag}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if with_tag.returncode == 0:
        return with_tag.stdout.strip()
    version = re.escape(tag.removeprefix("v"))
    found = _git("log", "--format=%H", "--reverse", "-G", f'^(__version__|version) = "{version}"', "--", *VERSION_FILES)
    if not found.split():
        raise SystemExit(f"{tag}: no tag of that name, and no commit set the version to {tag.removeprefix('v')}")
    return found.split()[0]


def materialise(tag: str, workdir: Path) -> Path:
    """The release's files under ``workdir/release-TAG`` (from ``git archive`` of its commit), made once."""
    root = workdir / f"release-{tag}"
    if not (root / "packcli").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", release_commit(tag)], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def corpora(workdir: Path, chats: int, short: int) -> dict[str, Path]:
    out: dict[str, Path] = {}
    if chats:
        path = workdir / f"chat-{chats}.jsonl"
        if not path.exists():
            maker = REPO / "benchmarks" / "make_chat_corpus.py"
            subprocess.run([sys.executable, str(maker), "--conversations", str(chats), "-o", str(path)], check=True)
        out["chat"] = path
    if short:
        out["short"], _ = bench_scale.corpus(workdir, short, "short", 0)
    return out


def run_pack(root: Path, data: Path, out: Path, max_len: int, num_proc: int) -> dict[str, Any]:
    """One ``packcli pack`` of ``root``'s packcli in a new process: seconds, CPU seconds, peak RSS (MB)."""
    argv = ["/usr/bin/time", "-v", sys.executable, "-m", "packcli", "pack", str(data), "--no-cache"]
    argv += ["--max-len", str(max_len), "--num-proc", str(num_proc), "-o", str(out), "--overwrite", "--quiet"]
    argv += ["--json"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=out.parent)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"packcli pack ({root}) failed: {proc.stderr.strip()[-2000:]}")
    user = re.search(r"User time \(seconds\): ([\d.]+)", proc.stderr)
    system = re.search(r"System time \(seconds\): ([\d.]+)", proc.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    summary = json.loads(proc.stdout)
    return {
        "stage_seconds": summary.get("stage_seconds") or {},
        "seconds": round(seconds, 2),
        "cpu_seconds": round(float(user.group(1)) + float(system.group(1)), 2) if user and system else None,
        "peak_rss_mb": round(int(rss.group(1)) / 1024, 1) if rss else None,
    }


def shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def compare(name: str, data: Path, roots: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Paired rounds on one corpus; the figures and the summary line."""
    rounds: list[dict[str, Any]] = []
    identical = None
    for r in range(args.rounds):
        order = ["release", "tree"] if r % 2 == 0 else ["tree", "release"]
        got = {}
        for who in order:
            out = args.workdir / f"out-{name}-{who}"
            got[who] = run_pack(roots[who], data, out, args.max_len, args.num_proc)
        if identical is None:
            identical = shards(args.workdir / f"out-{name}-release") == shards(args.workdir / f"out-{name}-tree")
        ratio = got["release"]["seconds"] / got["tree"]["seconds"]
        rounds.append({**got, "ratio": round(ratio, 3)})
        print(
            f"{name} round {r}: release {got['release']['seconds']:.1f} s "
            f"({got['release']['cpu_seconds']} CPU s, {got['release']['peak_rss_mb']} MB)  "
            f"tree {got['tree']['seconds']:.1f} s ({got['tree']['cpu_seconds']} CPU s, "
            f"{got['tree']['peak_rss_mb']} MB)  release/tree {ratio:.2f}",
            file=sys.stderr,
        )
    ratios = [x["ratio"] for x in rounds]
    with open(data, "rb") as lines:
        records = sum(1 for _ in lines)
    tree_s = statistics.median(x["tree"]["seconds"] for x in rounds)
    release_s = statistics.median(x["release"]["seconds"] for x in rounds)
    return {
        "corpus": name,
        "records": records,
        "rounds": rounds,
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "shards_identical": identical,
        "seconds_per_million": {
            "release": round(release_s / records * 1e6, 1),
            "tree": round(tree_s / records * 1e6, 1),
        },
        "peak_rss_mb": {
            "release": max(x["release"]["peak_rss_mb"] or 0 for x in rounds),
            "tree": max(x["tree"]["peak_rss_mb"] or 0 for x in rounds),
        },
    }


def print_stages(result: dict[str, Any]) -> None:
    """The summary's stage_seconds, median over the rounds, release against tree, for one corpus."""
    stages: list[str] = []
    for r in result["rounds"]:
        for who in ("release", "tree"):
            stages += [s for s in r[who]["stage_seconds"] if s not in stages]
    print(f"\nstage_seconds, {result['corpus']} ({result['records']:,} records), median of the rounds")
    print("| stage | release | tree |")
    print("|---|---|---|")
    for stage in stages:
        cells = []
        for who in ("release", "tree"):
            values = [r[who]["stage_seconds"][stage] for r in result["rounds"] if stage in r[who]["stage_seconds"]]
            cells.append(f"{statistics.median(values):.2f}" if values else "-")
        print(f"| {stage} | {cells[0]} | {cells[1]} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", help="the release to compare with (default: the newest vX.Y.Z tag)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chat", type=int, default=3000, help="conversations of the chat corpus (0: none)")
    parser.add_argument("--short", type=int, default=100_000, help="records of the short corpus (0: none)")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "packcli-bench-release")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--tree", type=Path, default=REPO, help="the packcli to time (default: this working tree)")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tag = args.tag or last_release()
    roots = {"release": materialise(tag, args.workdir), "tree": args.tree.resolve()}
    for root in roots.values():  # byte code for both, as an installed package has it (bench_fixed.py does too)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "packcli")], check=True)
    results = [compare(name, data, roots, args) for name, data in corpora(args.workdir, args.chat, args.short).items()]
    print(
        f"release {tag} ({release_commit(tag)[:10]}) against the working tree, {args.rounds} paired rounds, "
        f"--num-proc {args.num_proc}"
    )
    print(
        "| corpus | records | release/tree (median, range) | s per 1M records release -> tree | "
        "peak RSS MB release -> tree | shards identical |"
    )
    print("|---|---|---|---|---|---|")
    for res in results:
        spm, rss = res["seconds_per_million"], res["peak_rss_mb"]
        print(
            f"| {res['corpus']} | {res['records']:,} | {res['ratio_median']:.2f}x "
            f"({res['ratio_min']:.2f}-{res['ratio_max']:.2f}) | {spm['release']:,} -> {spm['tree']:,} | "
            f"{rss['release']} -> {rss['tree']} | {'yes' if res['shards_identical'] else 'NO'} |"
        )
    for res in results:
        print_stages(res)
    if args.json:
        args.json.write_text(json.dumps({"tag": tag, "results": results}, indent=1))


if __name__ == "__main__":
    main()
