"""What keeps a pack run from destroying anything it did not write.

- The output path is checked against the inputs, the cache and the rejects file before anything is
  written (resolved paths, so ``d/../d`` and symlinks cannot hide an overlap).
- ``--overwrite`` replaces only an empty directory or a previous packcli output, and of that only the
  files its manifest names.
- A lock file beside the output (inside it, when the output is a mount point) makes a second run
  writing the same output fail at once, naming the process that holds it.
- Staging and temporary directories carry the host and PID of the run that made them, so the next
  run removes those whose process is gone, and only those.
- A file of the cache is written whole or not at all (``write_whole``), with an ordinary file's
  permissions, through a temporary file beside it that carries the same host and PID.
- Replacing a mount point's contents in place is journaled (``REPLACE_JOURNAL``): the staged copy a
  journal names is never removed as stale, and the next run finishes the replace from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli.contract import MANIFEST
from packcli.errors import OUTPUT, OutputError, Part
from packcli.jsontypes import JSONObject
from packcli.results import REJECT_KEYS as REJECT_ENTRY_KEYS

LOCK_IN_OUTPUT = ".packcli.lock"
IN_PLACE_PREFIX = ".packcli-partial-"
# In a mount point's output, while its contents are replaced in place: what to remove, what to move in.
REPLACE_JOURNAL = ".packcli-replace.json"
# Keys every manifest packcli writes has; a manifest.json without them is someone else's file.
MANIFEST_KEYS = ("packcli_version", "options", "shards", "columns")
# The files output formats keep beside their shards (shard_formats: MDS's index, Megatron's metadata).
INDEX_FILES = ("index.json", "packing_metadata.json")
# The keys of every entry of a rejects file (packcli.results.RejectEntry): an existing file whose first
# line has exactly these is a rejects file packcli wrote, which --rejects may replace.
REJECT_KEYS = REJECT_ENTRY_KEYS
# An entry holds at most 100,000 characters of its record; 8 MiB covers its line with any escaping.
_REJECT_LINE_BYTES = 8 << 20


def owner_tag() -> str:
    """Return ``host-pid`` of this process, put into the names of the directories it makes."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


def write_whole(target: Path, write: Callable[[Any], object]) -> None:
    """Write ``target`` whole or not at all: ``write`` fills a binary file beside it, which gets an ordinary
    file's permissions (``readable``) and replaces ``target``. The temporary file (named ``.tmp-`` and its
    owner) is removed on any error, which is raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{owner_tag()}-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        readable(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def readable(path: str) -> None:
    """Give a file mkstemp made (private) the permissions of an ordinary file of this process (its umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def staging_prefix(name: str) -> str:
    """The name prefix of this run's staging directory beside an output called ``name``."""
    return f".{name}.partial-{owner_tag()}-"


# A staging or temporary directory: ...partial-HOST-PID-RANDOM, .NAME.old-HOST-PID, .tmp-HOST-PID-RANDOM.
_OWNED = re.compile(r"(?:\.partial-|\.old-|^\.tmp-|^\.packcli-partial-)(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)(?:-|$)")


def _owner(name: str) -> tuple[str, int] | None:
    match = _OWNED.search(name)
    return (match["host"], int(match["pid"])) if match else None


def _process_gone(host: str, pid: int) -> bool:
    """Whether the process that made a directory is gone. Another host's process is never judged gone."""
    if host != owner_tag().rsplit("-", 1)[0]:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def is_staging_name(name: str) -> bool:
    """Whether a file name is one of packcli's staging or temporary directories."""
    return name.startswith(".") and _owner(name) is not None


def remove_stale(directory: Path, names: Iterable[str], output: Path | None = None) -> list[Path]:
    """Remove the directories among ``names`` in ``directory`` whose process is gone; return them.

    An ``.old-`` directory is a previous output moved aside by a run killed between its two renames:
    when the output itself is missing it is moved back rather than removed.
    """
    removed = []
    for name in names:
        owner = _owner(name)
        path = directory / name
        if owner is None or not _process_gone(*owner) or not path.is_dir() or path.is_symlink():
            continue
        if ".old-" in name and output is not None and not os.path.lexists(output):
            with contextlib.suppress(OSError):
                os.replace(path, output)
                continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def clean_stale_output_dirs(output: Path) -> None:
    """Remove the staging directories a killed run left beside (or, for a mount point, in) ``output``."""
    parent = output.parent
    with contextlib.suppress(OSError):
        prefix = f".{output.name}."
        remove_stale(parent, [p.name for p in parent.iterdir() if p.name.startswith(prefix)], output)
    if output.is_dir() and not output.is_symlink():
        with contextlib.suppress(OSError):
            keep = replace_journal_staged(output)
            if keep is None and os.path.lexists(output / REPLACE_JOURNAL):
                return  # a journal that cannot be read: whichever staged copy it names must stay
            names = [p.name for p in output.iterdir() if p.name.startswith(IN_PLACE_PREFIX) and p.name != keep]
            remove_stale(output, names)


# A copy of a stream (stdin, a FIFO) in the temporary directory: .packcli-stream-HOST-PID-RANDOM.SUFFIX.
STREAM_COPY_PREFIX = ".packcli-stream-"
_STREAM_COPY = re.compile(r"^\.packcli-stream-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-")


def clean_stale_stream_copies(directory: Path) -> list[Path]:
    """Remove the copies of streams that killed runs left in ``directory``, whose process is gone; return them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            match = _STREAM_COPY.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            if _process_gone(match["host"], int(match["pid"])):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def clean_stale_cache_dirs(cache_root: Path) -> None:
    """Remove the temporary entries (and tokenizer records being written) a killed run left in the cache."""
    for folder in (cache_root, cache_root / "tokenizers"):
        with contextlib.suppress(OSError):
            remove_stale(folder, [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")])


# -- an in-place replace, journaled -----------------------------------------------------------------


@dataclass(frozen=True)
class ReplaceJournal:
    """What an in-place replace does, written into the output before it removes anything.

    ``staged`` is the staging directory in the output that holds the complete new output; ``remove``
    the old names to delete; ``move`` the staged names to move in, the manifest last.
    """

    staged: str
    remove: tuple[str, ...]
    move: tuple[str, ...]
    owner: str = ""

    def to_json(self) -> str:
        record = {"packcli_replace": 1, "owner": self.owner, "staged": self.staged}
        return json.dumps({**record, "remove": list(self.remove), "move": list(self.move)}, indent=1) + "\n"


def _bare_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def read_replace_journal(output: Path, display: str | None = None) -> ReplaceJournal | None:
    """Return the journal of an in-place replace left in ``output``; None when there is none.

    Raises OutputError when the file is there but is not a journal packcli wrote (it is written whole
    or not at all, so that means it was damaged or put there by hand).
    """
    path = output / REPLACE_JOURNAL
    if not os.path.lexists(path):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.stat().st_size < 64 << 20 else None
    except (OSError, ValueError):
        record = None
    names = ("remove", "move")
    if (
        not isinstance(record, dict)
        or record.get("packcli_replace") != 1
        or not (_bare_name(record.get("staged")) and record["staged"].startswith(IN_PLACE_PREFIX))
        or not all(isinstance(record.get(k), list) and all(_bare_name(n) for n in record[k]) for k in names)
        or any(is_staging_name(n) or n in (LOCK_IN_OUTPUT, REPLACE_JOURNAL) for n in record["remove"])
        or not record["move"]
        or record["move"][-1] != MANIFEST
    ):
        raise OutputError(
            f"{display or output}: {REPLACE_JOURNAL} is damaged, so the in-place replace it records cannot be "
            "finished; move out what you need, empty the directory and pack again"
        )
    return ReplaceJournal(record["staged"], tuple(record["remove"]), tuple(record["move"]), str(record.get("owner")))


def replace_journal_staged(output: Path) -> str | None:
    """The name of the staged copy a readable journal in ``output`` names, else None."""
    try:
        journal = read_replace_journal(output)
    except OutputError:
        return None
    return journal.staged if journal else None


def interrupted_replace_message(display: str) -> tuple[Part, ...]:
    """The one line that says an output was left mid-replace, and what to do."""
    return (
        f"{display}: a packcli run was killed while replacing this output in place (a mount point), so it "
        "holds part of the old output and part of the new; the next packcli pack with this ",
        OUTPUT,
        " finishes the replace from the complete new output it kept",
    )


# -- what is ours -----------------------------------------------------------------------------------


def read_own_manifest(directory: Path) -> JSONObject | None:
    """Return the manifest of ``directory`` when packcli wrote it, else None."""
    path = directory / MANIFEST
    try:
        if not path.is_file() or path.stat().st_size > 64 << 20:
            return None
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not all(k in manifest for k in MANIFEST_KEYS):
        return None
    shards = manifest["shards"]
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards):
        return None
    return manifest


def own_files(directory: Path, manifest: JSONObject) -> set[str]:
    """The names in a previous output that packcli wrote: the manifest, its shards and index files, its rejects.

    A rejects file in a subdirectory (``logs/rejects.jsonl``) makes the subdirectory's name packcli's
    only while the subdirectory holds nothing else (see ``foreign_on_rejects_path``).
    """
    names = {MANIFEST} | {s["file"] for s in manifest["shards"] if "/" not in s["file"]}
    index_files = manifest.get("index_files")
    if isinstance(index_files, list):  # an output format's files beside the shards (MDS's index.json...)
        names |= {f for f in index_files if isinstance(f, str) and f and "/" not in f and f not in (".", "..")}
    parts = rejects_parts(manifest)
    if parts and not foreign_on_rejects_path(directory, parts):
        names.add(parts[0])
    if names_eval(manifest) and not foreign_in_eval(directory):
        names.add(EVAL_DIR)
    return names


EVAL_DIR = "eval"  # the eval split's output, inside the output (packcli.plan.holdout)


def names_eval(manifest: JSONObject) -> bool:
    """Whether a manifest names an eval split written inside its output (``eval/``)."""
    section = manifest.get("eval")
    return isinstance(section, dict) and section.get("path") == EVAL_DIR


def foreign_in_eval(directory: Path) -> set[str]:
    """The paths (relative, with ``/``) in ``directory``'s ``eval/`` that packcli did not write.

    ``eval/`` is packcli's when it is a directory (no symlink) holding a manifest packcli wrote and
    only what that manifest names; a missing ``eval/`` holds nothing foreign.
    """
    path = directory / EVAL_DIR
    if not os.path.lexists(path):
        return set()
    if path.is_symlink() or not path.is_dir():
        return {EVAL_DIR}
    manifest = read_own_manifest(path)
    entries = {p.name for p in path.iterdir()}
    if manifest is None or names_eval(manifest):  # an eval output holds no eval output of its own
        return {f"{EVAL_DIR}/{name}" for name in entries} or {EVAL_DIR}
    return {f"{EVAL_DIR}/{name}" for name in entries - own_files(path, manifest)}


def rejects_parts(manifest: JSONObject) -> tuple[str, ...]:
    """The path of the rejects file a manifest names inside its output, as parts; () when it names none."""
    rejects = manifest.get("rejects_file")
    if not isinstance(rejects, str) or not rejects or Path(rejects).is_absolute() or ".." in Path(rejects).parts:
        return ()
    return Path(rejects).parts


def foreign_on_rejects_path(directory: Path, parts: tuple[str, ...]) -> set[str]:
    """The paths (relative, with ``/``) along the rejects file's path in ``directory`` that packcli did not write.

    packcli writes the rejects file and the directories leading to it, and nothing else in them: any
    other entry of those directories is someone else's, and so is a directory where the file should be,
    or a file or symlink where a directory should be.
    """
    foreign: set[str] = set()
    here = directory
    for depth, name in enumerate(parts):
        path = here / name
        relative = "/".join(parts[: depth + 1])
        if not os.path.lexists(path):
            break
        if depth == len(parts) - 1:
            if path.is_dir() and not path.is_symlink():
                foreign.add(relative)
            break
        if path.is_symlink() or not path.is_dir():
            foreign.add(relative)
            break
        foreign |= {f"{relative}/{p.name}" for p in path.iterdir() if p.name != parts[depth + 1]}
        here = path
    return foreign


def is_packcli_dir(path: Path) -> bool:
    """Whether a directory is packcli's: an output it wrote, or a staging or temporary directory."""
    return (
        is_staging_name(path.name)
        or read_own_manifest(path) is not None
        or os.path.lexists(path / REPLACE_JOURNAL)  # an output killed while being replaced in place
    )


HASH_MEMO = "input-hashes.json"  # beside the entries: the inputs' hashes by file stamp (io.fingerprint.fingerprint)


def is_cache_dir(path: Path) -> bool:
    """Whether a directory is packcli's tokenization cache, or one entry of it (never an input to read)."""
    if (path / HASH_MEMO).is_file():
        return True
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "meta_sha256" in meta and "segments" in meta
