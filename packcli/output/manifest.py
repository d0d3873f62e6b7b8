"""``manifest.json``: written from a :class:`~packcli.results.Manifest`, atomically; read back, checked, typed.

The one reader of an output's manifest for the commands that read outputs (stats, inspect, verify, the
library's ``PackResult.shards``). ``packcli.owned.read_own_manifest`` only tells whether a directory is
packcli's (it never raises); ``packcli.train.checks`` reads it on the training side, which imports
nothing of the packing side.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packcli.contract import MANIFEST
from packcli.errors import OUTPUT, OutputError
from packcli.jsontypes import JSONObject
from packcli.owned import REPLACE_JOURNAL, interrupted_replace_message
from packcli.results import DamagedResult, Manifest


def manifest_text(manifest: Manifest) -> str:
    """The text of manifest.json: the manifest's keys in their order, indented by two."""
    return json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n"


def write_manifest(directory: Path, manifest: Manifest, output: Path | None = None) -> None:
    """Write manifest.json into ``directory`` atomically; ``output`` is the path errors name."""
    path = directory / MANIFEST
    tmp = directory / (MANIFEST + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(manifest_text(manifest))
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(
            f"{output or directory}: cannot write {MANIFEST} ({exc.strerror or exc}); "
            "free disk space or choose another ",
            OUTPUT,
        ) from exc


# -- read side -------------------------------------------------------------------------------------


def read_manifest(directory: Path) -> JSONObject:
    """Return the manifest of a packed output directory as JSON data, unchecked (verify reports what is
    wrong in it rather than stopping at the first thing)."""
    if os.path.lexists(directory / REPLACE_JOURNAL):  # its files are part old, part new: nothing to check yet
        raise OutputError(*interrupted_replace_message(str(directory)))
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise OutputError(f"{directory}: no {MANIFEST}; is this a packcli output directory?") from exc
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: also an integer too long to convert
        raise OutputError(f"{path}: cannot be read ({exc}); the output is damaged, pack again") from exc
    if not isinstance(manifest, dict):
        raise OutputError(f"{path}: is not a JSON object; the manifest is damaged, pack again")
    return manifest


def manifest_problems(manifest: JSONObject) -> list[str]:
    """Return what is missing or wrong in the manifest keys that stats, inspect and verify read.

    A shard entry must name a bare file name: a path that leaves the output directory is refused, so
    reading a manifest never reads (or checks) a file outside the output.
    """

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    problems = []
    if not is_int(manifest.get("max_len")) or manifest["max_len"] < 1:
        problems.append("lacks max_len" if "max_len" not in manifest else "max_len is not a positive integer")
    for key, kind in (("counts", dict), ("tokenizer", dict)):
        if key in manifest and not isinstance(manifest[key], kind):
            problems.append(f"{key} is not an object")
    entries = manifest.get("shards")
    if not isinstance(entries, list):
        problems.append("lacks shards" if entries is None else "shards is not a list")
        return problems
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"shard entry {k} is not an object")
            continue
        missing = [key for key in ("file", "rows", "tokens", "sha256") if key not in entry]
        if missing:
            problems.append(f"shard entry {k} lacks {', '.join(missing)}")
            continue
        name = entry["file"]
        if not isinstance(name, str) or not is_int(entry["rows"]) or not is_int(entry["tokens"]):
            problems.append(f"shard entry {k} has a file, rows or tokens of the wrong type")
        elif not name or name in (".", "..") or Path(name).name != name or "\\" in name:
            problems.append(f"shard entry {k} names '{name}', outside the output directory")
    return problems


def read_checked_manifest(directory: Path) -> Manifest:
    """Return the manifest of a packed output; raise OutputError naming the first thing wrong in it."""
    manifest = read_manifest(directory)
    problems = manifest_problems(manifest)
    try:
        if not problems:
            return Manifest.from_dict(manifest)
    except DamagedResult as exc:
        problems = [str(exc)]
    raise OutputError(f"{directory / MANIFEST}: {problems[0]}; the manifest is damaged, pack again")
