"""What keeps a pack run from destroying anything it did not write.

- The output path is checked against the inputs, the cache and the rejects file before anything is
  written (resolved paths, so ``d/../d`` and symlinks cannot hide an overlap).
- ``--overwrite`` replaces only an empty directory or a previous packcli output, and of that only the
  files its manifest names.
- A lock file beside the output (inside it, when the output is a mount point) makes a second run
  writing the same output fail at once, naming the process that holds it.
- Staging and temporary directories carry the host and PID of the run that made them, so the next
  run removes those whose process is gone, and only those.
- Replacing a mount point's contents in place is journaled (``REPLACE_JOURNAL``): the staged copy a
  journal names is never removed as stale, and the next run finishes the replace from it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli.errors import OutputError, UsageError

MANIFEST = "manifest.json"
LOCK_IN_OUTPUT = ".packcli.lock"
IN_PLACE_PREFIX = ".packcli-partial-"
# In a mount point's output, while its contents are replaced in place: what to remove, what to move in.
REPLACE_JOURNAL = ".packcli-replace.json"
# Keys every manifest packcli writes has; a manifest.json without them is someone else's file.
MANIFEST_KEYS = ("packcli_version", "options", "shards", "columns")
# The files output formats keep beside their shards (shard_formats: MDS's index, Megatron's metadata).
INDEX_FILES = ("index.json", "packing_metadata.json")
# The keys of every entry of a rejects file (worker.reject): an existing file whose first line has
# exactly these is a rejects file packcli wrote, which --rejects may replace.
REJECT_KEYS = frozenset(
    {
        "sample_index",
        "piece_index",
        "source",
        "position",
        "unit",
        "reason",
        "detail",
        "record",
        "record_truncated",
        "record_chars",
    }
)
# An entry holds at most 100,000 characters of its record; 8 MiB covers its line with any escaping.
_REJECT_LINE_BYTES = 8 << 20


def owner_tag() -> str:
    """Return ``host-pid`` of this process, put into the names of the directories it makes."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


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
    """Remove the temporary entries a killed run left in the cache."""
    with contextlib.suppress(OSError):
        remove_stale(cache_root, [p.name for p in cache_root.iterdir() if p.name.startswith(".tmp-")])


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


def interrupted_replace_message(display: str) -> str:
    """The one line that says an output was left mid-replace, and what to do."""
    return (
        f"{display}: a packcli run was killed while replacing this output in place (a mount point), so it "
        "holds part of the old output and part of the new; the next packcli pack with this -o finishes "
        "the replace from the complete new output it kept"
    )


# -- what is ours -----------------------------------------------------------------------------------


def read_own_manifest(directory: Path) -> dict[str, Any] | None:
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


def own_files(directory: Path, manifest: dict[str, Any]) -> set[str]:
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
    return names


def rejects_parts(manifest: dict[str, Any]) -> tuple[str, ...]:
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


def replaceable(output: Path, display: str, overwrite: bool) -> set[str]:
    """Check that packcli may write ``output``; return the names in it that the new output replaces.

    A missing or empty directory is always fine. A non-empty one needs ``--overwrite`` and must be a
    previous packcli output holding nothing but what packcli wrote.
    """
    if not os.path.lexists(output):
        return set()
    if not output.is_dir():
        raise UsageError(f"{display}: exists and is not a directory; choose another -o")
    if os.path.lexists(output / REPLACE_JOURNAL):  # left by a replace that could not be finished
        raise OutputError(interrupted_replace_message(display))
    entries = _entries(output)
    if not entries:
        return set()
    if not overwrite:
        raise UsageError(f"{display}: the output directory is not empty; pass --overwrite or choose another -o")
    manifest = read_own_manifest(output)
    if manifest is None:
        raise UsageError(
            f"{display}: --overwrite replaces only an empty directory or a previous packcli output, and this "
            f"one has no manifest.json written by packcli (it holds {_some(entries)}); choose another -o"
        )
    foreign = entries - own_files(output, manifest)
    parts = rejects_parts(manifest)
    if parts and parts[0] in foreign:  # name what the rejects file's directory holds, not the directory
        foreign = (foreign - {parts[0]}) | foreign_on_rejects_path(output, parts)
    if foreign:
        raise UsageError(
            f"{display}: holds files packcli did not write ({_some(foreign)}); move them out or choose another -o"
        )
    return entries


def check_still_replaceable(output: Path, display: str, old: set[str]) -> None:
    """Refuse to replace ``output`` when it holds what it did not hold when the run began.

    ``old`` is what ``replaceable`` found there (all packcli's). Called just before the new output
    replaces the old one, so that a file put there during the run is never removed with it.
    """
    if not output.is_dir():
        return
    entries = _entries(output)
    added = entries - old
    manifest = read_own_manifest(output)
    parts = rejects_parts(manifest) if manifest is not None else ()
    if parts and parts[0] in entries:
        inside = foreign_on_rejects_path(output, parts)
        if inside:
            added = (added - {parts[0]}) | inside
    if added:
        raise UsageError(
            f"{display}: {_some(added)} appeared in the output during the run, and packcli did not write them; "
            "they and the previous output are kept as they were and the new output was discarded; "
            "move them out and run again"
        )


def _entries(output: Path) -> set[str]:
    """The names in an output directory, but for this or another run's lock and staging directories."""
    return {p.name for p in output.iterdir() if p.name != LOCK_IN_OUTPUT and not is_staging_name(p.name)}


def _some(names: set[str], limit: int = 3) -> str:
    shown = sorted(names)[:limit]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


# -- paths that must not meet -----------------------------------------------------------------------


def _relation(output: Path, other: Path) -> str | None:
    if output == other:
        return "is"
    if output in other.parents:
        return "contains"
    if other in output.parents:
        return "lies inside"
    return None


def check_paths(
    output: Path, display: str, inputs: Iterable[Path], cache_root: Path | None, rejects: str | None
) -> Path | None:
    """Refuse an output that is, contains or lies inside an input, the cache or the rejects file.

    ``output`` and ``inputs`` are resolved paths. Returns the rejects file's path relative to the
    output when it lies inside it (it is then written with the output, so the swap keeps it).
    """
    inputs = list(inputs)
    for path in inputs:
        relation = _relation(output, path)
        if relation:
            raise UsageError(
                f"{display}: the output {relation} the input {path}; writing it would replace the input; "
                "choose an -o outside the inputs"
            )
    if cache_root is not None:
        cache = cache_root.resolve()
        relation = _relation(output, cache)
        if relation:
            raise UsageError(
                f"{display}: the output {relation} the tokenization cache {cache}; choose another -o or --cache-dir"
            )
    if rejects is None:
        return None
    target = Path(rejects).resolve()
    for path in inputs:
        if target == path or path in target.parents:
            raise UsageError(
                f"--rejects {rejects}: is the input {path}; writing it would replace the input; name a new file"
            )
    if cache_root is not None and (target == cache_root.resolve() or cache_root.resolve() in target.parents):
        raise UsageError(f"--rejects {rejects}: lies inside the tokenization cache; name a file elsewhere")
    if target == output or target in output.parents:
        raise UsageError(f"--rejects {rejects}: is or contains the output {display}; name another file")
    if output in target.parents:
        relative = target.relative_to(output)
        first = relative.parts[0]
        if first == MANIFEST or first in INDEX_FILES or first.startswith(("shard-", ".")):
            raise UsageError(f"--rejects {rejects}: collides with a file packcli writes in the output; rename it")
        return relative
    check_rejects_target(rejects, target)
    return None


def check_rejects_target(rejects: str, target: Path) -> None:
    """Refuse a --rejects file outside the output that would replace or change what packcli did not write.

    ``target`` is the resolved path. It may not lie inside another packcli output or staging directory
    (that output would no longer match its manifest), nor below a file; when it exists it must be a
    rejects file packcli wrote: empty, or a first line that is an entry (``REJECT_KEYS``).
    """
    for parent in target.parents:
        if not os.path.lexists(parent):
            continue
        if not parent.is_dir():
            raise UsageError(f"--rejects {rejects}: {parent} is a file, not a directory; name a file in a directory")
        break
    for parent in target.parents:
        if parent.is_dir() and is_packcli_dir(parent):
            raise UsageError(
                f"--rejects {rejects}: lies inside the packcli output {parent}; writing it would change that "
                "output; name a file outside it"
            )
    if not os.path.lexists(target):
        return
    if target.is_dir():
        raise UsageError(f"--rejects {rejects}: is a directory; name a file")
    if not target.is_file():
        raise UsageError(f"--rejects {rejects}: exists and is not a regular file; name a new file")
    if not _is_rejects_file(target):
        raise UsageError(
            f"--rejects {rejects}: exists and is not a rejects file packcli wrote; writing it would replace it; "
            "remove it or name a new file"
        )


# The keys of every entry of a --fix-turns-log file (worker._fix_entry).
FIX_LOG_KEYS = frozenset(
    {"sample_index", "source", "position", "unit", "changes", "record", "record_truncated", "record_chars"}
)


def check_fix_log_target(log: str, output: Path, inputs: Iterable[Path], cache_root: Path | None) -> None:
    """Refuse a --fix-turns-log file that is an input, lies in the cache or the output, or would replace a
    file packcli did not write (an existing file must be empty or start with an entry, ``FIX_LOG_KEYS``).

    ``output`` and ``inputs`` are resolved paths.
    """
    target = Path(log).resolve()
    if target in set(inputs):
        raise UsageError(f"--fix-turns-log {log}: is an input; writing it would replace the input; name a new file")
    if cache_root is not None and target.is_relative_to(cache_root.resolve()):
        raise UsageError(f"--fix-turns-log {log}: lies inside the tokenization cache; name a file elsewhere")
    if target == output or target.is_relative_to(output):
        raise UsageError(f"--fix-turns-log {log}: lies in the output {output}; name a file outside it")
    for parent in target.parents:
        if parent.is_dir() and is_packcli_dir(parent):
            raise UsageError(f"--fix-turns-log {log}: lies inside the packcli output {parent}; name a file outside it")
    if not os.path.lexists(target):
        return
    if not target.is_file():
        raise UsageError(f"--fix-turns-log {log}: exists and is not a regular file; name a new file")
    if not _is_entry_file(target, FIX_LOG_KEYS):
        raise UsageError(
            f"--fix-turns-log {log}: exists and is not a log packcli wrote; writing it would replace it; "
            "remove it or name a new file"
        )


def _is_rejects_file(path: Path) -> bool:
    return _is_entry_file(path, REJECT_KEYS)


def _is_entry_file(path: Path, keys: frozenset[str]) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(_REJECT_LINE_BYTES)
    except OSError:
        return False
    if not first:
        return True
    try:
        entry = json.loads(first)
    except ValueError:
        return False
    return isinstance(entry, dict) and set(entry) == keys


# -- the lock ---------------------------------------------------------------------------------------


class OutputLock:
    """An advisory lock (flock) on a file beside the output, holding the PID of the run that took it.

    The lock file is removed on release; a run that opened it just before cannot then believe it holds
    the lock, because after locking it checks that the path still names the file it locked.
    """

    def __init__(self, path: Path, display: str) -> None:
        self.path = path
        self.display = display
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(
                    f"{self.display}: cannot create the output directory ({exc.strerror or exc}); "
                    "choose a writable path with -o"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_pid(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise OutputError(
                        f"{self.display}: cannot lock {self.path} ({exc.strerror or exc}); choose another -o"
                    ) from exc
                who = f"another packcli run (PID {holder})" if holder else "another packcli run"
                raise OutputError(
                    f"{self.display}: {who} is writing this output; wait for it to finish or choose another -o"
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and removed by its holder between our open and our lock
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def lock_path(output: Path, in_place: bool) -> Path:
    return output / LOCK_IN_OUTPUT if in_place else output.parent / f".{output.name}.lock"


# -- replacing an output ----------------------------------------------------------------------------


def real_output(output: str) -> Path:
    """The resolved output path. A symlink to a directory stands for its target, whose contents are
    replaced; the link itself is never replaced."""
    path = Path(output)
    if path.is_symlink() and not path.exists():
        raise UsageError(
            f"{output}: is a symlink to {os.readlink(path)}, which does not exist; create it or choose another -o"
        )
    return path.resolve()
