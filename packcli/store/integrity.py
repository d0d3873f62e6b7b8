"""What a finished store's meta.json vouches for, and the checks that find a damaged store before it is read.

``meta.json`` records the size and sha256 of every file of the store (and of segments at a URI, their
size) and a sha256 of its own content; ``check_store`` compares them with what is on disk and raises
``DamagedStore`` naming the first difference.

Stamps (``stamps.json``): a re-check that reads nothing while the files are unchanged. A cache entry's files
(a token store's, the shards kept for a plan: ``packcli.output.reuse``) are checked against the sha256
their writer recorded. Reading them back at every use would cost a cache hit more than its plan and its
shards together, so the directory keeps, beside them, each file's stamp (size, mtime, inode) from when
its bytes were last known to match: the writer's, who hashed them as it wrote them, or the last full
check's. A file whose stamp is unchanged is taken as checked, as the input memo takes an input
(``packcli.io.fingerprint``); any other is read and hashed, and the stamps are written again once it
matches. A write in place moves the mtime, a copy put in its place has another inode; links to the file
(a shard linked into an output) move neither, and are the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from packcli.contract import file_sha256
from packcli.errors import PackcliError, first_line
from packcli.io.uri import join
from packcli.jsontypes import JSONObject
from packcli.owned import write_whole
from packcli.results import DamagedResult, FileDigest, StoreMeta, required_fields

# Every key a finished store's meta.json has (packcli.results.StoreMeta); one missing means the entry is damaged.
META_KEYS = required_fields(StoreMeta)
TOKEN_FILES = ("input_ids.bin", "labels.bin")


def segment_files(prefix: str) -> tuple[str, str]:
    """The names of a segment's two token files (input ids, labels), relative to the segments' root."""
    return prefix + TOKEN_FILES[0], prefix + TOKEN_FILES[1]


class Digest:
    """sha256 and size of bytes as they are written (a segment's checksum without reading it back)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.bytes = 0

    def update(self, data: bytes) -> None:
        self.sha.update(data)
        self.bytes += len(data)

    def entry(self) -> FileDigest:
        return {"bytes": self.bytes, "sha256": self.sha.hexdigest()}


class DamagedStore(PackcliError):
    """A store exists at the path but fails its checks; the message says which file and how."""


def meta_digest(meta: JSONObject) -> str:
    """Return the sha256 of a meta.json's content (as JSON data) but its own checksum (``meta_sha256``)."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def check_store(
    path: Path, check_digests: Callable[[str, dict[str, FileDigest]], None] | None = None, remember: bool = True
) -> StoreMeta:
    """Check a store's meta.json and the size and sha256 of each of its files; return the meta.

    Raise DamagedStore naming the first problem. A file whose stamp is the one kept when its bytes were last
    found right (``stamps.json``, see the module's doc) is not read again: an unchanged store costs a stat a file, any
    other one sequential read. ``remember``: keep the stamps of the files read (False: the directory is
    not written, as in a dry run). ``check_digests(directory, {token file: expected})`` hashes the local
    token files instead of this process (the Ray engine has tasks do it, so that its driver never reads
    tokens); it raises DamagedStore as this function does.
    """
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise DamagedStore(f"{path}: meta.json is missing") from None
    except (OSError, ValueError) as exc:
        raise DamagedStore(f"{path}: meta.json cannot be read ({first_line(exc)})") from exc
    if not isinstance(meta, dict):
        raise DamagedStore(f"{path}: meta.json is not a JSON object")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise DamagedStore(f"{path}: meta.json lacks {', '.join(missing)}")
    if meta["meta_sha256"] != meta_digest(meta):
        raise DamagedStore(f"{path}: meta.json does not match its checksum")
    checked = read_meta(path, meta)
    files, segments = checked.files, checked.segments
    try:
        token_files = {name for seg in segments for name in segment_files(seg["prefix"])}
    except (TypeError, KeyError):
        raise DamagedStore(f"{path}: meta.json does not list the store's segments") from None
    if not isinstance(files, dict) or not {"samples.npz", *token_files} <= set(files):
        raise DamagedStore(f"{path}: meta.json does not list the store's files")
    remote = checked.segment_root
    local = {name for name in files if not (remote and name in token_files)}
    now = stamps_of(path, sorted(local))
    kept = read_stamps(path, meta["meta_sha256"])
    hashed = [
        name
        for name in sorted(local)
        if (check_digests is None or name not in token_files) and (now[name] is None or kept.get(name) != now[name])
    ]
    # The files are hashed two at a time (hashlib and reads let go of the GIL: a store's token files come in
    # pairs of the same size), and checked in order, so that the first problem named is the same.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="packcli-check") as pool:
        digests = {name: pool.submit(file_sha256, path / name) for name in hashed}
        try:
            for name, expect in sorted(files.items()):
                if name in local:
                    _check_file(path / name, expect, digests.get(name))
                else:
                    _check_remote(join(str(remote), name), expect)
        except BaseException:
            for future in digests.values():
                future.cancel()  # a damaged store: the files not begun are not read
            raise
    if check_digests is not None:
        check_digests(str(path), {n: files[n] for n in sorted(token_files)})
    if remember and hashed:
        write_stamps(path, meta["meta_sha256"], now)
    return checked


def keep_stamps(path: Path, meta: JSONObject) -> None:
    """Keep the stamps of a store's local files, just written (``meta``: its meta.json, as written), whose
    checksums were taken from their bytes: its first use reads none of them back."""
    remote = meta.get("segment_root")
    token_files = {name for seg in meta["segments"] for name in segment_files(seg["prefix"])}
    local = sorted(name for name in meta["files"] if not (remote and name in token_files))
    write_stamps(path, meta["meta_sha256"], stamps_of(path, local))


def read_meta(path: Path, data: object) -> StoreMeta:
    """A store's meta.json (``data``, as read) as StoreMeta; DamagedStore when a key lacks or a part of it
    is not what it should be."""
    try:
        return StoreMeta.from_dict(data)
    except DamagedResult as exc:
        raise DamagedStore(f"{path}: ", *exc.parts) from None
    except (TypeError, ValueError, AttributeError):
        raise DamagedStore(f"{path}: meta.json is not a token store's metadata") from None


def _check_file(file: Path, expect: FileDigest, digest: Future[str] | None) -> None:
    """A file of the store on disk: its size, and its sha256 (``digest``, being taken; None: not checked
    here), those meta.json records."""
    try:
        size = file.stat().st_size
        if size != expect["bytes"]:
            raise DamagedStore(f"{file}: has {size} bytes, meta.json says {expect['bytes']}")
        if digest is not None and digest.result() != expect["sha256"]:
            raise DamagedStore(f"{file}: sha256 differs from meta.json (changed bytes)")
    except FileNotFoundError:
        raise DamagedStore(f"{file}: is missing") from None
    except OSError as exc:
        raise DamagedStore(f"{file}: cannot be read ({exc.strerror or exc})") from exc


def _check_remote(uri: str, expect: FileDigest) -> None:
    """A segment file at a URI: present with its size (object stores keep their own checksums; reading
    it back to hash it would cost a whole download)."""
    from pyarrow import fs as pafs

    try:
        filesystem, where = pafs.FileSystem.from_uri(uri)
        info = filesystem.get_file_info(where)
    except (OSError, ValueError) as exc:
        raise DamagedStore(f"{uri}: cannot be read ({first_line(exc)})") from exc
    if info.type == pafs.FileType.NotFound:
        raise DamagedStore(f"{uri}: is missing")
    if info.size != expect["bytes"]:
        raise DamagedStore(f"{uri}: has {info.size} bytes, meta.json says {expect['bytes']}")


# -- stamps -----------------------------------------------------------------------------------------

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
    with contextlib.suppress(OSError):
        body = json.dumps({"of": of, "files": stamps}, sort_keys=True).encode("utf-8")
        write_whole(directory / STAMPS, lambda fh: fh.write(body))
