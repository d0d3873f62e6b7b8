"""One process encodes for the workers on the tokenizer's own thread pool (``PACKCLI_ENCODE=main``).

The default layout encodes in each worker process, one tokenizer thread each. In this one the workers
still read, normalise, render and locate the trained character spans, then send each batch's texts
and spans here; a thread of the main process encodes what every worker sent in one ``encode_batch``
call of the run's text encoder (``packcli.tokenize.text_encoders``) and returns the ids and label masks,
made as the workers would make them. The shards are the same byte for byte. Which layout is faster on a machine is
measured by ``benchmarks/bench_layout.py --end-to-end``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

import numpy as np

from packcli.errors import TokenizerError

LAYOUT_ENV = "PACKCLI_ENCODE"


def encode_in_main() -> bool:
    """Return whether the run asks the main process to encode for the workers."""
    return os.environ.get(LAYOUT_ENV, "workers") == "main"


class EncodeClient:
    """A worker's side: send texts and spans, get (ids, mask) per text. Connects on first use."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._conn: Connection | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address, "_conn": None, "_pid": 0}

    def encode(
        self, items: list[tuple[str, list[tuple[int, int]]]], add_special: bool
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._conn is None or self._pid != os.getpid():
            self._conn, self._pid = Client(self.address, family="AF_UNIX"), os.getpid()
        self._conn.send((add_special, items))
        reply = self._conn.recv()
        if isinstance(reply, str):  # the encode failed there: fail here, as the encode in this process would
            raise TokenizerError(
                f"the main process could not encode a batch ({reply}); run again without {LAYOUT_ENV}=main"
            )
        lengths, ids, mask = reply
        out = []
        start = 0
        for n in lengths.tolist():
            out.append((ids[start : start + n], mask[start : start + n]))
            start += n
        return out


class EncodeService:
    """The main process's side: a thread that encodes the workers' requests together, on the tokenizer's pool."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self._dir = tempfile.mkdtemp(prefix="packcli-encode-")
        self.address = os.path.join(self._dir, "socket")
        self._listener = Listener(self.address, family="AF_UNIX", backlog=64)
        self._conns: list[Connection] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def client(self) -> EncodeClient:
        return EncodeClient(self.address)

    def start(self) -> None:
        """Start serving (call after the worker processes are forked: a fork must not copy a busy thread)."""
        if self._threads:
            return
        for target in (self._accept, self._serve):
            thread = threading.Thread(target=target, daemon=True, name="packcli-encode")
            thread.start()
            self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)

    def _serve(self) -> None:
        while not self._stop.is_set():
            conns = list(self._conns)
            if not conns:
                self._stop.wait(0.01)
                continue
            ready: list[Any] = wait(conns, timeout=0.05)
            requests: list[tuple[Connection, bool, list[tuple[str, list[tuple[int, int]]]]]] = []
            for conn in ready:
                try:
                    add_special, items = conn.recv()
                except (EOFError, OSError):
                    with contextlib.suppress(ValueError):
                        self._conns.remove(conn)
                    continue
                requests.append((conn, add_special, items))
            for add_special in (False, True):
                group = [r for r in requests if r[1] is add_special]
                if not group:
                    continue
                try:
                    self._answer(group, add_special)
                except Exception as exc:  # a waiting worker must hear of it, or it would wait for ever
                    for conn, _, _ in group:
                        with contextlib.suppress(OSError):
                            conn.send(f"{type(exc).__name__}: {exc}")

    def _answer(self, group: list[Any], add_special: bool) -> None:
        every = [item for _, _, items in group for item in items]
        done = iter(self.encoder.text.encode_pieces(every, add_special))
        replies = []  # all made before any is sent: a failure answers every worker of the group alike
        for conn, _, items in group:
            made = [next(done) for _ in items]
            lengths = np.asarray([len(ids) for ids, _ in made], dtype=np.int64)
            flat_ids = np.concatenate([ids for ids, _ in made]) if made else np.zeros(0, np.int32)
            flat_mask = np.concatenate([mask for _, mask in made]) if made else np.zeros(0, bool)
            replies.append((conn, (lengths, flat_ids, flat_mask)))
        for conn, reply in replies:
            with contextlib.suppress(OSError):
                conn.send(reply)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wake the accepting thread
            Client(self.address, family="AF_UNIX").close()
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        for thread in self._threads:
            thread.join(timeout=1)
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
