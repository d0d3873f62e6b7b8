"""``packcli cache ls`` and ``packcli cache prune``: the tokenization cache's entries, and removing them.

Results go to stdout (a table for people, ``--json`` for machines); errors are one line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import packcli.cli.render as console
from packcli.cli.options import CacheDirOption, JsonFlag


def _root(cache_dir: str | None) -> Path:
    from packcli.store.key import default_cache_dir

    return Path(cache_dir) if cache_dir else default_cache_dir()


def ls(cache_dir: CacheDirOption = None, json_out: JsonFlag = False) -> None:
    """List the cache's entries: size, last use, what made them (tokenizer, template, inputs, packcli version).

    Least recently used first; an entry a running pack holds is marked in use.
    """
    import time

    from packcli.store.cachedir import list_entries

    root = _root(cache_dir)
    now = time.time()
    entries = [e.to_json(now) for e in list_entries(root)]
    if json_out:
        console.emit_json({"cache_dir": str(root), "bytes": sum(e["bytes"] for e in entries), "entries": entries})
    else:
        console.print_cache_entries(str(root), entries)


def prune(
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", metavar="AGE", help="Remove entries last used more than AGE ago (30m, 12h, 7d)."),
    ] = None,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size", metavar="SIZE", help="Then remove the least recently used until the cache holds SIZE (10GB)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    cache_dir: CacheDirOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Remove cache entries by age and by total size. An entry a running pack holds is never removed.

    Example: packcli cache prune --older-than 14d --max-size 20GB
    """
    from packcli.errors import UsageError
    from packcli.store.cachedir import parse_age, parse_size
    from packcli.store.cachedir import prune as prune_cache

    if older_than is None and max_size is None:
        raise UsageError("cache prune needs --older-than AGE, --max-size SIZE or both; see packcli cache ls")
    age = parse_age(older_than, "--older-than") if older_than is not None else None
    size = parse_size(max_size, "--max-size") if max_size is not None else None
    root = _root(cache_dir)
    result = prune_cache(root, older_than=age, max_size=size, dry_run=dry_run)
    if json_out:
        console.emit_json({"cache_dir": str(root), **result})
    else:
        console.print_prune(str(root), result)
