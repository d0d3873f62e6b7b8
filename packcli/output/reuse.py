"""Shards a cache entry has had written already: a re-pack with the same plan links or copies them.

A shard's bytes follow from the token store, the plan (which samples, in which rows, in which order), the
row layout and the Parquet writer's version: nothing else. A run whose token store is a cache entry keeps
the shards it wrote under that entry (``shards/KEY/``, KEY a hash of all of those), and a later run that
finds the entry and makes the same plan takes them from there (a hard link where the cache and the output
share a file system, else a copy) instead of building and compressing every row again. Every reused file
is checked against the sha256 recorded when it was written: read back, unless its stamp (size, mtime,
inode) is the one kept when its bytes were last found right (``packcli.store.integrity``). A shard changed
since (an output edited in place shares its file with the cache, and its mtime) is never reused; the run
writes it anew.

An entry keeps the shards of its ``KEEP`` most recent plans; they go with the entry when it is pruned.
Rows with images are never kept (their bytes may come from image files outside the store). Nothing here
fails a run: a cache that cannot take the shards, or gives damaged ones, leaves the run to write them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import file_sha256
from packcli.output.layout import RowLayout
from packcli.plan.planner import Plan
from packcli.results import ShardEntry
from packcli.store.integrity import read_stamps, stamps_of, write_stamps
from packcli.version import __version__

SHARDS_DIR = "shards"
LIST = "shards.json"
KEEP = 2  # the plans an entry keeps the shards of (each a full copy where links are not possible)
FORMAT = 1
STALE_SECONDS = 3600  # a temporary directory this old was left by a killed run


def shards_key(layout: RowLayout, plan: Plan) -> str | None:
    """The key of the shards ``layout`` and ``plan`` make from a store; None: not kept (rows with images)."""
    if layout.images:
        return None
    h = hashlib.sha256()
    fields = {k: v for k, v in dataclasses.asdict(layout).items() if k != "output"}
    h.update(json.dumps([FORMAT, __version__, writer_version(), fields], sort_keys=True).encode())
    _hash_fields(h, plan)
    return h.hexdigest()[:32]


def writer_version() -> str:
    """The version of pyarrow, whose writer puts it in a shard's bytes (the Parquet footer's created_by).

    Read from the installed package's metadata, without importing pyarrow: a run that reuses its shards
    writes none, and importing pyarrow would be a tenth of its time. The headers' ``Version`` line is
    read as it is (``metadata.version`` would import the email parser to read them: 5 ms of a hit).
    """
    from importlib import metadata

    try:
        text = metadata.distribution("pyarrow").read_text("METADATA") or ""
    except metadata.PackageNotFoundError:  # installed without its metadata
        text = ""
    for line in text.splitlines():
        if not line:  # the headers end; the description follows
            break
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
    import pyarrow

    return str(pyarrow.__version__)


def _hash_fields(h: Any, value: Any) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            h.update(f"\0{f.name}".encode())
            _hash_fields(h, getattr(value, f.name))
    elif isinstance(value, np.ndarray):
        h.update(f"\0{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value):
            h.update(f"\0{k}".encode())
            _hash_fields(h, value[k])
    else:
        h.update(f"\0{value!r}".encode())


def reuse(entry: Path, key: str, directory: Path) -> list[ShardEntry] | None:
    """Put the shards kept under the cache ``entry`` for ``key`` into ``directory``; return their manifest
    entries, or None (none kept, or one damaged: nothing is left in ``directory``)."""
    kept = entry / SHARDS_DIR / key
    try:
        listed = (kept / LIST).read_text(encoding="utf-8")
        shards = [ShardEntry.from_dict(d) for d in json.loads(listed)]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    of = hashlib.sha256(listed.encode()).hexdigest()
    now = stamps_of(kept, [shard.file for shard in shards])  # taken before the bytes are checked
    trusted = read_stamps(kept, of)
    placed: list[Path] = []
    try:
        for shard in shards:
            target = directory / shard.file
            _link_or_copy(kept / shard.file, target)
            placed.append(target)
            if (now[shard.file] is None or trusted.get(shard.file) != now[shard.file]) and file_sha256(
                target
            ) != shard.sha256:
                raise ValueError(f"{kept / shard.file}: changed since it was written")
        if now != trusted:
            write_stamps(kept, of, now)
        os.utime(kept)  # the most recently used plan of the entry
    except (OSError, ValueError):
        for path in placed:
            with contextlib.suppress(OSError):
                path.unlink()
        shutil.rmtree(kept, ignore_errors=True)
        return None
    return shards


def keep(entry: Path, key: str, directory: Path, shards: list[ShardEntry]) -> None:
    """Keep the shards just written into ``directory`` under the cache ``entry`` for ``key`` (whole or not at
    all), and drop the entry's least recently used plans beyond ``KEEP``."""
    root = entry / SHARDS_DIR
    made: Path | None = None
    try:
        root.mkdir(exist_ok=True)
        made = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        for shard in shards:
            _link_or_copy(directory / shard.file, made / shard.file)
        listed = json.dumps([s.to_dict() for s in shards])
        (made / LIST).write_text(listed, encoding="utf-8")
        # The shards' bytes are those just written, hashed as they were: their first reuse reads none back.
        write_stamps(made, hashlib.sha256(listed.encode()).hexdigest(), stamps_of(made, [s.file for s in shards]))
        os.rename(made, root / key)
        made = None
        now = time.time()
        for left in root.glob(".tmp-*"):  # a run killed while it kept its shards
            if now - left.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(left, ignore_errors=True)
        plans = sorted(
            (p for p in root.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for old in plans[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    except OSError:
        pass  # another run kept them first, or the cache cannot take them: the next re-pack writes them
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
