"""The choices of every choice option of a pack run, as Literal types (re-exported by ``packcli.config``)."""

from __future__ import annotations

from typing import Any, Literal, get_args

# The choices of every choice option, declared once as Literal types: type checkers read them in
# ``packcli.pack``'s signature, and CHOICES (the values the CLI, presets and the library accept) and the
# help's metavars come from them.
RecordFormat = Literal[
    "auto", "messages", "conversations", "prompt_completion", "alpaca", "text", "tokenized", "preference", "kto"
]
Task = Literal["auto", "sft", "preference", "kto"]
TrainOn = Literal["auto", "all", "assistant", "last_assistant", "completion"]
Overflow = Literal["drop", "truncate", "split", "error"]
TruncateSide = Literal["auto", "right", "left"]  # auto: see PackConfig.cut_side; a pair's prompt from the left
SplitSystem = Literal["all", "first"]
OnError = Literal["fail", "skip"]
OutputFormat = Literal["parquet", "arrow", "mds", "megatron"]
Algorithm = Literal["ffd", "bfd"]
RankRemainder = Literal["drop", "pad"]
Balance = Literal["tokens", "compute"]  # --balance: what the rows of a --world-size step have alike
EngineName = Literal["local", "ray"]
LossWeighting = Literal["token", "sample", "sqrt"]
MixBy = Literal["tokens", "trainable", "records"]  # --mix: what a share is a share of
Dedup = Literal["off", "exact"]  # --dedup exact: records whose normalised content repeats are dropped
# --encoder: the fast exact encoder where it is exact (auto), the reference only, or the fast one or an error
EncoderMode = Literal["auto", "tokenizers", "fast"]
ExpandTurns = Literal[
    "off", "reasoning", "all"
]  # --expand-turns: one sample per round (packcli.tokenize.templates.rounds)

CHOICE_TYPES: dict[str, Any] = {
    "format": RecordFormat,
    "task": Task,
    "train_on": TrainOn,
    "overflow": Overflow,
    "truncate_side": TruncateSide,
    "split_system": SplitSystem,
    "on_error": OnError,
    "output_format": OutputFormat,
    "algorithm": Algorithm,
    "rank_remainder": RankRemainder,
    "balance": Balance,
    "engine": EngineName,
    "loss_weighting": LossWeighting,
    "mix_by": MixBy,
    "dedup": Dedup,
    "encoder": EncoderMode,
    "expand_turns": ExpandTurns,
}
CHOICES: dict[str, tuple[str, ...]] = {name: get_args(kind) for name, kind in CHOICE_TYPES.items()}
