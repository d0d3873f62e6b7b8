"""The local process pool: run jobs in forked worker processes, results in job order, never more workers than jobs."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packcli import procs
from packcli.errors import PackcliError, raise_if_stopped


def _init_worker(parent_pid: int) -> None:
    # One tokenizer thread per worker process: the processes are the parallelism. This also keeps the
    # Rust thread pool from being used across fork, which can deadlock when the parent already used it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Die with the parent, take SIGTERM by default, ignore Ctrl-C (the parent stops the workers).
    procs.init_worker(parent_pid)


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
                "a worker process died (killed by a signal or out of memory); "
                "run again, with a lower --num-proc if memory is short"
            ) from exc


def map_ordered(fn: Callable[..., Any], jobs: Iterator[tuple[Any, ...]], num_proc: int) -> Iterator[Any]:
    """Run ``fn`` over jobs, in worker processes when num_proc > 1, yielding results in job order.

    At most a few batches per worker are in flight, so memory does not grow with the input.
    """
    # Never more workers than jobs: the first num_proc jobs are read before any process starts.
    first = list(itertools.islice(jobs, num_proc)) if num_proc > 1 else []
    num_proc = min(num_proc, len(first)) if num_proc > 1 else 1
    jobs = itertools.chain(first, jobs)
    if num_proc <= 1:
        for job in jobs:
            raise_if_stopped()
            yield fn(*job)
        return
    executor = procs.start_pool(num_proc, multiprocessing.get_context("fork"), _init_worker)
    pending: deque[Future[Any]] = deque()
    try:
        for job in jobs:
            raise_if_stopped()
            pending.append(procs.submit(executor, fn, *job))
            if len(pending) >= 2 * num_proc + 1:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    except BaseException:
        # Stopping (an error, a signal, or the consumer giving up): do not wait for work in flight.
        procs.stop_pool(executor)
        raise
    procs.close_pool(executor)
