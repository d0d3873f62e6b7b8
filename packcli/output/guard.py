"""The output's guards: the path rules checked before anything is written, what ``--overwrite`` may
replace, and the lock that keeps two runs from writing one output."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path

from packcli.errors import OUTPUT, Opt, OutputError, Part, UsageError
from packcli.owned import (
    _REJECT_LINE_BYTES,
    EVAL_DIR,
    INDEX_FILES,
    LOCK_IN_OUTPUT,
    MANIFEST,
    REJECT_KEYS,
    REPLACE_JOURNAL,
    foreign_in_eval,
    foreign_on_rejects_path,
    interrupted_replace_message,
    is_packcli_dir,
    is_staging_name,
    names_eval,
    own_files,
    read_own_manifest,
    rejects_parts,
)
from packcli.procs import cleanup


def replaceable(output: Path, display: str, overwrite: bool) -> set[str]:
    """Check that packcli may write ``output``; return the names in it that the new output replaces.

    A missing or empty directory is always fine. A non-empty one must be a previous packcli output
    holding nothing but what packcli wrote, and needs ``--overwrite``: the refusal without it says which
    of the two it lacks, so that it never asks for an ``--overwrite`` that would be refused too.
    """
    if not os.path.lexists(output):
        return set()
    if not output.is_dir():
        raise UsageError(f"{display}: exists and is not a directory; choose another ", OUTPUT)
    if os.path.lexists(output / REPLACE_JOURNAL):  # left by a replace that could not be finished
        raise OutputError(*interrupted_replace_message(display))
    entries = _entries(output)
    if not entries:
        return set()
    manifest = read_own_manifest(output)
    if manifest is None and not overwrite:
        raise UsageError(
            f"{display}: the output directory is not empty and is not a packcli output (no manifest.json written by "
            f"packcli; it holds {_some(entries)}); packcli writes only into an empty directory, and ",
            Opt("overwrite"),
            " replaces only a previous packcli output",
            hint=("choose another ", OUTPUT),
        )
    if manifest is None:
        raise UsageError(
            f"{display}: ",
            Opt("overwrite"),
            " replaces only an empty directory or a previous packcli output, and this "
            f"one has no manifest.json written by packcli (it holds {_some(entries)})",
            hint=("choose another ", OUTPUT),
        )
    foreign = entries - own_files(output, manifest)
    parts = rejects_parts(manifest)
    if parts and parts[0] in foreign:  # name what the rejects file's directory holds, not the directory
        foreign = (foreign - {parts[0]}) | foreign_on_rejects_path(output, parts)
    if EVAL_DIR in foreign and names_eval(manifest):  # likewise for the eval split's directory
        foreign = (foreign - {EVAL_DIR}) | foreign_in_eval(output)
    if foreign:
        fix: tuple[Part, ...] = ("move them out or choose another ", OUTPUT)
        if not overwrite:  # moving them out leaves a previous output, which --overwrite replaces
            fix = ("move them out and pass ", Opt("overwrite"), ", or choose another ", OUTPUT)
        raise UsageError(f"{display}: holds files packcli did not write ({_some(foreign)})", hint=fix)
    if not overwrite:
        raise UsageError(
            f"{display}: the output directory holds a previous packcli output",
            hint=("pass ", Opt("overwrite"), " to replace it, or choose another ", OUTPUT),
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
    if manifest is not None and names_eval(manifest) and EVAL_DIR in entries:
        added |= foreign_in_eval(output) - {EVAL_DIR}
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
                f"{display}: the output {relation} the input {path}; writing it would replace the input; choose an ",
                OUTPUT,
                " outside the inputs",
            )
    if cache_root is not None:
        cache = cache_root.resolve()
        relation = _relation(output, cache)
        if relation:
            raise UsageError(
                f"{display}: the output {relation} the tokenization cache {cache}",
                hint=("choose another ", Opt("output", short=True), " or ", Opt("cache_dir")),
            )
    if rejects is None:
        return None
    target = Path(rejects).resolve()
    for path in inputs:
        if target == path or path in target.parents:
            raise UsageError(
                Opt("rejects"), f" {rejects}: is the input {path}; writing it would replace the input; name a new file"
            )
    if cache_root is not None and (target == cache_root.resolve() or cache_root.resolve() in target.parents):
        raise UsageError(Opt("rejects"), f" {rejects}: lies inside the tokenization cache; name a file elsewhere")
    if target == output or target in output.parents:
        raise UsageError(Opt("rejects"), f" {rejects}: is or contains the output {display}; name another file")
    if output in target.parents:
        relative = target.relative_to(output)
        first = relative.parts[0]
        if first == MANIFEST or first in INDEX_FILES or first.startswith(("shard-", ".")):
            raise UsageError(
                Opt("rejects"), f" {rejects}: collides with a file packcli writes in the output; rename it"
            )
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
            raise UsageError(
                Opt("rejects"), f" {rejects}: {parent} is a file, not a directory; name a file in a directory"
            )
        break
    for parent in target.parents:
        if parent.is_dir() and is_packcli_dir(parent):
            raise UsageError(
                Opt("rejects"),
                f" {rejects}: lies inside the packcli output {parent}; writing it would change that "
                "output; name a file outside it",
            )
    if not os.path.lexists(target):
        return
    if target.is_dir():
        raise UsageError(Opt("rejects"), f" {rejects}: is a directory; name a file")
    if not target.is_file():
        raise UsageError(Opt("rejects"), f" {rejects}: exists and is not a regular file; name a new file")
    if not _is_rejects_file(target):
        raise UsageError(
            Opt("rejects"),
            f" {rejects}: exists and is not a rejects file packcli wrote; writing it would replace it; "
            "remove it or name a new file",
        )


# The keys of every entry of a --fix-turns-log file (tokenize.batches.record_entries.fix_entry).
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
        raise UsageError(
            Opt("fix_turns_log"), f" {log}: is an input; writing it would replace the input; name a new file"
        )
    if cache_root is not None and target.is_relative_to(cache_root.resolve()):
        raise UsageError(Opt("fix_turns_log"), f" {log}: lies inside the tokenization cache; name a file elsewhere")
    if target == output or target.is_relative_to(output):
        raise UsageError(Opt("fix_turns_log"), f" {log}: lies in the output {output}; name a file outside it")
    for parent in target.parents:
        if parent.is_dir() and is_packcli_dir(parent):
            raise UsageError(
                Opt("fix_turns_log"), f" {log}: lies inside the packcli output {parent}; name a file outside it"
            )
    if not os.path.lexists(target):
        return
    if not target.is_file():
        raise UsageError(Opt("fix_turns_log"), f" {log}: exists and is not a regular file; name a new file")
    if not _is_entry_file(target, FIX_LOG_KEYS):
        raise UsageError(
            Opt("fix_turns_log"),
            f" {log}: exists and is not a log packcli wrote; writing it would replace it; remove it or name a new file",
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
                    "choose a writable path with ",
                    OUTPUT,
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_pid(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise OutputError(
                        f"{self.display}: cannot lock {self.path} ({exc.strerror or exc}); choose another ", OUTPUT
                    ) from exc
                who = f"another packcli run (PID {holder})" if holder else "another packcli run"
                raise OutputError(
                    f"{self.display}: {who} is writing this output; wait for it to finish or choose another ", OUTPUT
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
            cleanup.temporary(self.path)
            return

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        cleanup.kept(self.path)
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
            f"{output}: is a symlink to {os.readlink(path)}, which does not exist; create it or choose another ",
            OUTPUT,
        )
    return path.resolve()
