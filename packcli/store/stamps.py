"""Stamps of files whose sha256 was found right: a re-check that needs no read while they are unchanged.

A cache entry's files (a token store's, the shards kept for a plan) are checked against the sha256 their
writer recorded. Reading them back at every use would cost a cache hit more than its plan and its
shards together, so the directory keeps, beside them, each file's stamp (size, mtime, inode) from when
its bytes were last known to match: the writer's, who hashed them as it wrote them, or the last full
check's. A file whose stamp is unchanged is taken as checked, as the input memo takes an input
(``packcli.io.fingerprint``); any other is read and hashed, and the stamps are written again once it
matches. A write in place moves the mtime, a copy put in its place has another inode; links to the file
(a shard linked into an output) move neither, and are the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

STAMPS = "stamps.json"

Stamp = list[int]  # size, mtime in ns, inode


def stamp(path: Path) -> Stamp | None:
    """A file's stamp, or None when it cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def read_stamps(directory: Path, of: str) -> dict[str, Stamp]:
    """The stamps kept in ``directory`` for the content ``of`` vouches for (a digest of the list of files and
    their sha256); empty when there are none, or they were kept for other content."""
    try:
        kept = json.loads((directory / STAMPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("of") != of or not isinstance(kept.get("files"), dict):
        return {}
    return {str(k): v for k, v in kept["files"].items() if isinstance(v, list)}


def stamps_of(directory: Path, names: Iterable[str]) -> dict[str, Stamp | None]:
    """The stamps of ``names`` (files of ``directory``) now; None for a file that cannot be seen."""
    return {name: stamp(directory / name) for name in names}


def write_stamps(directory: Path, of: str, stamps: dict[str, Stamp | None]) -> None:
    """Keep ``stamps`` (of files of ``directory``, taken before their bytes were found right) for the content
    ``of`` vouches for. Replaced whole; nothing is kept when a file could not be seen, nor said when the
    directory cannot take it (the next use hashes the files again)."""
    if any(v is None for v in stamps.values()):
        return
    made = None
    try:
        fd, made = tempfile.mkstemp(prefix=".stamps-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"of": of, "files": stamps}, fh, sort_keys=True)
        os.replace(made, directory / STAMPS)
        made = None
    except OSError:
        pass
    finally:
        if made is not None:
            with contextlib.suppress(OSError):
                os.unlink(made)
