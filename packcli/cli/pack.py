"""``packcli pack``: flags (and a preset) in, one frozen config, the library call, the summary out."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from packcli import api
from packcli.cli.options import (
    AddEosOption,
    CacheDirOption,
    ChatTemplateOption,
    ConfigOption,
    ExpandTurnsOption,
    FieldOption,
    FixTurnsOption,
    FormatOption,
    JsonFlag,
    LimitOption,
    NoCacheOption,
    NumProcOption,
    OnErrorOption,
    PrefixTreeOption,
    ProcessorOption,
    QuietFlag,
    SplitOption,
    TaskOption,
    TemplateKwargOption,
    TokenizerOption,
    TrainOnOption,
    cli_term,
    given,
    merge_preset,
)
from packcli.config import PackConfig
from packcli.results import RunSummary

# The options whose parameter here has their own name, passed on as given; the others of PackConfig come
# from --field, --template-kwarg, --num-proc and --no-cache (merge_preset).
_AS_GIVEN = tuple(
    f.name
    for f in dataclasses.fields(PackConfig)
    if f.name not in ("inputs", "fields", "template_kwargs", "num_proc", "cache")
)

# Options that only some --overflow modes read: given with another mode, they would do nothing.
_OVERFLOW_ONLY = {"truncate_side": ("truncate", "split"), "split_system": ("split",), "min_piece": ("split",)}


# pack's own options (the shared ones are in options.py); their panels and metavars: PACK_PANELS.
InputsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="INPUTS",
        help="Files (.jsonl .json .csv, also .gz .zst .bz2 .xz; .parquet .arrow), directories, globs, "
        "saved datasets, Hub names, or - for JSON lines on stdin.",
        show_default=False,
    ),
]
MaxLenOption = Annotated[int, typer.Option("--max-len", help="Tokens per packed row.")]
OutputOption = Annotated[str, typer.Option("--output", "-o", help="Output directory.")]
EmbedImagesOption = Annotated[
    bool, typer.Option("--embed-images", help="With --processor: write each image's bytes into the rows.")
]
OverflowOption = Annotated[
    str,
    typer.Option(
        help="Samples longer than --max-len: drop, truncate, split (into whole pieces: turns, chunks) or error."
    ),
]
TruncateSideOption = Annotated[
    str,
    typer.Option(
        "--truncate-side",
        help="What --overflow truncate (and split's one-exchange fallback) cuts: right (keep the head) or left "
        "(keep the end); auto: right for truncate, left for split, and preference records in their prompt, "
        "from the left.",
    ),
]
SplitSystemOption = Annotated[
    str,
    typer.Option(
        "--split-system", help="With --overflow split: the system message heads all pieces or the first only."
    ),
]
MinPieceOption = Annotated[
    int, typer.Option("--min-piece", help="With --overflow split: leave out last text chunks under N tokens.")
]
MaxDropFractionOption = Annotated[
    float | None,
    typer.Option(
        "--max-drop-fraction",
        help="Fail (exit 1, nothing written) when more than this fraction of records or tokens is lost.",
    ),
]
RejectsOption = Annotated[
    str | None, typer.Option(help="Write every dropped record and its reason to this JSONL file.")
]
FixTurnsLogOption = Annotated[
    str | None,
    typer.Option("--fix-turns-log", help="With --fix-turns: write each record it changed, and how, to this file."),
]
AlgorithmOption = Annotated[str, typer.Option(help="Packing: ffd (first-fit-decreasing) or bfd (best-fit).")]
SeedOption = Annotated[int, typer.Option(help="Seed of the row order (and of the records --mix samples).")]
MixOption = Annotated[
    list[str] | None,
    typer.Option(
        "--mix",
        help="A source and its weight: PATH=SHARE (of the output, by --mix-by) or PATH=Nx (N epochs); "
        "repeatable, instead of INPUTS.",
    ),
]
MixByOption = Annotated[
    str, typer.Option("--mix-by", help="What --mix shares are shares of: tokens, trainable tokens or records.")
]
MixMaxEpochsOption = Annotated[
    float,
    typer.Option(
        "--mix-max-epochs",
        help="Refuse a --mix share that repeats its source more than this many times (an Nx source is as asked).",
    ),
]
DedupOption = Annotated[
    str,
    typer.Option(
        "--dedup",
        help="exact: drop records whose normalised content repeats an earlier one (across inputs, first kept).",
    ),
]
EvalFractionOption = Annotated[
    float | None,
    typer.Option(
        "--eval-fraction",
        help="Hold out this fraction of each source's records (seeded) and pack them into OUT/eval/.",
        show_default=False,
    ),
]
EvalRecordsOption = Annotated[
    int | None,
    typer.Option(
        "--eval-records",
        help="Hold out N records (shared by the sources in proportion to their records) into OUT/eval/.",
        show_default=False,
    ),
]
WorldSizeOption = Annotated[
    int, typer.Option("--world-size", help="Balance rows and tokens over N data-parallel ranks.")
]
RankRemainderOption = Annotated[
    str, typer.Option("--rank-remainder", help="Rows left over by --world-size: drop or pad (repeat rows).")
]
RowsPerShardOption = Annotated[int, typer.Option("--rows-per-shard", help="Rows per shard file.")]
OutputFormatOption = Annotated[
    str,
    typer.Option(
        "--output-format", help="parquet, arrow, mds (MosaicML streaming) or megatron (Megatron-Bridge packed SFT)."
    ),
]
PadToMaxOption = Annotated[bool, typer.Option("--pad-to-max", help="Pad every row to --max-len.")]
PadToMultipleOfOption = Annotated[
    int,
    typer.Option("--pad-to-multiple-of", help="Pad every sample to a multiple of N tokens (context parallelism)."),
]
ContextParallelOption = Annotated[
    int,
    typer.Option("--context-parallel", help="Context-parallel size CP: pad every sample to a multiple of 2 x CP."),
]
TensorParallelOption = Annotated[
    int,
    typer.Option(
        "--tensor-parallel", help="Tensor-parallel size TP with sequence parallelism: also a multiple of TP x CP."
    ),
]
LossWeightingOption = Annotated[
    str,
    typer.Option(
        "--loss-weighting", help="token (every trained token alike), sample or sqrt: writes a loss_weights column."
    ),
]
OverwriteOption = Annotated[bool, typer.Option(help="Replace a previous packcli output in -o (nothing else).")]
CacheMaxSizeOption = Annotated[
    str | None,
    typer.Option(
        "--cache-max-size",
        help="After the run, prune the least recently used cache entries down to this size (e.g. 10GB); "
        "never the entry this run used.",
        show_default="$PACKCLI_CACHE_MAX_SIZE, else no limit",
    ),
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Plan and print the summary; write nothing.")]
EngineOption = Annotated[str, typer.Option(help="Where tokenizing and writing run: local or ray.")]
RayAddressOption = Annotated[
    str | None, typer.Option("--ray-address", help="Ray cluster to connect to.", show_default="start a local one")
]
EncoderOption = Annotated[
    str,
    typer.Option(
        help="Text encoder: auto (fastokens where a probe finds it exact, else tokenizers), tokenizers, "
        "or fast (fastokens, or an error saying why not); the tokens are the same. "
        "PACKCLI_ENCODER=tokenizers forces tokenizers."
    ),
]


def pack(
    ctx: typer.Context,
    inputs: InputsArgument = None,
    max_len: MaxLenOption = 4096,
    output: OutputOption = "packed",
    tokenizer: TokenizerOption = None,
    chat_template: ChatTemplateOption = None,
    processor: ProcessorOption = None,
    embed_images: EmbedImagesOption = False,
    config: ConfigOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
    format: FormatOption = "auto",
    task: TaskOption = "auto",
    field: FieldOption = None,
    train_on: TrainOnOption = "auto",
    template_kwarg: TemplateKwargOption = None,
    add_eos: AddEosOption = True,
    overflow: OverflowOption = "drop",
    truncate_side: TruncateSideOption = "auto",
    split_system: SplitSystemOption = "all",
    min_piece: MinPieceOption = 0,
    max_drop_fraction: MaxDropFractionOption = None,
    on_error: OnErrorOption = "fail",
    fix_turns: FixTurnsOption = False,
    expand_turns: ExpandTurnsOption = "off",
    prefix_tree: PrefixTreeOption = False,
    rejects: RejectsOption = None,
    fix_turns_log: FixTurnsLogOption = None,
    algorithm: AlgorithmOption = "ffd",
    seed: SeedOption = 0,
    # --mix (packcli.plan.mix)
    mix: MixOption = None,
    mix_by: MixByOption = "tokens",
    mix_max_epochs: MixMaxEpochsOption = 10.0,
    dedup: DedupOption = "off",
    eval_fraction: EvalFractionOption = None,
    eval_records: EvalRecordsOption = None,
    world_size: WorldSizeOption = 1,
    rank_remainder: RankRemainderOption = "drop",
    rows_per_shard: RowsPerShardOption = 2048,
    output_format: OutputFormatOption = "parquet",
    pad_to_max: PadToMaxOption = False,
    pad_to_multiple_of: PadToMultipleOfOption = 1,
    context_parallel: ContextParallelOption = 1,
    tensor_parallel: TensorParallelOption = 1,
    loss_weighting: LossWeightingOption = "token",
    overwrite: OverwriteOption = False,
    num_proc: NumProcOption = None,
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
    cache_max_size: CacheMaxSizeOption = None,
    dry_run: DryRunOption = False,
    engine: EngineOption = "local",
    ray_address: RayAddressOption = None,
    encoder: EncoderOption = "auto",
    json_out: JsonFlag = False,
    quiet: QuietFlag = False,
) -> None:
    """Tokenize records, pack them into rows of at most --max-len tokens, and write shards.

    Example: packcli pack data.jsonl --max-len 4096 -o out/
    """
    params = dict(locals())
    cfg = _pack_config(ctx, params)
    import packcli.cli.render as console

    with console.progress_bars(enabled=not quiet) as progress:
        summary = api.run(cfg, progress).summary
    _show_summary(summary, json_out, quiet)


def _pack_config(ctx: typer.Context, params: dict[str, Any]) -> PackConfig:
    """Return the run's config: the flags (``params``, by parameter name) over a --config preset, checked."""
    from packcli.errors import UsageError

    flags = {name: params[name] for name in _AS_GIVEN}
    flags["mix"] = tuple(params["mix"] or ())
    options = merge_preset(
        ctx, params["config"], flags, params["field"], params["template_kwarg"], params["num_proc"], params["no_cache"]
    )
    inputs = params["inputs"]
    preset_inputs = options.pop("inputs", None)
    if options.get("mix"):  # --mix names the inputs
        preset_inputs = () if given(ctx, "mix") or inputs else preset_inputs
    if not inputs and not preset_inputs and not options.get("mix"):
        raise UsageError(
            "no input given; pass files, directories, globs or Hub names, or name inputs in a --config preset"
        )
    cfg = PackConfig(inputs=tuple(inputs) if inputs else (preset_inputs or ()), **options)
    _check_overflow_options(ctx, cfg)
    return cfg


def _check_overflow_options(ctx: typer.Context, cfg: PackConfig) -> None:
    """Refuse an option given that this run's --overflow mode does not read."""
    from packcli.errors import Opt, UsageError

    for name, modes in _OVERFLOW_ONLY.items():
        if given(ctx, name) and cfg.overflow not in modes:
            raise UsageError(
                "applies to ",
                Opt("overflow", *modes),
                f" only (this run uses {cfg.overflow})",
                option=name,
                hint=("pass ", Opt("overflow", modes[0]), ", or leave ", Opt(name), " out"),
            )


def _show_summary(summary: RunSummary, json_out: bool, quiet: bool) -> None:
    """Print the run's warnings (stderr), then its summary: JSON with --json, the table unless --quiet."""
    import packcli.cli.render as console

    for warning in summary.warnings:
        console.warning(warning.render(cli_term))
    for skipped in summary.skipped_dirs or []:
        console.warning(f"{skipped}: skipped; a packcli output, staging directory or cache is never read as input")
    if json_out:
        console.emit_json(summary.to_dict(cli_term))
    if not quiet:
        console.print_pack_summary(summary)
