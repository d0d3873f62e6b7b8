"""Filesystem URIs (``s3://``, ``gs://``, ``file://``): the one test of what is a URI, opening and sizing an
input there, and outputs there, for the Ray engine.

There is no rename at a URI: shards are written in place and the manifest last, as the marker that the
output is complete; an overwrite first removes the old marker.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Iterable
from typing import Any

from packcli.errors import Opt, OutputError, Part, UsageError
from packcli.results import Manifest

# A scheme (RFC 3986: a letter, then letters, digits, "+", "-" or ".") of two characters or more, then
# "://". One letter is a Windows drive ("C://data" is a path there), and a "://" further on is part of
# a path ("out/a://b").
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_uri(location: str) -> bool:
    """Return whether a location is a filesystem URI (``s3://bucket/data/``) rather than a local path."""
    return _URI.match(location) is not None


def join(root: str, name: str) -> str:
    """``root/name`` for a local path or a URI."""
    return f"{root.rstrip('/')}/{name}" if is_uri(root) else os.path.join(root, name)


def open_uri(uri: str, random_access: bool = False) -> Any:
    """Open an input at a URI for reading bytes (buffered; seekable with ``random_access``)."""
    from pyarrow import fs as pafs

    filesystem, where = pafs.FileSystem.from_uri(uri)
    # compression=None: the bytes as stored (pyarrow would decompress by the name; packcli's readers do).
    raw = filesystem.open_input_file(where) if random_access else filesystem.open_input_stream(where, compression=None)
    return io.BufferedReader(raw, 1 << 20)


def input_size(path: str) -> int:
    """The size in bytes of an input file, a local path or a URI."""
    if not is_uri(path):
        return os.path.getsize(path)
    from pyarrow import fs as pafs

    filesystem, where = pafs.FileSystem.from_uri(path)
    return int(filesystem.get_file_info(where).size)


# -- the Ray instance ------------------------------------------------------------------------------


def make_dirs(uri: str) -> None:
    """Create the URI's directory where the filesystem has directories (object stores need none)."""
    import pyarrow as pa
    from pyarrow import fs as pafs

    try:
        filesystem, base = pafs.FileSystem.from_uri(uri)
        filesystem.create_dir(base, recursive=True)
    except (OSError, pa.ArrowInvalid) as exc:
        raise OutputError(f"{uri}: cannot create the output ({exc}); check the URI and credentials") from exc


def check_uri_output(output: str, overwrite: bool) -> None:
    """Refuse a URI prefix that already holds files unless overwriting; with overwrite, remove its
    manifest first, so that the old output stops looking complete before any shard is replaced."""
    import pyarrow as pa
    from pyarrow import fs as pafs

    try:
        filesystem, base = pafs.FileSystem.from_uri(output)
        infos = filesystem.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        if infos and not overwrite:
            raise UsageError(
                f"{output}: the output is not empty",
                hint=("pass ", Opt("overwrite"), " or choose another ", Opt("output", short=True)),
            )
        manifest = f"{base.rstrip('/')}/manifest.json"
        if overwrite and filesystem.get_file_info(manifest).type != pafs.FileType.NotFound:
            filesystem.delete_file(manifest)
    except (OSError, pa.ArrowInvalid) as exc:
        raise OutputError(f"{output}: cannot use the output ({exc}); check the URI and credentials") from exc


def write_manifest_uri(output: str, manifest: Manifest, keep: Iterable[str] = ()) -> None:
    """Write ``manifest.json`` under a URI prefix, after the shards (object stores have no rename, so the
    manifest is the completeness marker), then delete shard files of an earlier run not in ``keep``."""

    import pyarrow as pa
    from pyarrow import fs as pafs

    try:
        filesystem, base = pafs.FileSystem.from_uri(output)
        base = base.rstrip("/")
        with filesystem.open_output_stream(f"{base}/manifest.json") as out:
            out.write((json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n").encode())
        wanted = set(keep) | set(manifest.files) | {"manifest.json"}
        for info in filesystem.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
            if info.type == pafs.FileType.File and info.base_name.startswith("shard-") and info.base_name not in wanted:
                filesystem.delete_file(info.path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise OutputError(f"{output}: cannot write the manifest ({exc}); check the URI and credentials") from exc


def remove_uri_dir(uri: str) -> None:
    """Remove a directory at a filesystem URI and all below it; nothing when it cannot be removed."""
    from pyarrow import fs as pafs

    with contextlib.suppress(OSError, ValueError):
        filesystem, where = pafs.FileSystem.from_uri(uri)
        filesystem.delete_dir(where)


def needs_ray(output: str) -> tuple[Part, ...]:
    """Return the error's words for a filesystem URI output written without the Ray engine."""
    return (
        Opt("output", short=True),
        f" {output}: a filesystem URI output needs ",
        Opt("engine", "ray"),
        "; or pass a local path",
    )
