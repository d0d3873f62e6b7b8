"""The library under the CLI: pack, stats, verify and inspect from Python, with typed results.

``packcli pack`` is one client of :func:`pack`; a notebook is another::

    import packcli
    result = packcli.pack([{"messages": [...]}, ...], max_len=2048, output="packed/")
    result.rows, result.fill, result.dataset()

Inputs are paths (files, directories, globs, saved datasets, Hub names), an in-memory
``datasets.Dataset``, or a list of records (dicts). In-memory inputs are written to a temporary folder
for the call and removed after it; the cache is keyed by contents, so a second call with the same
records is a cache hit. Errors are :class:`packcli.PackcliError` subclasses
whose messages name options by their Python names (``max_len``), not by their flags.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.contract import Progress
from packcli.errors import PackcliError, UsageError, reset_stop
from packcli.shard_formats import format_of, read_shard


@dataclass(frozen=True)
class PackResult:
    """What a pack run did: the figures of its summary, and where the shards are."""

    output: Path | None  # None for a dry run
    records_read: int
    packed: int
    dropped: dict[str, int]
    rows: int
    tokens: int
    trainable_tokens: int
    fill: float
    rows_over_l2: int
    warnings: list[str]
    summary: dict[str, Any] = field(repr=False)  # every key, as ``packcli pack --json`` prints them

    @property
    def shards(self) -> list[Path]:
        """Return the shard files, in row order."""
        if self.output is None:
            return []
        manifest = json.loads((self.output / "manifest.json").read_text(encoding="utf-8"))
        return [self.output / s["file"] for s in manifest["shards"]]

    def dataset(self) -> Any:
        """Return the shards as a ``datasets.Dataset`` (rows in order), ready for a Trainer."""
        from datasets import Dataset, concatenate_datasets

        if self.shards and format_of(self.shards[0]).name in ("mds", "megatron"):
            # Read back as packcli rows (in memory): the layouts of other trainers are not datasets' own.
            import pyarrow as pa
            from datasets.table import InMemoryTable

            return Dataset(InMemoryTable(pa.concat_tables([read_shard(p) for p in self.shards])))
        parts = [Dataset.from_parquet(str(p)) for p in self.shards if p.suffix == ".parquet"]
        if not parts:
            parts = [Dataset.from_file(str(p)) for p in self.shards]
        return concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def pack(
    inputs: str | os.PathLike[str] | Sequence[Any] | Any,
    max_len: int = 4096,
    output: str | os.PathLike[str] = "packed",
    *,
    fields: Mapping[str, str] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> PackResult:
    """Tokenize and pack ``inputs`` into shards under ``output``; return what was done.

    ``options`` are the other options of ``packcli pack`` by their Python names (``tokenizer``,
    ``chat_template``, ``format``, ``train_on``, ``overflow``, ``on_error``, ``seed``, ``world_size``,
    ``overwrite``, ``cache``, ``dry_run``...). ``fields`` renames only the fields it names.
    """
    from packcli.config import PackConfig
    from packcli.formats import DEFAULT_FIELDS

    _check_options(options)
    reset_stop()
    with _as_paths(inputs, _memory_root(options, cache_dir)) as paths, _api_terms():
        config = PackConfig(
            inputs=tuple(paths),
            max_len=max_len,
            output=str(output),
            fields={**DEFAULT_FIELDS, **(fields or {})},
            template_kwargs=dict(template_kwargs or {}),
            num_proc=num_proc or available_cores(),
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            **options,
        )
        return run(config)


def run(config: Any, progress: Progress | None = None) -> PackResult:
    """Run a pack from a complete ``PackConfig`` (what the command line builds); return what was done.

    Errors keep the core's wording (flags), for clients that speak flags; :func:`pack` renames them.
    """
    from packcli.pipeline import run_pack

    summary = run_pack(config, progress)
    return PackResult(
        output=None if config.dry_run else Path(config.output),
        records_read=summary["records_read"],
        packed=summary["packed"],
        dropped=dict(summary["dropped"]),
        rows=summary["rows"],
        tokens=summary["tokens"],
        trainable_tokens=summary["trainable_tokens"],
        fill=summary["fill"],
        rows_over_l2=summary["rows_over_l2"],
        warnings=list(summary.get("warnings", [])),
        summary=summary,
    )


def stats(
    inputs: str | os.PathLike[str] | Sequence[Any] | Any,
    max_len: int | Sequence[int] | None = None,
    *,
    batch_size: int = 8,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Return the statistics ``packcli stats --json`` prints: of a packed output, or of raw inputs.

    For raw inputs, ``max_len`` is one length or several; each is planned as ``pack`` would plan it.
    """
    from packcli.config import PackConfig
    from packcli.report.stats import is_packed_output, output_stats, raw_stats

    if isinstance(inputs, (str, os.PathLike)) and is_packed_output(Path(inputs)):
        with _api_terms():
            return output_stats(Path(inputs), batch_size)
    if max_len is None:
        raise UsageError("stats of raw inputs needs max_len (one length or several)")
    lens = [max_len] if isinstance(max_len, int) else list(max_len)
    _check_options(options)
    reset_stop()
    with _as_paths(inputs, _memory_root(options, cache_dir)) as paths, _api_terms():
        config = PackConfig(
            inputs=tuple(paths),
            max_len=max(lens),
            num_proc=num_proc or available_cores(),
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            dry_run=True,
            **options,
        )
        return raw_stats(config, lens, batch_size=batch_size)


def verify(directory: str | os.PathLike[str]) -> Any:
    """Check a packed output against its manifest and the output contract; return the report.

    The report's ``problems`` is empty when everything holds (``report.ok``).
    """
    from packcli.report.verify import verify_output

    with _api_terms():
        return verify_output(Path(directory))


def inspect_row(
    directory: str | os.PathLike[str],
    row: int | None = None,
    *,
    sample_index: int | None = None,
    tokenizer: str | None = None,
    max_tokens: int | None = None,
) -> Any:
    """Decode one packed row (by row number, or the row that holds ``sample_index``) into its samples.

    With ``max_tokens``, only the first ``max_tokens`` tokens of each sample are decoded into text.
    """
    from packcli.report.inspect import inspect_row as _inspect_row

    with _api_terms():
        return _inspect_row(
            Path(directory), row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens
        )


def _check_options(options: Mapping[str, Any]) -> None:
    from dataclasses import fields

    from packcli.config import PackConfig

    known = {f.name for f in fields(PackConfig)} - {"inputs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def available_cores() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# -- in-memory inputs ------------------------------------------------------------------------------


@contextmanager
def _as_paths(inputs: Any, cache_dir: str | os.PathLike[str] | None) -> Iterator[list[str]]:
    """Yield ``inputs`` as paths: in-memory records and datasets are written to a temporary folder for
    the call (removed after it); the cache is keyed by contents, so the same records hit it again."""
    if isinstance(inputs, (str, os.PathLike)):
        yield [os.fspath(inputs)]
        return
    if _is_dataset(inputs):
        with _memory_dir(cache_dir) as root:
            path = root / "dataset"
            inputs.save_to_disk(str(path))
            yield [str(path)]
        return
    items = list(inputs)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        yield [os.fspath(x) for x in items]
        return
    if not all(isinstance(x, Mapping) for x in items):
        raise UsageError("inputs must be a path, a list of paths, a datasets.Dataset or a list of records (dicts)")
    with _memory_dir(cache_dir) as root:
        path = root / "records.jsonl"
        with open(path, "wb") as fh:
            for x in items:
                fh.write((json.dumps(dict(x), ensure_ascii=False, default=str) + "\n").encode())
        yield [str(path)]


def _memory_root(options: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """Return where in-memory inputs are written for a call: beside the cache when it is on and filled
    (the disk the user chose for packcli's data), else the system's temporary directory."""
    if not options.get("cache", True) or options.get("dry_run", False):
        return None
    from packcli.cache import default_cache_dir

    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


@contextmanager
def _memory_dir(cache_dir: str | os.PathLike[str] | None) -> Iterator[Path]:
    """A temporary folder for one call's in-memory inputs; its name lets a later run remove it should
    this process be killed (``safety.clean_stale_cache_dirs``)."""
    from packcli.safety import owner_tag

    where = None
    if cache_dir is not None:
        where = Path(cache_dir)
        where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{owner_tag()}-inputs-", dir=where) as tmp:
        yield Path(tmp)


def _is_dataset(value: Any) -> bool:
    return type(value).__name__ == "Dataset" and hasattr(value, "save_to_disk")


# -- errors in API terms ---------------------------------------------------------------------------

_FLAG_RE = re.compile(r"(?<![\w-])--(no-)?([a-z][a-z0-9-]*)")
_NOT_OPTIONS = {"help"}
# A flag with its values ("--overflow split, truncate or drop"): the values become quoted strings.
_CHOICE_RE = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*) ([a-z_]+(?:(?:, | or )[a-z_]+)*)")
_OUTPUT_FLAG_RE = re.compile(r"(?<![\w-])-o\b")


def _choice_terms(match: re.Match[str]) -> str:
    from packcli.config import CHOICES

    name = match.group(1).replace("-", "_")
    words = re.split(r"(, | or )", match.group(2))
    allowed = CHOICES.get(name, ())
    n = 0  # how many of the words are values of the option ("--truncate-side left, or ...": one)
    while 2 * n < len(words) and words[2 * n] in allowed:
        n += 1
    if n == 0:
        return match.group(0)
    quoted = [f'"{w}"' if i % 2 == 0 else w for i, w in enumerate(words[: 2 * n - 1])]
    return f"{name}=" + "".join(quoted) + "".join(words[2 * n - 1 :])


@contextmanager
def _api_terms() -> Iterator[None]:
    """Re-raise packcli errors with option names (``max_len``) where the core names flags (``--max-len``)."""
    try:
        yield
    except PackcliError as exc:
        message = str(exc)
        renamed = _CHOICE_RE.sub(_choice_terms, message)
        renamed = _FLAG_RE.sub(
            lambda m: m.group(0) if m.group(2) in _NOT_OPTIONS else m.group(2).replace("-", "_"), renamed
        )
        renamed = _OUTPUT_FLAG_RE.sub("output", renamed)
        if renamed == message:
            raise
        raise type(exc)(renamed) from exc
