"""The local process pool: run jobs in forked worker processes, results in job order, never more workers than jobs.

Each worker has a socket of its own. This process sends the jobs and takes the results from one loop that
waits on every socket at once, a fraction of a second at a time: a stop request is seen within that
time, a worker that dies is seen at once (its socket ends), and nothing here ever waits on one worker.
Stopping the pool terminates the workers, kills those still alive after a short grace, and closes the
sockets: it cannot block, whatever state the workers were left in (no queue, no feeder thread, no lock
shared with a process that may be gone).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import multiprocessing
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any

from packcli.errors import Opt, PackcliError
from packcli.procs import channel, lifetime
from packcli.procs.stop import raise_if_stopped

DEPTH = 2  # jobs in flight per worker: the one it runs, and the next, waiting in its socket
WAIT = 0.2  # the longest this process waits for a worker before it looks for a stop request again
GRACE = 1.0  # how long stopped workers get to exit on SIGTERM before they are killed
SIGNAL_LAG = 0.3  # how long a worker's death may come before the signal that the same kill sent this process


def worker_died() -> PackcliError:
    return PackcliError(
        "a worker process died (killed by a signal or out of memory)",
        hint=("run again, with a lower ", Opt("num_proc"), " if memory is short"),
    )


class _Worker:
    """One worker process, the socket to it, and the jobs it was sent and has not answered, in order."""

    def __init__(self, process: Any, sock: socket.socket) -> None:
        self.process, self.sock = process, sock
        self.outbox, self.inbox = channel.Outbox(), channel.Inbox()
        self.jobs: deque[int] = deque()


class WorkerPool:
    """Forked workers that each run ``call(*job)`` for the jobs sent to them (see the module's docstring).

    ``call`` and everything it refers to reach the workers by the fork, never pickled: an encoder with
    its loaded tables is shared with them as the parent built it.
    """

    def __init__(self, workers: int, call: Callable[..., Any]) -> None:
        self._call = call
        self._workers: list[_Worker] = []
        self._selector = selectors.DefaultSelector()
        self._closed = False
        self.last_answer = time.monotonic()  # when a worker last answered (or the pool started), for the watchdog
        lifetime.register(self)
        if (trim := _malloc_trim()) is not None:
            # What the parent freed and glibc kept (an encoder's build, a tokenizer's JSON): given back before
            # the fork, else every worker maps it too and the parent alone holds it once they trim.
            gc.collect()
            trim(0)
        try:
            for _ in range(workers):
                self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        inherited = [ours, *(w.sock for w in self._workers)]  # the worker closes its copies of these
        process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(os.getpid(), theirs, inherited, self._call), daemon=True, name="packcli-worker"
        )
        # Held back while forking: a signal handled between the fork and the worker's record here would
        # leave a worker that nothing stops (the worker lets them in once its own handlers are set).
        with lifetime.signals_held():
            process.start()
            self._workers.append(_Worker(process, ours))
        theirs.close()  # the worker's end is the worker's alone: its death ends the socket
        ours.setblocking(False)
        self._selector.register(ours, selectors.EVENT_READ, self._workers[-1])

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:  # an error, a stop request, or the consumer giving up: the work in flight is not waited for
            self.stop()

    def processes(self) -> list[Any]:
        return [w.process for w in self._workers]

    def in_flight(self) -> int:
        return sum(len(w.jobs) for w in self._workers)

    def has_room(self) -> bool:
        return self.in_flight() < DEPTH * len(self._workers)

    def submit(self, number: int, job: tuple[Any, ...]) -> None:
        """Send job ``number`` to the worker with the fewest jobs in flight."""
        worker = min(self._workers, key=lambda w: len(w.jobs))
        worker.jobs.append(number)
        worker.outbox.put(job)
        self._flush(worker)

    def _flush(self, worker: _Worker) -> None:
        try:
            worker.outbox.flush(worker.sock)
        except channel.WorkerGone:
            _stopped_meanwhile()
            raise worker_died() from None
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if worker.outbox else 0)
        self._selector.modify(worker.sock, events, worker)

    def wait(self, timeout: float) -> list[tuple[int, tuple[str, Any]]]:
        """Send and receive what the sockets take and hold within ``timeout`` seconds; return the answers
        that came whole, each with its job's number. A worker that ended raises (``worker_died``)."""
        answers: list[tuple[int, tuple[str, Any]]] = []
        for key, events in self._selector.select(timeout):
            worker: _Worker = key.data
            if events & selectors.EVENT_WRITE:
                self._flush(worker)
            if events & selectors.EVENT_READ:
                try:
                    messages = worker.inbox.fill(worker.sock)
                except channel.WorkerGone:
                    _stopped_meanwhile()
                    raise worker_died() from None
                answers.extend((worker.jobs.popleft(), message) for message in messages)
        if answers:
            self.last_answer = time.monotonic()
        return answers

    def close(self) -> None:
        """End idle workers: their sockets are closed, they exit; any still alive after a while is killed."""
        if self._end():
            for worker in self._workers:
                worker.sock.close()
            _reap(self.processes(), 5.0)

    def stop(self, grace: float = GRACE) -> None:
        """End the workers without waiting for their work: SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self._end():
            processes = self.processes()
            for process in processes:
                _signal(process.terminate)
            _reap(processes, grace)
            for worker in self._workers:
                worker.sock.close()

    def kill(self) -> None:
        """SIGKILL every worker at once (a second interrupt)."""
        for process in self.processes():
            _signal(process.kill)

    def _end(self) -> bool:
        """Mark the pool ended; True the first time only."""
        if self._closed:
            return False
        self._closed = True
        lifetime.forget(self)
        self._selector.close()
        return True


def _stopped_meanwhile() -> None:
    """Raise KeyboardInterrupt if a stop request comes within ``SIGNAL_LAG`` seconds of a worker's death.

    A SIGTERM or SIGINT sent to the whole process group ends the workers (they take it by default) as it
    reaches this process: the run is being stopped, not failing, whichever of the two is seen first.
    """
    deadline = time.monotonic() + SIGNAL_LAG
    while True:
        raise_if_stopped()
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def _signal(send: Callable[[], None]) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):  # gone already, or never started
        send()


def _reap(processes: list[Any], seconds: float) -> None:
    """Wait up to ``seconds`` in all for the processes to exit; kill the ones that did not, and reap them."""
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.join(max(0.0, deadline - time.monotonic()))
        except (OSError, ValueError, AssertionError):  # never started
            continue
    for process in processes:
        try:
            if process.is_alive():
                process.kill()
                process.join(1.0)
        except (OSError, ValueError, AssertionError):
            continue


def _serve(parent_pid: int, sock: socket.socket, inherited: list[socket.socket], call: Callable[..., Any]) -> None:
    """A worker's life: take a job, run it, send back its result or its error; end when the socket ends."""
    # One tokenizer thread per worker process: the processes are the parallelism. This also keeps the
    # Rust thread pool from being used across fork, which can deadlock when the parent already used it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    lifetime.init_worker(parent_pid)
    for other in inherited:  # the pool's ends: held here, they would keep a socket from ending
        other.close()
    trim = _malloc_trim()
    while True:
        try:
            job = channel.receive(sock)
        except (channel.WorkerGone, OSError):
            return
        reply = _answer(call, job)
        del job
        try:
            sock.sendall(reply)
        except OSError:
            return
        del reply
        if trim is not None:
            trim(0)  # the job's memory back to the system: glibc keeps what a large record took otherwise


def _answer(call: Callable[..., Any], job: tuple[Any, ...]) -> bytes:
    """The message that answers a job: its result, or the error it raised."""
    try:
        return channel.frame(("ok", call(*job)))
    except BaseException as exc:
        return channel.frame(channel.error_message(exc))


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on a system without it."""
    try:
        import ctypes

        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def map_ordered(
    fn: Callable[..., Any],
    jobs: Iterator[tuple[Any, ...]],
    num_proc: int,
    context: Any = None,
) -> Generator[Any, None, None]:
    """Run ``fn`` over jobs, in worker processes when num_proc > 1, yielding results in job order.

    At most ``DEPTH`` jobs per worker are in flight, so memory does not grow with the input. When a
    job cannot be made (an input that cannot be read further on), the results of the jobs before it
    come first and its error after them, as with one process: a problem those jobs hold is the one
    the caller sees first, whatever ``num_proc`` is. A job's error is raised in its turn too.

    A caller that stops iterating early should close the generator (``contextlib.closing``), so
    that the workers are stopped there and then, not whenever the garbage collector gets to it.

    ``context``: what every job needs and no job should carry (an encoder, a store); given, each job
    runs as ``fn(context, *job)``, the workers receiving it by the fork, never pickled.
    """
    call = fn if context is None else functools.partial(fn, context)
    if num_proc <= 1:
        for job in jobs:
            raise_if_stopped()
            yield call(*job)
        return
    # Never more workers than jobs: the first num_proc jobs are read before any process starts.
    first: list[tuple[Any, ...]] = []
    read_error = _take(jobs, num_proc, first)
    if len(first) <= 1:
        for job in first:
            raise_if_stopped()
            yield call(*job)
        if read_error is not None:
            raise read_error
        return
    with WorkerPool(min(num_proc, len(first)), call) as workers:
        for number, job in enumerate(first):
            workers.submit(number, job)
        sent, more = len(first), read_error is None
        del first
        answers: dict[int, tuple[str, Any]] = {}
        for number in itertools.count():
            while number not in answers:
                while more and workers.has_room():
                    raise_if_stopped()
                    batch: list[tuple[Any, ...]] = []
                    read_error = _take(jobs, 1, batch)
                    more = bool(batch) and read_error is None
                    if batch:
                        workers.submit(sent, batch[0])
                        sent += 1
                if number >= sent:
                    break
                raise_if_stopped()
                answers.update(workers.wait(WAIT))
            if number >= sent:
                break
            kind, payload = answers.pop(number)
            if kind == "error":
                raise channel.raised(payload)
            yield payload
    if read_error is not None:
        raise read_error


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
