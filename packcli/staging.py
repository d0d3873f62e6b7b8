"""Atomic output: shards are staged beside ``-o`` and swapped in whole, or written in place into a mount point.

A killed run leaves the previous output as it was (or, between the two renames of the fallback swap, a
copy the next run moves back); see ``StagedOutput``.
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

from packcli.errors import OutputError
from packcli.safety import (
    IN_PLACE_PREFIX,
    MANIFEST,
    OutputLock,
    check_paths,
    check_still_replaceable,
    clean_stale_cache_dirs,
    clean_stale_output_dirs,
    lock_path,
    owner_tag,
    real_output,
    replaceable,
    staging_prefix,
)

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
    """Move the staged files into ``output`` in place (for an output that cannot be renamed).

    The old manifest goes first and the new one last, so at no point does the directory hold a
    manifest that does not describe it. Only the names in ``old`` (what the overwrite check found to
    be packcli's) are removed.
    """
    with contextlib.suppress(FileNotFoundError):
        (output / MANIFEST).unlink()
    for name in old:
        path = output / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    new = sorted(p.name for p in staged.iterdir() if p.name != MANIFEST)
    for name in [*new, MANIFEST]:
        source = staged / name
        if not os.path.lexists(source):
            continue
        try:
            os.replace(source, output / name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.move(str(source), str(output / name))
    shutil.rmtree(staged, ignore_errors=True)


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
            self.tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            # mkdtemp makes the directory private; the output is an ordinary directory.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o777 & ~umask)
        except OSError as exc:
            raise OutputError(
                f"{display}: cannot create the output directory ({exc.strerror or exc}); choose a writable path with -o"
            ) from exc

    def commit(self) -> None:
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
        shutil.rmtree(self.tmp, ignore_errors=True)
