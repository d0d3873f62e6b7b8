"""``packcli pack``: flags (and a preset) in, one frozen config, the library call, the summary out."""

from __future__ import annotations

import dataclasses
from typing import Annotated

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
    given,
    merge_preset,
)
from packcli.config import PackConfig

# The options whose parameter here has their own name, passed on as given; the others of PackConfig come
# from --field, --template-kwarg, --num-proc and --no-cache (merge_preset).
_AS_GIVEN = tuple(
    f.name
    for f in dataclasses.fields(PackConfig)
    if f.name not in ("inputs", "fields", "template_kwargs", "num_proc", "cache")
)

# Options that only some --overflow modes read: given with another mode, they would do nothing.
_OVERFLOW_ONLY = {"truncate_side": ("truncate", "split"), "split_system": ("split",), "min_piece": ("split",)}


def pack(
    ctx: typer.Context,
    inputs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="INPUTS",
            help="Files (.jsonl .json .csv, also .gz .zst .bz2 .xz; .parquet .arrow), directories, globs, "
            "saved datasets, Hub names, or - for JSON lines on stdin.",
            show_default=False,
        ),
    ] = None,
    max_len: Annotated[int, typer.Option("--max-len", help="Tokens per packed row.")] = 4096,
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory.")] = "packed",
    tokenizer: TokenizerOption = None,
    chat_template: ChatTemplateOption = None,
    processor: ProcessorOption = None,
    embed_images: Annotated[
        bool, typer.Option("--embed-images", help="With --processor: write each image's bytes into the rows.")
    ] = False,
    config: ConfigOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
    format: FormatOption = "auto",
    task: TaskOption = "auto",
    field: FieldOption = None,
    train_on: TrainOnOption = "auto",
    template_kwarg: TemplateKwargOption = None,
    add_eos: AddEosOption = True,
    overflow: Annotated[
        str,
        typer.Option(
            help="Samples longer than --max-len: drop, truncate, split (into whole pieces: turns, chunks) or error."
        ),
    ] = "drop",
    truncate_side: Annotated[
        str,
        typer.Option(
            "--truncate-side",
            help="What --overflow truncate (and split's one-exchange fallback) cuts: right (keep the head) or left "
            "(keep the end); auto: right for truncate, left for split, and preference records in their prompt, "
            "from the left.",
        ),
    ] = "auto",
    split_system: Annotated[
        str,
        typer.Option(
            "--split-system", help="With --overflow split: the system message heads all pieces or the first only."
        ),
    ] = "all",
    min_piece: Annotated[
        int, typer.Option("--min-piece", help="With --overflow split: leave out last text chunks under N tokens.")
    ] = 0,
    max_drop_fraction: Annotated[
        float | None,
        typer.Option(
            "--max-drop-fraction",
            help="Fail (exit 1, nothing written) when more than this fraction of records or tokens is lost.",
        ),
    ] = None,
    on_error: OnErrorOption = "fail",
    fix_turns: FixTurnsOption = False,
    expand_turns: ExpandTurnsOption = "off",
    prefix_tree: PrefixTreeOption = False,
    rejects: Annotated[
        str | None, typer.Option(help="Write every dropped record and its reason to this JSONL file.")
    ] = None,
    fix_turns_log: Annotated[
        str | None,
        typer.Option("--fix-turns-log", help="With --fix-turns: write each record it changed, and how, to this file."),
    ] = None,
    algorithm: Annotated[str, typer.Option(help="Packing: ffd (first-fit-decreasing) or bfd (best-fit).")] = "ffd",
    seed: Annotated[int, typer.Option(help="Seed of the row order (and of the records --mix samples).")] = 0,
    # --mix (packcli.plan.mix)
    mix: Annotated[
        list[str] | None,
        typer.Option(
            "--mix",
            help="A source and its weight: PATH=SHARE (of the output, by --mix-by) or PATH=Nx (N epochs); "
            "repeatable, instead of INPUTS.",
        ),
    ] = None,
    mix_by: Annotated[
        str, typer.Option("--mix-by", help="What --mix shares are shares of: tokens, trainable tokens or records.")
    ] = "tokens",
    mix_max_epochs: Annotated[
        float,
        typer.Option(
            "--mix-max-epochs",
            help="Refuse a --mix share that repeats its source more than this many times (an Nx source is as asked).",
        ),
    ] = 10.0,
    dedup: Annotated[
        str,
        typer.Option(
            "--dedup",
            help="exact: drop records whose normalised content repeats an earlier one (across inputs, first kept).",
        ),
    ] = "off",
    eval_fraction: Annotated[
        float | None,
        typer.Option(
            "--eval-fraction",
            help="Hold out this fraction of each source's records (seeded) and pack them into OUT/eval/.",
            show_default=False,
        ),
    ] = None,
    eval_records: Annotated[
        int | None,
        typer.Option(
            "--eval-records",
            help="Hold out N records (shared by the sources in proportion to their records) into OUT/eval/.",
            show_default=False,
        ),
    ] = None,
    world_size: Annotated[
        int, typer.Option("--world-size", help="Balance rows and tokens over N data-parallel ranks.")
    ] = 1,
    rank_remainder: Annotated[
        str, typer.Option("--rank-remainder", help="Rows left over by --world-size: drop or pad (repeat rows).")
    ] = "drop",
    rows_per_shard: Annotated[int, typer.Option("--rows-per-shard", help="Rows per shard file.")] = 2048,
    output_format: Annotated[
        str,
        typer.Option(
            "--output-format", help="parquet, arrow, mds (MosaicML streaming) or megatron (Megatron-Bridge packed SFT)."
        ),
    ] = "parquet",
    pad_to_max: Annotated[bool, typer.Option("--pad-to-max", help="Pad every row to --max-len.")] = False,
    pad_to_multiple_of: Annotated[
        int,
        typer.Option("--pad-to-multiple-of", help="Pad every sample to a multiple of N tokens (context parallelism)."),
    ] = 1,
    context_parallel: Annotated[
        int,
        typer.Option("--context-parallel", help="Context-parallel size CP: pad every sample to a multiple of 2 x CP."),
    ] = 1,
    tensor_parallel: Annotated[
        int,
        typer.Option(
            "--tensor-parallel", help="Tensor-parallel size TP with sequence parallelism: also a multiple of TP x CP."
        ),
    ] = 1,
    loss_weighting: Annotated[
        str,
        typer.Option(
            "--loss-weighting", help="token (every trained token alike), sample or sqrt: writes a loss_weights column."
        ),
    ] = "token",
    overwrite: Annotated[bool, typer.Option(help="Replace a previous packcli output in -o (nothing else).")] = False,
    num_proc: NumProcOption = None,
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
    cache_max_size: Annotated[
        str | None,
        typer.Option(
            "--cache-max-size",
            help="After the run, prune the least recently used cache entries down to this size (e.g. 10GB); "
            "never the entry this run used.",
            show_default="$PACKCLI_CACHE_MAX_SIZE, else no limit",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and print the summary; write nothing.")] = False,
    engine: Annotated[str, typer.Option(help="Where tokenizing and writing run: local or ray.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to connect to.", show_default="start a local one")
    ] = None,
    encoder: Annotated[
        str,
        typer.Option(
            help="Text encoder: auto (fastokens where a probe finds it exact, else tokenizers), tokenizers, "
            "or fast (fastokens, or an error saying why not); the tokens are the same. "
            "PACKCLI_ENCODER=tokenizers forces tokenizers."
        ),
    ] = "auto",
    json_out: JsonFlag = False,
    quiet: QuietFlag = False,
) -> None:
    """Tokenize records, pack them into rows of at most --max-len tokens, and write shards.

    Example: packcli pack data.jsonl --max-len 4096 -o out/
    """
    params = dict(locals())
    from packcli.errors import Opt, UsageError

    flags = {name: params[name] for name in _AS_GIVEN}
    flags["mix"] = tuple(mix or ())
    options = merge_preset(ctx, config, flags, field, template_kwarg, num_proc, no_cache)
    preset_inputs = options.pop("inputs", None)
    if options.get("mix"):  # --mix names the inputs
        preset_inputs = () if given(ctx, "mix") or inputs else preset_inputs
    if not inputs and not preset_inputs and not options.get("mix"):
        raise UsageError(
            "no input given; pass files, directories, globs or Hub names, or name inputs in a --config preset"
        )
    cfg = PackConfig(inputs=tuple(inputs) if inputs else (preset_inputs or ()), **options)
    for name, modes in _OVERFLOW_ONLY.items():
        if given(ctx, name) and cfg.overflow not in modes:
            raise UsageError(
                "applies to ",
                Opt("overflow", *modes),
                f" only (this run uses {cfg.overflow})",
                option=name,
                hint=("pass ", Opt("overflow", modes[0]), ", or leave ", Opt(name), " out"),
            )

    import packcli.cli.render as console

    with console.progress_bars(enabled=not quiet) as progress:
        summary = api.run(cfg, progress).summary
    for warning in summary.warnings:
        console.warning(warning)
    for skipped in summary.skipped_dirs or []:
        console.warning(f"{skipped}: skipped; a packcli output, staging directory or cache is never read as input")
    if json_out:
        console.emit_json(summary.to_dict())
    if not quiet:
        console.print_pack_summary(summary)
