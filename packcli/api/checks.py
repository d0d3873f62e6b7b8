"""The library's checks of its arguments, before any work: inputs, paths, option names and values."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from packcli.api.memory import is_dataset
from packcli.errors import UsageError

# Options that name a path: os.PathLike is as good as a string (the command line's are strings).
PATH_OPTIONS = ("output", "cache_dir", "rejects", "chat_template", "tokenizer", "fix_turns_log", "processor")


def path_strings(options: dict[str, Any]) -> dict[str, Any]:
    return {k: os.fspath(v) if k in PATH_OPTIONS and isinstance(v, os.PathLike) else v for k, v in options.items()}


def check_call_options(**values: Any) -> None:
    """Refuse a value of the library's own options (batch_size, row...) by the rules in packcli.config."""
    from packcli.config import option_problem

    for name, value in values.items():
        problem = option_problem(name, value)
        if problem:
            raise UsageError(problem, option=name)


def check_directory(directory: Any) -> None:
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise UsageError(f"directory must be a path (a string or os.PathLike), not {shown(directory)}")


def check_inputs(inputs: Any) -> None:
    """Refuse inputs that are none of a path, a list of paths, a datasets.Dataset or a list of records."""
    what = "inputs must be a path, a list of paths, a datasets.Dataset or a list of records (dicts)"
    if isinstance(inputs, (str, os.PathLike)):
        if not os.fspath(inputs):
            raise UsageError(f"{what}, not an empty string")
        return
    if is_dataset(inputs):
        return
    if isinstance(inputs, Mapping):
        raise UsageError(f"{what}, not one record (a table); put it in a list")
    if not isinstance(inputs, Sequence) or isinstance(inputs, (bytes, bytearray)):
        given = "None" if inputs is None else shown(inputs)  # Python's word, not JSON's null
        raise UsageError(f"{what}, not {given}")  # an iterator was made a list by listed
    if not inputs:
        raise UsageError(f"{what}, not an empty list")
    paths = all(isinstance(x, (str, os.PathLike)) for x in inputs)
    if not paths and not all(isinstance(x, Mapping) for x in inputs):
        bad = next(x for x in inputs if not isinstance(x, (str, os.PathLike, Mapping)))
        raise UsageError(f"{what}; item {list(inputs).index(bad)} is {shown(bad)}")
    if paths and not all(os.fspath(x) for x in inputs):
        raise UsageError(f"{what}; one of the paths is an empty string")


def listed(inputs: Any) -> Any:
    """An iterator or generator of records or paths as a list (it can be read once only); the rest as given."""
    if isinstance(inputs, (str, bytes, os.PathLike, Sequence, Mapping)) or is_dataset(inputs):
        return inputs
    return list(inputs) if isinstance(inputs, Iterable) else inputs


def max_lens(max_len: Any) -> list[int]:
    """``max_len`` of stats: one length or a list of them, each by the rule of pack's max_len."""
    from packcli.config import option_problem

    lens = [max_len] if isinstance(max_len, int) and not isinstance(max_len, bool) else max_len
    if not isinstance(lens, Sequence) or isinstance(lens, str) or not lens:
        raise UsageError(f"max_len must be an integer or a list of integers, not {shown(max_len)}")
    for value in lens:
        problem = option_problem("max_len", value)
        if problem:
            raise UsageError(problem, option="max_len")
    return list(dict.fromkeys(lens))


def shown(value: Any) -> str:
    from packcli.config import describe_value

    return describe_value(value)


def check_options(options: Mapping[str, Any]) -> None:
    from dataclasses import fields

    from packcli.config import PackConfig, did_you_mean

    known = {f.name for f in fields(PackConfig)} - {"inputs"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"unknown option(s) {', '.join(unknown)}{did_you_mean(unknown, known)}; known: {', '.join(sorted(known))}"
        )
