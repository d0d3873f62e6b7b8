"""Atomic output: shards are staged beside ``-o`` and swapped in whole, or written in place into a mount point.

A killed run leaves the previous output as it was (or, between the two renames of the fallback swap, a
copy the next run moves back; or, in the middle of an in-place replace, a journal and the complete new
output, from which the next run finishes the replace); see ``StagedOutput`` and ``replace_contents``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packcli.errors import OUTPUT, OutputError
from packcli.output.guard import OutputLock, check_paths, check_still_replaceable, lock_path, real_output, replaceable
from packcli.owned import (
    IN_PLACE_PREFIX,
    MANIFEST,
    REPLACE_JOURNAL,
    ReplaceJournal,
    clean_stale_cache_dirs,
    clean_stale_output_dirs,
    owner_tag,
    read_replace_journal,
    replace_journal_staged,
    staging_prefix,
)
from packcli.procs import cleanup

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False where the system cannot."""

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_contents(staged: Path, output: Path, old: Iterable[str]) -> None:
    """Replace the contents of ``output`` in place with the staged files (for an output that cannot be renamed).

    Before the first file is removed, a journal (``REPLACE_JOURNAL``: the old names to remove, the
    staged names to move in, and where they are staged) is written whole into the output and fsynced.
    Every step after it can be done again from where a kill left it, and the next run does so
    (``finish_interrupted_replace``): the new output is complete in its staged copy from the start.
    The old manifest goes first and the new one last, so at no point does the directory hold a manifest
    that does not describe it. Only the names in ``old`` (what the overwrite check found to be
    packcli's) are removed.
    """
    if not (staged / MANIFEST).is_file():
        raise OutputError(f"{output}: the staged output has no {MANIFEST}; nothing was replaced, pack again")
    try:
        if staged.parent != output:
            # Staged beside the output (a bind mount, found only when its rename failed): renames into it
            # cross mount points, which rename(2) refuses, so the staged copy is first copied inside it.
            staged = _copy_inside(staged, output)
        move = sorted(p.name for p in staged.iterdir() if p.name != MANIFEST)
        journal = ReplaceJournal(staged.name, tuple(sorted(old)), (*move, MANIFEST), owner_tag())
        _write_journal(output, journal)
    except OSError as exc:
        with contextlib.suppress(OSError):
            (output / _JOURNAL_TMP).unlink()
        if staged.parent == output:
            shutil.rmtree(staged, ignore_errors=True)
        raise OutputError(
            f"{output}: cannot stage the new output inside it ({exc.strerror or exc}); the previous output was "
            "left as it was; free space there or choose another ",
            OUTPUT,
        ) from exc
    try:
        _roll_forward(output, journal)
    except OSError as exc:
        raise OutputError(
            f"{output}: cannot replace its contents ({exc.strerror or exc}); the next packcli pack with this ",
            OUTPUT,
            " finishes the replace from the complete new output it kept",
        ) from exc


def finish_interrupted_replace(output: Path, display: str) -> bool:
    """Finish the in-place replace a killed run began in ``output``; return whether there was one.

    Called with the output's lock held, so the run that wrote the journal is over, whatever host it
    ran on. Its journal is written only once the new output is complete in the staged copy, so the
    replace is always rolled forward; only the names the journal lists are touched. Raises
    OutputError when the staged copy is no longer whole (someone removed files from it).
    """
    if not output.is_dir() or output.is_symlink():
        return False
    with contextlib.suppress(FileNotFoundError):
        (output / _JOURNAL_TMP).unlink()  # a journal cut short: nothing had been removed yet
    journal = read_replace_journal(output, display)
    if journal is None:
        return False
    missing = _not_found(output, journal)
    if missing:
        raise OutputError(
            f"{display}: a packcli run was killed while replacing this output in place, and the new output it "
            f"kept is incomplete ({', '.join(missing[:3])} missing); move out what you need, empty the directory "
            "and pack again"
        )
    try:
        _roll_forward(output, journal)
    except OSError as exc:
        raise OutputError(
            f"{display}: cannot finish the in-place replace a killed run began ({exc.strerror or exc}); "
            "fix the cause and run again"
        ) from exc
    return True


_JOURNAL_TMP = REPLACE_JOURNAL + ".tmp"


def _copy_inside(staged: Path, output: Path) -> Path:
    """Copy a staged output into a new staging directory inside ``output``; remove the first; return the copy."""
    inside = Path(tempfile.mkdtemp(prefix=f"{IN_PLACE_PREFIX}{owner_tag()}-", dir=output))
    try:
        shutil.copytree(staged, inside, symlinks=True, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(inside, ignore_errors=True)
        raise
    shutil.rmtree(staged, ignore_errors=True)
    return inside


def _write_journal(output: Path, journal: ReplaceJournal) -> None:
    """Write the journal into ``output`` whole or not at all, and make it durable before anything is removed."""
    tmp = output / _JOURNAL_TMP
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(journal.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, output / REPLACE_JOURNAL)
    _fsync_dir(output)


def _not_found(output: Path, journal: ReplaceJournal) -> list[str]:
    """The names a journal moves in that are neither staged nor moved in (empty: it can be finished).

    Names move in the journal's order, so those moved in are the first ones and those still staged
    the rest: a name missing from that rest was lost, whatever file of its name the output holds.
    """
    staged = output / journal.staged
    here = [os.path.lexists(staged / n) for n in journal.move]
    first = here.index(True) if True in here else len(here)
    moved = [n for n in journal.move[:first] if not os.path.lexists(output / n)]
    return moved + [n for n, there in zip(journal.move[first:], here[first:], strict=True) if not there]


def _roll_forward(output: Path, journal: ReplaceJournal) -> None:
    """Do the steps of a journaled replace that are not done yet: each can be repeated after a kill.

    A staged name that is gone was moved in already; while the new manifest is still staged, the one
    in the output (if any) is the old one.
    """
    staged = output / journal.staged
    if os.path.lexists(staged / MANIFEST):
        _remove(output / MANIFEST)
        for name in sorted(set(journal.remove) - set(journal.move)):
            _remove(output / name)
        for name in journal.move:
            if os.path.lexists(staged / name):
                _move_in(staged / name, output / name)
    _end_replace(output, staged)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _move_in(source: Path, target: Path) -> None:
    """Move a staged file or directory over the old one of the same name (a file is replaced atomically)."""
    if (source.is_dir() and not source.is_symlink()) or (target.is_dir() and not target.is_symlink()):
        _remove(target)  # rename(2) replaces only a file or an empty directory
    os.replace(source, target)


def _end_replace(output: Path, staged: Path) -> None:
    """Remove the journal, then the emptied staging directory (a stale one the next run would remove)."""
    with contextlib.suppress(FileNotFoundError):
        (output / REPLACE_JOURNAL).unlink()
    _fsync_dir(output)
    shutil.rmtree(staged, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # a file system that cannot sync a directory
            raise
    finally:
        os.close(fd)


def is_mount(path: Path) -> bool:
    return path.is_dir() and os.path.ismount(path)


# -- putting it together ----------------------------------------------------------------------------


class PreparedOutput:
    """The locked, checked output of one run: where to stage, and where the rejects file goes."""

    def __init__(self, staged: Any, lock: OutputLock, rejects_relative: Path | None) -> None:
        self.staged = staged
        self.lock = lock
        self.rejects_relative = rejects_relative

    def rejects_path(self, rejects: str) -> Path:
        """Where to write the rejects file: inside the staging directory when it lies in the output, so
        the swap keeps it (an old one inside the output would go with the old output)."""
        if self.rejects_relative is not None:
            return self.staged.tmp / self.rejects_relative
        return Path(rejects)

    def release(self) -> None:
        self.lock.release()


def prepare_output(
    output: str, overwrite: bool, inputs: Iterable[Path], cache_root: Path | None, rejects: str | None
) -> PreparedOutput:
    """Check the output against everything that must not be touched, lock it, clear what killed runs
    left, and create the staging directory. The caller releases the lock when the run ends."""

    real = real_output(output)
    relative = check_paths(real, output, inputs, cache_root, rejects)
    in_place = is_mount(real)
    lock = OutputLock(lock_path(real, in_place), output)
    lock.acquire()
    try:
        finish_interrupted_replace(real, output)
        clean_stale_output_dirs(real)
        if cache_root is not None:
            clean_stale_cache_dirs(cache_root)
        old = replaceable(real, output, overwrite)
        staged = StagedOutput(real, output, old, in_place)
    except BaseException:
        lock.release()
        raise
    return PreparedOutput(staged, lock, relative)


class StagedOutput:
    """A staging directory for the new output; ``commit`` swaps it in, ``abort`` removes it.

    A run that fails or is interrupted leaves the previous output untouched and no directory that
    looks complete: the manifest is the last file written, and the swap is one atomic exchange of the
    two directories where the system has it (else two renames; a run killed between them leaves the
    old output beside, which the next run moves back). An output that cannot be renamed (a mount
    point) is staged inside itself and its contents replaced, manifest last.

    ``output`` is the resolved path; ``display`` the path as the user gave it; ``old`` the names in
    the existing output that the new one replaces (see ``replaceable``).
    """

    def __init__(self, output: Path, display: str, old: set[str] | None = None, in_place: bool = False) -> None:
        self.output = output
        self.display = display
        self.old = old or set()
        self.in_place = in_place
        parent = output if in_place else output.parent
        prefix = f"{IN_PLACE_PREFIX}{owner_tag()}-" if in_place else staging_prefix(output.name)
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.tmp = cleanup.temporary(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))
            # mkdtemp makes the directory private; the output is an ordinary directory.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o777 & ~umask)
        except OSError as exc:
            raise OutputError(
                f"{display}: cannot create the output directory ({exc.strerror or exc}); choose a writable path with ",
                OUTPUT,
            ) from exc

    def commit(self) -> None:
        """Swap the staged output in; never cut by an end at once (``procs.cleanup.critical``)."""
        with cleanup.critical():
            cleanup.kept(self.tmp)  # from here on it is the new output, or what the next run finishes from
            self._commit()

    def _commit(self) -> None:
        # The output was checked when the run began; what was put there since must not go with it.
        check_still_replaceable(self.output, self.display, self.old)
        if self.in_place:
            replace_contents(self.tmp, self.output, self.old)
            return
        if not os.path.lexists(self.output):
            os.replace(self.tmp, self.output)
            return
        try:
            swapped = exchange(self.tmp, self.output)
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            # Not renameable after all (a bind mount, which ismount does not see): replace in place.
            replace_contents(self.tmp, self.output, self.old)
            return
        if swapped:  # the staging directory now holds the previous output
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old = self.output.parent / f".{self.output.name}.old-{owner_tag()}"
        try:
            os.replace(self.output, old)
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            replace_contents(self.tmp, self.output, self.old)
            return
        os.replace(self.tmp, self.output)
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        if replace_journal_staged(self.output) == self.tmp.name:
            return  # a replace cut short by an error: the next run finishes it from this copy
        shutil.rmtree(self.tmp, ignore_errors=True)
        cleanup.kept(self.tmp)
