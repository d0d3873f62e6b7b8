"""The local process pool: run jobs in forked worker processes, results in job order, never more workers than jobs."""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packcli.errors import Opt, PackcliError
from packcli.procs import lifetime as procs
from packcli.procs.stop import raise_if_stopped

# In a worker process: the context its pool's initializer received (``map_ordered``'s ``context``).
_WORKER: dict[str, Any] = {}


def _init_worker(parent_pid: int, context: Any = None) -> None:
    # One tokenizer thread per worker process: the processes are the parallelism. This also keeps the
    # Rust thread pool from being used across fork, which can deadlock when the parent already used it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Die with the parent, take SIGTERM by default, ignore Ctrl-C (the parent stops the workers).
    procs.init_worker(parent_pid)
    _WORKER["context"] = context  # forked, never pickled: an encoder with its loaded tokenizer


def _with_context(fn: Callable[..., Any], *job: Any) -> Any:
    """Run one job in a worker, with the context its initializer received first."""
    return fn(_WORKER["context"], *job)


def _result(future: Future[Any]) -> Any:
    # Wait in short steps, so that a stop request is seen while a worker is busy.
    while True:
        raise_if_stopped()
        try:
            return future.result(timeout=0.2)
        except TimeoutError:
            continue
        except BrokenProcessPool as exc:
            raise PackcliError(
                "a worker process died (killed by a signal or out of memory)",
                hint=("run again, with a lower ", Opt("num_proc"), " if memory is short"),
            ) from exc


def map_ordered(
    fn: Callable[..., Any],
    jobs: Iterator[tuple[Any, ...]],
    num_proc: int,
    on_start: Callable[[], None] | None = None,
    context: Any = None,
) -> Generator[Any, None, None]:
    """Run ``fn`` over jobs, in worker processes when num_proc > 1, yielding results in job order.

    At most a few batches per worker are in flight, so memory does not grow with the input. When a
    job cannot be made (an input that cannot be read further on), the results of the jobs before it
    come first and its error after them, as with one process: a problem those jobs hold is the one
    the caller sees first, whatever ``num_proc`` is.

    A caller that stops iterating early should close the generator (``contextlib.closing``), so
    that the workers are stopped there and then, not whenever the garbage collector gets to it.

    ``on_start`` runs once the workers are forked (or before the first job, when they run here): where
    a thread the workers talk to is started, since a fork must not copy a busy thread.

    ``context``: what every job needs and no job should carry (an encoder, a store); given, each job
    runs as ``fn(context, *job)``, the workers receiving it once, through the pool's initializer.
    """
    started = on_start or (lambda: None)
    # Here, a job is fn(context, *job); in a worker, the worker's own copy of the context comes first.
    here = fn if context is None else functools.partial(fn, context)
    there = fn if context is None else functools.partial(_with_context, fn)
    if num_proc <= 1:
        started()
        for job in jobs:
            raise_if_stopped()
            yield here(*job)
        return
    # Never more workers than jobs: the first num_proc jobs are read before any process starts.
    first: list[tuple[Any, ...]] = []
    read_error = _take(jobs, num_proc, first)
    if len(first) <= 1:
        started()
        for job in first:
            raise_if_stopped()
            yield here(*job)
        if read_error is not None:
            raise read_error
        return
    num_proc = min(num_proc, len(first))
    executor = procs.start_pool(num_proc, multiprocessing.get_context("fork"), _init_worker, context)
    pending: deque[Future[Any]] = deque()
    try:
        pending.extend(procs.submit(executor, there, *job) for job in first)
        del first
        started()
        while read_error is None:
            if len(pending) >= 2 * num_proc + 1:
                yield _result(pending.popleft())
            raise_if_stopped()
            batch: list[tuple[Any, ...]] = []
            read_error = _take(jobs, 1, batch)
            if not batch:
                break
            pending.append(procs.submit(executor, there, *batch[0]))
        while pending:
            yield _result(pending.popleft())
        if read_error is not None:
            raise read_error
    except BaseException:
        # Stopping (an error, a signal, or the consumer giving up): do not wait for work in flight.
        procs.stop_pool(executor)
        raise
    procs.close_pool(executor)


def _take(jobs: Iterator[tuple[Any, ...]], n: int, into: list[tuple[Any, ...]]) -> PackcliError | None:
    """Append up to ``n`` jobs to ``into``; return the error that stopped the reading, if any.

    The error is returned without its traceback: kept in the generator's frame, a traceback would
    refer back to that frame, a cycle only the garbage collector could break.
    """
    try:
        into.extend(itertools.islice(jobs, n))
    except PackcliError as exc:
        return exc.with_traceback(None)
    return None
