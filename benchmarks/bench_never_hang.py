"""Trials of the never-hang promise: failures and signals at random points of real packs, each many times.

    python benchmarks/bench_never_hang.py chats.jsonl --tries 20 [--tmpfs] [--cases full-disk,error,sigterm,sigint]

Each try packs the JSON lines file (``--num-proc 2``, a fresh cache) in a child process and:
- ``full-disk``: with the cache on a full file system: a 2 MB tmpfs when ``--tmpfs`` is given and this
  process may mount one (root), else a fault put into the token store's writes at a random batch;
- ``error``: with one random record made to raise in the chat template (a template error in a worker);
- ``sigterm`` / ``sigint``: with the signal sent at a random moment of the run (SIGINT to the whole
  process group, as Ctrl-C does), a previous output in place.

Prints one row per case: tries, how many ended within the bound (failures 60 s, signals 15 s), the exit
codes, the slowest end, tracebacks seen, processes left behind, temporary files left, and interrupted
outputs that pass ``packcli verify`` (must be 0), then one JSON line with the same figures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FAIL_WITHIN, STOP_WITHIN = 60.0, 15.0
RAISING = (
    "{%- for m in messages %}{% if m['content'] == 'boom' %}{{ raise_exception('this record goes boom') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
)
FULL_STORE = """
import errno, sys
import packcli.store.writer as writer
left = [int(sys.argv[1])]
class Full:
    def __init__(self, fh): self.fh = fh
    def write(self, data):
        left[0] -= 1
        if left[0] < 0: raise OSError(errno.ENOSPC, "No space left on device")
        return self.fh.write(data)
    def __getattr__(self, name): return getattr(self.fh, name)
made = writer.TokenStoreWriter.__init__
def init(self, *a, **k):
    made(self, *a, **k); self._ids = Full(self._ids)
writer.TokenStoreWriter.__init__ = init
from packcli.cli._app import main
main(sys.argv[2:])
"""


def pack_command(*args: Any, fault: int | None = None) -> list[str]:
    argv = ["pack", *map(str, args), "-q"]
    if fault is None:
        return [sys.executable, "-m", "packcli", *argv]
    return [sys.executable, "-c", FULL_STORE, str(fault), *argv]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def temporaries(root: Path) -> list[str]:
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.startswith((".tmp-", ".packcli-"))
        or ".partial-" in p.name
        or (p.suffix == ".lock" and p.parent == root)
    ]


def verifies(out: Path) -> bool:
    if not (out / "manifest.json").exists():
        return False
    return subprocess.run([sys.executable, "-m", "packcli", "verify", str(out)], capture_output=True).returncode == 0


class Try:
    def __init__(self, command: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lingering: list[int] = []

    def end(self, within: float) -> tuple[int | None, str, float]:
        began = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=within)
        except subprocess.TimeoutExpired:
            self.lingering = descendants(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate()
            return None, err, time.monotonic() - began
        time.sleep(0.5)
        self.lingering = [p for p in _group(self.proc.pid)]
        return self.proc.returncode, err, time.monotonic() - began


def _group(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid`` (the run's workers keep it)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[3]) == pgid:
                    alive.append(int(entry.name))
    return alive


def one_try(case: str, data: Path, work: Path, rng: random.Random, tmpfs: bool, duration: float) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out, cache = work / "out", work / "cache"
    base: list[Any] = [data, "--max-len", "4096", "-o", out, "--num-proc", "2", "--cache-dir", cache]
    within, fault, previous = FAIL_WITHIN, None, None
    mounted = False
    if case == "full-disk":
        if tmpfs:
            cache.mkdir()
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(cache)]).returncode == 0
        if not mounted:
            fault = rng.randrange(8)
    elif case == "error":
        lines = data.read_text().splitlines()
        k = rng.randrange(len(lines))
        lines[k] = json.dumps(
            {"messages": [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "x"}]}
        )
        data = work / "data.jsonl"
        data.write_text("\n".join(lines) + "\n")
        (work / "raising.jinja").write_text(RAISING)
        base = [data, *base[1:], "--chat-template", work / "raising.jinja"]
    else:
        within = STOP_WITHIN
        first = subprocess.run(pack_command(*base[:-2], "--no-cache"), cwd=work, capture_output=True)
        assert first.returncode == 0, first.stderr
        previous = sorted((p.name, p.read_bytes()) for p in out.iterdir())
        base.append("--overwrite")
    run = Try(pack_command(*base, "--seed", "2", fault=fault), work)
    if case in ("sigterm", "sigint"):
        time.sleep(rng.uniform(0.2, duration))
        with contextlib.suppress(ProcessLookupError):
            if case == "sigint":
                os.killpg(run.proc.pid, signal.SIGINT)
            else:
                run.proc.send_signal(signal.SIGTERM)
    code, err, seconds = run.end(within)
    left = temporaries(work)
    if mounted:
        subprocess.run(["umount", str(cache)])
    interrupted = code != 0  # a signal after the run was done is ignored: it exits 0, its output complete
    changed = (
        previous is not None and out.exists() and sorted((p.name, p.read_bytes()) for p in out.iterdir()) != previous
    )
    return {
        "code": code,
        "seconds": seconds,
        "ended": code is not None and seconds <= within,
        "traceback": "Traceback" in err,
        "lines": len(err.strip().splitlines()),
        "left_processes": len(run.lingering),
        "left_files": len(left),
        "bad_output": interrupted and (changed or (previous is None and verifies(out))),
        "last_line": err.strip().splitlines()[-1][:160] if err.strip() else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="a JSON lines file of chats (5,000 real conversations in the trials)")
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--cases", default="full-disk,error,sigterm,sigint")
    ap.add_argument("--tmpfs", action="store_true", help="a real full file system (needs root and mount)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="never-hang-"))
    data = args.data.resolve()
    began = time.monotonic()
    probe = subprocess.run(pack_command(data, "--max-len", "4096", "-o", root / "o", "--num-proc", "2", "--no-cache"))
    assert probe.returncode == 0
    duration = time.monotonic() - began
    print(f"a whole pack takes {duration:.1f} s here; signals come at 0.2 to {duration:.1f} s", file=sys.stderr)
    figures: dict[str, Any] = {}
    for case in args.cases.split(","):
        rows = [one_try(case, data, root / case, rng, args.tmpfs, duration) for _ in range(args.tries)]
        codes = collections.Counter(str(r["code"]) for r in rows)
        figures[case] = {
            "tries": len(rows),
            "ended_in_bound": sum(r["ended"] for r in rows),
            "exit_codes": dict(codes),
            "slowest_s": round(max(r["seconds"] for r in rows), 1),
            "median_s": round(sorted(r["seconds"] for r in rows)[len(rows) // 2], 1),
            "tracebacks": sum(r["traceback"] for r in rows),
            "processes_left": sum(r["left_processes"] for r in rows),
            "files_left": sum(r["left_files"] for r in rows),
            "interrupted_outputs_that_verify": sum(r["bad_output"] for r in rows),
            "last_lines": sorted({r["last_line"] for r in rows}),
        }
        f = figures[case]
        print(
            f"{case:9} tries {f['tries']:3}  ended {f['ended_in_bound']:3}  codes {f['exit_codes']}  "
            f"median {f['median_s']} s  slowest {f['slowest_s']} s  tracebacks {f['tracebacks']}  "
            f"processes left {f['processes_left']}  files left {f['files_left']}  "
            f"bad outputs {f['interrupted_outputs_that_verify']}",
            file=sys.stderr,
        )
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
