"""``packcli cache ls`` and ``packcli cache prune``: the tokenization cache's entries, and removing them.

Results go to stdout (a table for people, ``--json`` for machines); errors are one line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

import packcli.cli.render as console
from packcli.cli.options import CacheDirOption, JsonFlag


def _root(cache_dir: str | None) -> Path:
    from packcli.store.key import cache_root

    return cache_root(cache_dir)


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
        print_cache_entries(str(root), entries)


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
    from packcli.store.cachedir import parse_age, parse_size, prune as prune_cache

    if older_than is None and max_size is None:
        raise UsageError("cache prune needs --older-than AGE, --max-size SIZE or both; see packcli cache ls")
    age = parse_age(older_than, "--older-than") if older_than is not None else None
    size = parse_size(max_size, "--max-size") if max_size is not None else None
    root = _root(cache_dir)
    result = prune_cache(root, older_than=age, max_size=size, dry_run=dry_run)
    if json_out:
        console.emit_json({"cache_dir": str(root), **result})
    else:
        print_prune(str(root), result)


# -- rendering -----------------------------------------------------------------------------------------


def human_bytes(n: int) -> str:
    """``1234567`` -> ``1.2 MB`` (powers of 1000, as --max-size reads them)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def human_age(seconds: float) -> str:
    """``93784`` -> ``1d 2h``."""
    s = int(seconds)
    for size, unit, smaller, sub in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= size:
            rest = (s % size) // smaller
            return f"{s // size}{unit}" + (f" {rest}{sub}" if rest else "")
    return f"{s}s"


def print_cache_entries(root: str, entries: list[dict[str, Any]]) -> None:
    """The entries of the cache (``packcli cache ls``), least recently used first, on stdout."""
    from rich.table import Table

    total = sum(e["bytes"] for e in entries)
    table = Table(title=f"{len(entries)} entries, {human_bytes(total)} in {root}", title_justify="left")
    for name, justify in (("key", "left"), ("size", "right"), ("last used", "right"), ("made by", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("inputs", overflow="fold")
    for e in entries:
        if e["kind"] == "input":
            made = "in-memory input (earlier packcli)"
        elif e["damaged"]:
            made = "damaged (rebuilt when used; pruned like any entry)"
        else:
            made = f"{e['tokenizer']}; template: {e['template']}; packcli {e['packcli_version'] or '?'}"
        key = e["key"] + (" (in use)" if e["in_use"] else "")
        names = [x.rsplit("/", 1)[-1] for x in e["inputs"]]
        table.add_row(key, human_bytes(e["bytes"]), human_age(e["age_seconds"]) + " ago", made, ", ".join(names))
    console.stdout.print(table)


def print_prune(root: str, result: dict[str, Any]) -> None:
    """What ``packcli cache prune`` removed (or, with --dry-run, would remove), on stdout."""
    verb = "would remove" if result["dry_run"] else "removed"
    console.stdout.print(
        f"{root}: {verb} {len(result['removed'])} entries ({human_bytes(result['bytes_freed'])}); "
        f"{human_bytes(result['bytes_after'])} left"
        + (f"; {len(result['in_use'])} in use kept" if result["in_use"] else ""),
        soft_wrap=True,
    )
    for e in result["removed"]:
        console.stdout.print(f"  {e['key']}  {human_bytes(e['bytes'])}  last used {human_age(e['age_seconds'])} ago")
