"""A run that fails, or is told to stop, ends promptly: every case tried many times, since a race shows once in a while.

Each try spawns a real ``packcli pack`` (the process is the point: signals, exit codes, workers), with a
fault put at a random point of the workers' or the writer's work, or a signal sent at a random moment,
and checks that it ends within its bound, with its one line and no traceback, no process left behind,
no temporary file left, and no output that looks complete unless the run completed.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import write_jsonl
from .processes import children, running_with, wait_for

TRIES = 6  # each case; a race of 1 in 4 to 6 fails at least one try of six with odds of about 2 in 3 or more
FAIL_WITHIN = 60.0  # seconds a failing run may take to end
STOP_WITHIN = 15.0  # seconds a signalled run may take to end
INTERRUPTED = "Error: interrupted; the previous output, if any, was left as it was"

# A pack run with a fault put in first: argv is FAULT N -- PACK ARGS.
FAULTY_RUN = """
import errno, sys, time
fault, n, args = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
left = [n]

def spent() -> bool:
    left[0] -= 1
    return left[0] < 0

if fault == "full-store":  # the token store's disk fills at its Nth write
    import packcli.store.writer as writer

    class Full:
        def __init__(self, fh):
            self.fh = fh
        def write(self, data):
            if spent():
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.fh.write(data)
        def __getattr__(self, name):
            return getattr(self.fh, name)

    made = writer.TokenStoreWriter.__init__
    def init(self, *a, **k):
        made(self, *a, **k)
        self._ids = Full(self._ids)
    writer.TokenStoreWriter.__init__ = init
elif fault == "full-shards":  # the output's disk fills at the Nth shard (written by a worker)
    import packcli.output.write as write
    real = write.write_shard
    def write_shard(tables, path, *a):
        if path.name.startswith(f"shard-{n:05d}"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(tables, path, *a)
    write.write_shard = write_shard
elif fault == "stuck-plan":  # the plan never ends, and has no safe point: only the watchdog ends the run
    import packcli.run.pipeline as pipeline
    def plan_run(*a, **k):
        print("planning", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    pipeline.plan_run = plan_run
elif fault == "stalled":  # the store stops taking batches, and the workers die: nothing will ever come
    import packcli.procs.watchdog as watchdog
    import packcli.tokenize.batches.building as building
    watchdog.STALL = float(n)
    take = building.StoreBuilder.take
    def stalled(self, result):
        open("stalled", "w").close()
        while True:
            time.sleep(3600)
    building.StoreBuilder.take = stalled

from packcli.cli._app import main
main(args)
"""


def chats(n: int, boom: int | None = None) -> list[dict[str, Any]]:
    """Chat records of varied length; record ``boom`` (0-based) makes the raising template raise."""
    return [
        {
            "messages": [
                {"role": "user", "content": "boom" if i == boom else f"question {i} " * (1 + i % 5)},
                {"role": "assistant", "content": f"answer {i} " * (1 + i % 11)},
            ]
        }
        for i in range(n)
    ]


RAISING_TEMPLATE = (
    "{%- for m in messages %}{% if m['content'] == 'boom' %}{{ raise_exception('this record goes boom') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
)


def spawn(cwd: Path, *args: Any, fault: tuple[str, int] | None = None) -> subprocess.Popen[str]:
    argv = [str(a) for a in args]
    if fault is None:
        command = [sys.executable, "-m", "packcli", "pack", *argv, "-q"]
    else:
        command = [sys.executable, "-c", FAULTY_RUN, fault[0], str(fault[1]), "--", "pack", *argv, "-q"]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=cwd
    )


def ended(proc: subprocess.Popen[str], within: float) -> tuple[int, str, float]:
    """Wait for the run to end (killing its group if it does not, so that no try outlives the test)."""
    began = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"the run did not end within {within:.0f} s; it printed: {err[-2000:]}") from None
    return proc.returncode, err, time.monotonic() - began


def left_behind(root: Path, marker: str) -> list[str]:
    """Temporary files and directories of packcli under ``root`` (the output's lock file among them; the
    cache's entries keep theirs), after waiting for the processes running with ``marker`` to be gone."""
    names = [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.startswith((".tmp-", ".packcli-"))
        or ".partial-" in p.name
        or (p.name.endswith(".lock") and p.parent == root)
    ]
    wait_for(lambda: not running_with(marker), seconds=10)
    return names


def complete(out: Path) -> bool:
    """Whether ``out`` passes ``packcli verify``."""
    check = subprocess.run(
        [sys.executable, "-m", "packcli", "verify", str(out)], capture_output=True, text=True, timeout=120
    )
    return check.returncode == 0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The records, the raising template, and ``previous/``: the output of a run before (--seed 1)."""
    root = tmp_path_factory.mktemp("never-hang")
    write_jsonl(root / "chat.jsonl", chats(1500))
    (root / "raising.jinja").write_text(RAISING_TEMPLATE)
    first = spawn(root, root / "chat.jsonl", "--max-len", "512", "-o", root / "previous", "--seed", "1", "--no-cache")
    assert ended(first, FAIL_WITHIN)[0] == 0
    return root


@pytest.mark.parametrize("seed", range(TRIES))
def test_an_error_in_a_worker_ends_the_run(seed: int, inputs: Path, tmp_path: Path) -> None:
    boom = random.Random(seed).randrange(1500)
    data = write_jsonl(tmp_path / "data.jsonl", chats(1500, boom=boom))
    out = tmp_path / "out"
    run = spawn(
        tmp_path, data, "--chat-template", inputs / "raising.jinja", "--max-len", "512", "-o", out,
        "--num-proc", "2", "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    code, err, _ = ended(run, FAIL_WITHIN)
    assert code == 1, err
    assert err.strip().splitlines() == [
        f"Error: {data} line {boom + 1}: the chat template raised on message 0 (user): this record goes boom; fix "
        "the record or use a chat template that renders it (--chat-template), or pass --on-error skip to skip bad "
        "records"
    ]
    assert left_behind(tmp_path, str(out)) == []
    assert not out.exists()


@pytest.mark.parametrize("seed", range(TRIES))
def test_a_full_disk_under_the_token_store_ends_the_run(seed: int, inputs: Path, tmp_path: Path) -> None:
    writes = random.Random(seed).randrange(6)  # 1500 records: six batches, each written once
    out = tmp_path / "out"
    run = spawn(
        tmp_path, inputs / "chat.jsonl", "--max-len", "512", "-o", out, "--num-proc", "2",
        "--cache-dir", tmp_path / "cache", fault=("full-store", writes),
    )  # fmt: skip
    code, err, _ = ended(run, FAIL_WITHIN)
    assert code == 1, err
    assert err.strip().splitlines() == [
        f"Error: {tmp_path / 'cache'}: cannot write the token store (No space left on device); choose a writable "
        "--cache-dir with free space, or pass --no-cache"
    ]
    assert left_behind(tmp_path, str(out)) == []
    assert not out.exists()


@pytest.mark.parametrize("seed", range(TRIES))
def test_a_full_disk_under_the_shards_ends_the_run(seed: int, inputs: Path, tmp_path: Path) -> None:
    shard = random.Random(seed).randrange(3)  # 1500 records: three shards of 40 rows
    out = tmp_path / "out"
    run = spawn(
        tmp_path, inputs / "chat.jsonl", "--max-len", "512", "-o", out, "--num-proc", "2", "--rows-per-shard",
        "40", "--cache-dir", tmp_path / "cache", fault=("full-shards", shard),
    )  # fmt: skip
    code, err, _ = ended(run, FAIL_WITHIN)
    assert code == 1, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"Error: {out}: cannot write a shard (No space left on device") and line.endswith(
        "free disk space or choose another -o"
    ), line
    assert left_behind(tmp_path, str(out)) == []
    assert not out.exists()


@pytest.mark.parametrize("seed", range(2 * TRIES))
def test_a_signal_at_a_random_moment_ends_the_run(seed: int, inputs: Path, tmp_path: Path) -> None:
    rng = random.Random(seed)
    sig = (signal.SIGTERM, signal.SIGINT)[seed % 2]
    out = tmp_path / "out"
    shutil.copytree(inputs / "previous", out)
    previous = {p.name: p.read_bytes() for p in out.iterdir()}
    run = spawn(
        tmp_path, inputs / "chat.jsonl", "--max-len", "512", "-o", out, "--num-proc", "2", "--overwrite",
        "--seed", "2", "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    time.sleep(rng.uniform(0.3, 6.0))  # anywhere from its start-up to its end (about 4 to 8 s here)
    if sig == signal.SIGINT:
        os.killpg(run.pid, sig)  # Ctrl-C reaches the whole process group
    else:
        run.send_signal(sig)  # as a CI runner's timeout or a container's stop does
    code, err, _ = ended(run, STOP_WITHIN)
    assert "Traceback" not in err
    assert left_behind(tmp_path, str(out)) == []
    now = {p.name: p.read_bytes() for p in out.iterdir()}
    if code == 0:  # the signal came after the run was done: ignored, the run exits as it would have
        assert now != previous and complete(out)
    else:
        # Before packcli's first line runs (Python's own start-up), the signal ends it as any program.
        assert code in (130, -sig) and now == previous, (code, err)
        if code == 130:
            assert err.strip().splitlines()[-1] == INTERRUPTED


def test_a_stop_no_safe_point_honours_ends_the_run_after_the_grace(inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = spawn(tmp_path, inputs / "chat.jsonl", "--max-len", "512", "-o", out, "--no-cache", fault=("stuck-plan", 0))
    wait_for(lambda: (tmp_path / "out").exists() or any(tmp_path.glob(".out.partial-*")), seconds=60)
    time.sleep(1.0)
    run.send_signal(signal.SIGTERM)
    code, err, seconds = ended(run, STOP_WITHIN)
    assert code == 130 and err.strip().splitlines()[-1] == INTERRUPTED, err
    assert seconds >= 4.0  # the watchdog's grace (5 s), not a safe point, ended it
    assert left_behind(tmp_path, str(out)) == []
    assert not out.exists()


def test_a_run_left_with_no_worker_and_no_progress_says_so(inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = spawn(
        tmp_path, inputs / "chat.jsonl", "--max-len", "512", "-o", out, "--num-proc", "2", "--no-cache",
        fault=("stalled", 3),
    )  # fmt: skip
    wait_for(lambda: (tmp_path / "stalled").exists(), seconds=60)
    for worker in children(run.pid):
        os.kill(worker, signal.SIGKILL)
    code, err, _ = ended(run, FAIL_WITHIN)
    assert code == 1, err
    assert err.strip().splitlines()[-1] == (
        "Error: the run stopped making progress: its worker processes are gone and none answered for 3 s; "
        "run again, with a lower --num-proc if memory is short"
    )
    assert left_behind(tmp_path, str(out)) == []
