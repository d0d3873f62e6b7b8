"""Messages between the pool and a worker over one socket: a length, then a pickle.

The worker's side blocks (it has nothing else to do); the pool's side never does: it sends and receives
what the socket takes or holds at the moment (``Outbox``, ``Inbox``), from one loop that waits on every
worker at once, so that no call of the pool can wait on a worker that is gone.
"""

from __future__ import annotations

import pickle
import socket
import struct
import traceback
from collections import deque
from typing import Any

_HEADER = struct.Struct("!Q")


class WorkerGone(Exception):
    """The worker's end of the socket closed: the worker exited or was killed."""


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker, kept as the ``__cause__`` of the error the pool raises."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def frame(message: Any) -> bytes:
    """Return ``message`` as the bytes of one message: its pickle's length, then the pickle."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def send(sock: socket.socket, message: Any) -> None:
    """Send one message, blocking until the socket took all of it (a worker's side)."""
    sock.sendall(frame(message))


def receive(sock: socket.socket) -> Any:
    """Receive one message, blocking until it came whole (a worker's side); WorkerGone at the end."""
    header = _read_exactly(sock, _HEADER.size)
    (size,) = _HEADER.unpack(header)
    return pickle.loads(_read_exactly(sock, size))


def _read_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise WorkerGone
        got += n
    return buffer


def error_message(exc: BaseException) -> tuple[str, Any]:
    """The message that carries an error raised in a worker: the error and its traceback's text.

    An error that cannot be pickled (or unpickled: pickle calls its class with ``args``) is carried as a
    RuntimeError naming it, so that a worker's error always reaches the run.
    """
    text = "".join(traceback.format_exception(exc))
    try:
        body = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(body)
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return "error", (exc, text)


def raised(payload: tuple[BaseException, str]) -> BaseException:
    """The error a worker raised, with its traceback as the cause (what ``error_message`` carried)."""
    exc, text = payload
    exc.__cause__ = RemoteTraceback(text)
    return exc


class Outbox:
    """Messages waiting to be sent on a non-blocking socket, sent as far as the socket takes them."""

    def __init__(self) -> None:
        self._frames: deque[memoryview] = deque()

    def put(self, message: Any) -> None:
        self._frames.append(memoryview(frame(message)))

    def __bool__(self) -> bool:
        return bool(self._frames)

    def flush(self, sock: socket.socket) -> None:
        """Send what the socket takes now; WorkerGone if the worker's end is closed."""
        while self._frames:
            head = self._frames[0]
            try:
                n = sock.send(head)
            except BlockingIOError:
                return
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise WorkerGone from exc
            if n == len(head):
                self._frames.popleft()
            else:
                self._frames[0] = head[n:]


class Inbox:
    """The message being received on a non-blocking socket, and the whole ones received."""

    def __init__(self) -> None:
        self._header = bytearray(_HEADER.size)
        self._body: bytearray | None = None
        self._got = 0

    def fill(self, sock: socket.socket) -> list[Any]:
        """Receive what the socket holds now; return the messages it completed (WorkerGone at the end)."""
        done: list[Any] = []
        while True:
            buffer = self._header if self._body is None else self._body
            try:
                n = sock.recv_into(memoryview(buffer)[self._got :])
            except BlockingIOError:
                return done
            except ConnectionResetError as exc:
                raise WorkerGone from exc
            if n == 0:
                raise WorkerGone
            self._got += n
            if self._got < len(buffer):
                continue
            self._got = 0
            if self._body is None:
                (size,) = _HEADER.unpack(self._header)
                self._body = bytearray(size)  # a pickle is never empty
                continue
            done.append(pickle.loads(self._body))
            self._body = None
