"""What a value is, in the words of the messages: its type checked, and described when it is refused."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from packcli.errors import Opt, Part, UsageError, too_many_digits

# What each declared type of an option must be, in words.
EXPECTED = {
    "bool": "true or false (a boolean)",
    "int": "an integer",
    "str": "a string",
    "str | None": "a string",
    "int | None": "an integer",
    "float": "a number",
    "float | None": "a number",
    "dict[str, str]": "a table of name = field strings",
    "dict[str, Any]": "a table of name = value",
    "tuple[str, ...]": "a list of paths",
}


def number(value: float) -> str:
    """A number as the messages show it: its digits, or the words for one past Python's digit limit."""
    try:
        return str(value)
    except ValueError:
        return too_many_digits()


def has_type(declared: str, value: Any) -> bool:
    if value is None and declared.endswith("| None"):
        return True
    base = declared.removesuffix(" | None")
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "tuple[str, ...]":
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    if base == "dict[str, Any]":
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    # dict[str, str]: the field renames
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def did_you_mean(unknown: Iterable[str], known: Iterable[str]) -> str:
    """Return `` (did you mean max_len?)`` for the unknown names close to a known one, else ``""``."""
    known = list(known)
    guesses = [f"{u} -> {m[0]}" for u in sorted(unknown) if (m := difflib.get_close_matches(u, known, n=1))]
    if not guesses:
        return ""
    if len(guesses) == 1:
        return f" (did you mean {guesses[0].split(' -> ')[1]}?)"
    return f" (did you mean {', '.join(guesses)}?)"


def describe_value(value: Any) -> str:
    """How a value reads, for error messages: 'the string "false"', 'the number 2048.5'..."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"the string {json.dumps(shown)}"
    if isinstance(value, int | float):
        return f"the number {number(value)}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return "null" if value is None else f"a value of type {type(value).__name__}"


EVAL_OPTIONS = ("eval_fraction", "eval_records")  # the eval split's (in the manifest's options only when given)


def check_eval(fraction: float | None, records: int | None, task: str, engine: str) -> None:
    """Refuse --eval-fraction / --eval-records that do not go together, with each other or with the run."""
    problem: tuple[Part, ...] | None = None
    if fraction is not None and records is not None:
        problem = (Opt("eval_fraction"), " and ", Opt("eval_records"), " both given; pass one of them")
    elif fraction is not None and not 0 < fraction < 1:
        problem = (Opt("eval_fraction"), f" must be above 0 and below 1, not {number(fraction)}")
    elif (fraction is not None or records is not None) and task in ("preference", "kto"):
        problem = (
            Opt("eval_fraction"),
            " and ",
            Opt("eval_records"),
            " apply to SFT records; preference and KTO records not yet",
        )
    elif (fraction is not None or records is not None) and engine != "local":
        problem = (
            Opt("eval_fraction"),
            " and ",
            Opt("eval_records"),
            " run with ",
            Opt("engine", "local"),
            " only; leave out ",
            Opt("engine", "ray"),
        )
    if problem:
        raise UsageError(*problem)


MIX_SUM_TOLERANCE = 1e-6


def parse_mix(value: str) -> tuple[str, str, float]:
    """Parse one ``--mix PATH=SHARE`` or ``--mix PATH=Nx``; return (path, "share" or "epochs", number).

    The last ``=`` splits: a path may hold one. A share is above 0 and at most 1; epochs above 0.
    """
    path, sep, raw = value.rpartition("=")
    raw = raw.strip()
    epochs = raw.lower().endswith("x")
    try:
        number = float(raw[:-1] if epochs else raw)
    except ValueError:
        number = math.nan
    if not sep or not path or not math.isfinite(number):
        raise UsageError(
            f"takes PATH=SHARE (e.g. chat.jsonl=0.7) or PATH=Nx (e.g. code/=2x), not '{value}'", option="mix"
        )
    if epochs and number <= 0:
        raise UsageError(Opt("mix"), f" {value}: the epochs must be above 0 (e.g. 0.5x, 2x)")
    if not epochs and not 0 < number <= 1:
        raise UsageError(Opt("mix"), f" {value}: the share must be above 0 and at most 1 (e.g. 0.7)")
    return path, "epochs" if epochs else "share", number


# The ranges and kinds of values the rule of every option (packcli.config.option_problem) checks.
TOP = 1 << 30
# The range of each numeric option: (lowest, highest); None: no bound that side.
RANGES: dict[str, tuple[float, float | None]] = {
    "max_len": (2, TOP),
    "rows_per_shard": (1, TOP),
    "world_size": (1, TOP),
    "num_proc": (1, TOP),
    "pad_to_multiple_of": (1, TOP),
    "context_parallel": (1, TOP),
    "tensor_parallel": (1, TOP),
    "min_piece": (0, TOP),
    "seed": (0, None),  # refused, not wrapped
    "limit": (1, 1 << 62),
    "max_drop_fraction": (0, 1),
    "mix_max_epochs": (1, None),
    "eval_records": (1, TOP),
    "batch_size": (1, TOP),
    "row": (0, None),
    "sample_index": (0, None),
    "max_tokens": (1, None),
    "reencode": (0, None),
}
# Options that name a path, a tokenizer, a split or an address: an empty string names nothing.
NOT_EMPTY = (
    "output",
    "tokenizer",
    "processor",
    "chat_template",
    "split",
    "rejects",
    "fix_turns_log",
    "cache_dir",
    "ray_address",
)
# Options of the library's calls that are not PackConfig's, by their declared type.
CALL_OPTIONS: dict[str, str] = {
    "batch_size": "int",
    "row": "int | None",
    "sample_index": "int | None",
    "max_tokens": "int | None",
    "reencode": "int",
}

# What --expand-turns cannot be used with: (option, value or "any" for any value given, why).
EXPAND_TURNS_CONFLICTS: tuple[tuple[str, Any, str], ...] = (
    ("overflow", "split", "a round is one sample, never split"),
    ("train_on", "all", "a round trains its own answers only"),
    ("task", "preference", "it expands SFT conversations"),
    ("task", "kto", "it expands SFT conversations"),
    ("engine", "ray", "the Ray engine does not expand yet"),
    ("processor", "any", "images are not expanded yet"),
)

# What --prefix-tree cannot be used with: (option, value or "more" for above 1, why).
PREFIX_TREE_CONFLICTS: tuple[tuple[str, Any, str], ...] = (
    ("pad_to_multiple_of", "more", "a tree's padding would be no node of it"),
    ("context_parallel", "more", "a tree's tokens cannot be dealt to ranks in order"),
    ("loss_weighting", "sample", "a tree holds several samples' trained tokens"),
    ("loss_weighting", "sqrt", "a tree holds several samples' trained tokens"),
    ("output_format", "mds", "its rows carry no tree columns"),
    ("output_format", "megatron", "its rows carry no tree columns"),
    ("overflow", "truncate", "a tree is never cut"),
)

# What --processor refuses, by (option, value, in words): images are not packed with them yet.
NOT_WITH_IMAGES: tuple[tuple[str, Any, Part], ...] = (
    ("engine", "ray", "the Ray engine"),
    ("task", "preference", "preference data"),
    ("task", "kto", "KTO data"),
    ("format", "preference", "preference data"),
    ("format", "kto", "KTO data"),
    ("dedup", "exact", Opt("dedup", "exact")),
    ("output_format", "mds", "MDS shards"),
    ("output_format", "megatron", "Megatron shards"),
)
