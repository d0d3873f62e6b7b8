"""The local pool: results in job order, a job's error in its turn, and a teardown that never waits on a worker."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import time
from typing import Any

import pytest

from packcli.errors import PackcliError
from packcli.procs import channel, pool


def _slow_square(x: int) -> int:
    time.sleep(0.001 * (x % 3))  # answers come out of order
    return x * x


def _fails_at(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"job {x} failed")
    return x


def _sleeps(x: int) -> int:
    if x >= 2:
        time.sleep(3600)
    return x


def test_results_come_in_job_order_whatever_order_the_workers_answer_in() -> None:
    assert list(pool.map_ordered(_slow_square, ((i,) for i in range(200)), 2)) == [i * i for i in range(200)]
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("bad", [0, 5, 39])
def test_a_jobs_error_comes_in_its_turn_with_the_workers_traceback(bad: int) -> None:
    got = []
    with pytest.raises(ValueError, match=f"job {bad} failed") as raised:
        for result in pool.map_ordered(_fails_at, ((i, bad) for i in range(40)), 2):
            got.append(result)
    assert got == list(range(bad))
    cause = raised.value.__cause__
    assert isinstance(cause, channel.RemoteTraceback) and "_fails_at" in str(cause)
    assert not multiprocessing.active_children()


def test_a_worker_killed_from_outside_ends_the_map_at_once() -> None:
    results = pool.map_ordered(_sleeps, ((i,) for i in range(10)), 2)
    with contextlib.closing(results):
        assert [next(results), next(results)] == [0, 1]
        os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(PackcliError, match="a worker process died"):
            next(results)
    assert time.monotonic() - began < 5
    assert not multiprocessing.active_children()


def test_stopping_never_waits_on_a_worker_that_is_stuck_or_stopped() -> None:
    results = pool.map_ordered(_sleeps, ((i,) for i in range(10)), 2)
    assert [next(results), next(results)] == [0, 1]
    workers = multiprocessing.active_children()
    os.kill(workers[0].pid, signal.SIGSTOP)  # takes no SIGTERM until it is continued: killed after the grace
    began = time.monotonic()
    results.close()
    assert time.monotonic() - began < pool.GRACE + 3
    assert not multiprocessing.active_children()


def test_messages_cross_a_socket_whole_however_the_bytes_are_cut() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    message = ("ok", list(range(300_000)))  # far more than a socket buffer holds
    sent = channel.frame(message)
    inbox, got = channel.Inbox(), []
    for start in range(0, len(sent), 65_537):
        theirs.sendall(sent[start : start + 65_537])
        got += inbox.fill(ours)
    assert got == [message]
    theirs.close()
    with pytest.raises(channel.WorkerGone):
        inbox.fill(ours)
    ours.close()


def test_an_error_that_cannot_be_pickled_still_reaches_the_run() -> None:
    class Local(Exception):  # a class pickle cannot find by its name
        pass

    kind, (carried, text) = channel.error_message(Local("local trouble"))
    assert kind == "error" and isinstance(carried, RuntimeError) and "Local: local trouble" in str(carried)
    assert "Local" in text


def _echo(x: Any) -> Any:
    return x


def test_a_job_larger_than_the_socket_buffer_is_sent_without_blocking_the_pool() -> None:
    big = [(bytes(3_000_000),) for _ in range(6)]
    assert [len(r) for r in pool.map_ordered(_echo, iter(big), 2)] == [3_000_000] * 6


def _heap_pages(x: int) -> int:
    return x


def test_the_parent_gives_freed_memory_back_before_it_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else every worker maps what the parent freed, and the parent alone holds it once the workers trim."""
    events: list[str] = []
    real_start = pool.WorkerPool._start

    def trim(pad: int) -> int:
        events.append(f"trim {pad}")
        return 1

    def start(self: Any) -> None:
        events.append("fork")
        real_start(self)

    monkeypatch.setattr(pool, "_malloc_trim", lambda: trim)
    monkeypatch.setattr(pool.WorkerPool, "_start", start)
    assert list(pool.map_ordered(_heap_pages, ((i,) for i in range(4)), 2)) == [0, 1, 2, 3]
    assert events[:3] == ["trim 0", "fork", "fork"]
