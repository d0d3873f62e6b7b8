"""The frozen options of a pack run, and presets loaded from config files (TOML, YAML or JSON).

A config file holds the same names as the ``pack`` flags (``max_len``, ``train_on``, ...) plus a
``[fields]`` table that renames record fields, and may name its ``inputs`` (paths relative to the
file). Flags given on the command line override the file; inputs given on the command line replace
the preset's.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from packcli.errors import UsageError, too_many_digits
from packcli.records.formats import DEFAULT_FIELDS, FORMATS, RESERVED_TEMPLATE_KWARGS

CHOICES: dict[str, tuple[str, ...]] = {
    "format": ("auto", *FORMATS),
    "task": ("auto", "sft", "preference", "kto"),
    "train_on": ("auto", "all", "assistant", "last_assistant", "completion"),
    "overflow": ("drop", "truncate", "split", "error"),
    "truncate_side": ("auto", "right", "left"),  # auto: see PackConfig.cut_side; a pair's prompt from the left
    "split_system": ("all", "first"),
    "on_error": ("fail", "skip"),
    "output_format": ("parquet", "arrow", "mds", "megatron"),
    "algorithm": ("ffd", "bfd"),
    "rank_remainder": ("drop", "pad"),
    "engine": ("local", "ray"),
    "loss_weighting": ("token", "sample", "sqrt"),
    "mix_by": ("tokens", "trainable", "records"),  # --mix: what a share is a share of
    "dedup": ("off", "exact"),  # --dedup exact: records whose normalised content repeats are dropped
}

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
    output: str = "packed"
    max_len: int = 4096
    tokenizer: str | None = None
    chat_template: str | None = None
    split: str | None = None
    limit: int | None = None
    format: str = "auto"
    task: str = "auto"  # what the records train (sft, preference, kto); auto: from their format
    fields: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_FIELDS))
    train_on: str = "auto"
    add_eos: bool = True
    overflow: str = "drop"
    truncate_side: str = "auto"  # auto: right for --overflow truncate, left for split's fallback (cut_side)
    split_system: str = "all"
    min_piece: int = 0
    max_drop_fraction: float | None = None
    on_error: str = "fail"
    algorithm: str = "ffd"
    seed: int = 0
    world_size: int = 1
    rank_remainder: str = "drop"
    rows_per_shard: int = 2048
    output_format: str = "parquet"
    pad_to_max: bool = False
    pad_to_multiple_of: int = 1
    context_parallel: int = 1
    tensor_parallel: int = 1
    loss_weighting: str = "token"
    overwrite: bool = False
    num_proc: int = 1
    cache: bool = True
    cache_dir: str | None = None
    cache_max_size: str | None = None  # e.g. "10GB": after the run, least recently used entries are pruned
    rejects: str | None = None
    fix_turns: bool = False  # clean conversations (packcli.records.turns) before they are rendered
    fix_turns_log: str | None = None  # JSON lines: each record --fix-turns changed, and how
    dry_run: bool = False
    engine: str = "local"
    ray_address: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # -- mixtures (packcli.plan.mix): PATH=SHARE or PATH=Nx per source; the inputs are their paths
    mix: tuple[str, ...] = ()
    mix_by: str = "tokens"
    dedup: str = "off"  # packcli.plan.dedup

    def __post_init__(self) -> None:
        # Each option on its own first (type, choices, range: the rule presets and the library apply
        # too), then the rules between options.
        for f in fields(self):
            problem = option_problem(f.name, getattr(self, f.name))
            if problem:
                raise UsageError(f"{flag(f.name)} {problem}")
        # Fields not named keep their default names, for callers that rename only some (the library).
        object.__setattr__(self, "fields", {**DEFAULT_FIELDS, **self.fields})
        object.__setattr__(self, "template_kwargs", dict(self.template_kwargs))
        self._check_template_kwargs()
        self._check_mix()
        if self.min_piece > self.max_len:
            raise UsageError(f"--min-piece must be between 0 and --max-len {self.max_len}, not {self.min_piece}")
        if self.pad_to_max and self.max_len > PAD_TO_MAX_LIMIT:
            gib = self.max_len * PADDED_ROW_BYTES_PER_TOKEN / (1 << 30)
            raise UsageError(
                f"--max-len {self.max_len} with --pad-to-max: every row would be {self.max_len} tokens, about "
                f"{gib:.0f} GiB of memory to build; with --pad-to-max, --max-len must be at most {PAD_TO_MAX_LIMIT}"
            )
        self._check_padding()
        if self.fix_turns_log is not None and not self.fix_turns:
            raise UsageError("--fix-turns-log lists what --fix-turns changes; pass --fix-turns too")
        if self.cache_max_size is not None:
            from packcli.store.cachedir import parse_size

            parse_size(self.cache_max_size, "--cache-max-size")
        unknown = set(self.fields) - set(DEFAULT_FIELDS)
        if unknown:
            raise UsageError(
                f"unknown field name(s) {', '.join(sorted(unknown))}{did_you_mean(unknown, DEFAULT_FIELDS)}; "
                f"known: {', '.join(DEFAULT_FIELDS)}"
            )

    def _check_template_kwargs(self) -> None:
        for name, value in self.template_kwargs.items():
            if name in RESERVED_TEMPLATE_KWARGS:
                raise UsageError(f"template keyword argument '{name}' {RESERVED_TEMPLATE_KWARGS[name]}")
            try:  # the manifest and the cache key are strict JSON: no NaN or Infinity in them
                json.dumps(value, allow_nan=False)
            except ValueError as exc:
                raise UsageError(
                    f"template keyword argument '{name}' holds a number JSON cannot write ({value}); "
                    "give a finite number, or quote the value to pass it as a string"
                ) from exc
            except TypeError as exc:  # from the library: a value no JSON holds (a set, an object)
                raise UsageError(
                    f"template keyword argument '{name}' holds {describe_value(value)}, which JSON cannot write; "
                    "give strings, numbers, booleans, null, lists and tables"
                ) from exc

    def _check_mix(self) -> None:
        """--mix: each PATH=SHARE or PATH=Nx well formed, the shares summing right; the inputs are its paths."""
        if not self.mix:
            return
        specs = [parse_mix(value) for value in self.mix]
        paths = tuple(path for path, _, _ in specs)
        if not self.inputs:
            object.__setattr__(self, "inputs", paths)
        elif self.inputs != paths:
            raise UsageError("--mix names the inputs: pass them with --mix PATH=SHARE only, not also as inputs")
        if len(set(paths)) != len(paths):
            raise UsageError("--mix names an input twice; give each PATH once")
        shares = sum(value for _, kind, value in specs if kind == "share")
        epochs = any(kind == "epochs" for _, kind, _ in specs)
        if epochs and any(kind == "share" for _, kind, _ in specs) and shares >= 1 - MIX_SUM_TOLERANCE:
            raise UsageError(
                f"--mix shares sum to {shares:g} beside Nx sources; with Nx sources the shares must sum to less "
                "than 1 (the Nx sources fill the rest)"
            )
        if not epochs and abs(shares - 1) > MIX_SUM_TOLERANCE:
            raise UsageError(f"--mix shares sum to {shares:g}; they must sum to 1 (or give a source as Nx)")
        if self.task in ("preference", "kto"):
            raise UsageError("--mix applies to SFT records; preference and KTO records are not mixed yet")
        if self.engine != "local":
            raise UsageError("--mix runs with --engine local only; leave out --engine ray")

    def _check_padding(self) -> None:
        if self.pad_multiple > 1 and self.sample_limit < 1:
            raise UsageError(
                f"--max-len {self.max_len} is too short for samples padded to a multiple of {self.pad_multiple}; "
                "raise --max-len"
            )
        if self.pad_to_max and self.max_len % self.pad_multiple:
            raise UsageError(
                f"--pad-to-max with samples padded to a multiple of {self.pad_multiple}: the row's padding would "
                f"not be a multiple of it; make --max-len ({self.max_len}) a multiple of {self.pad_multiple}"
            )
        if self.output_format == "megatron" and self.pad_to_max:
            raise UsageError(
                "--pad-to-max does not apply to --output-format megatron: its collate function pads rows itself "
                "(pad_to_max_length); drop --pad-to-max"
            )
        if self.output_format == "megatron" and self.loss_weighting != "token":
            raise UsageError(
                f"--loss-weighting {self.loss_weighting} does not apply to --output-format megatron: its dataset "
                "reads only loss_mask; write parquet, arrow or mds for loss weights"
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

    def options(self) -> dict[str, Any]:
        """Return the options as plain JSON values, for the manifest."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"inputs": list(self.inputs)}

    def group(self, concern: str) -> dict[str, Any]:
        """Return the options of one concern (see ``OPTION_GROUPS``) by name."""
        return {name: getattr(self, name) for name in OPTION_GROUPS[concern]}


# Every option of PackConfig belongs to exactly one concern. Only "tokenization" decides a sample's
# tokens and labels, so only it (with the inputs' contents) keys the tokenization cache.
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("inputs", "split", "limit", "format", "task", "fields"),
    "tokenization": (
        "tokenizer",
        "chat_template",
        "template_kwargs",
        "train_on",
        "add_eos",
        "on_error",
        "fix_turns",
    ),
    "packing": (
        "mix",
        "mix_by",
        "dedup",
        "max_len",
        "overflow",
        "truncate_side",
        "split_system",
        "min_piece",
        "max_drop_fraction",
        "algorithm",
        "seed",
        "world_size",
        "rank_remainder",
        "pad_to_max",
        "pad_to_multiple_of",
        "context_parallel",
        "tensor_parallel",
    ),
    "output": (
        "output",
        "output_format",
        "rows_per_shard",
        "overwrite",
        "rejects",
        "fix_turns_log",
        "dry_run",
        "loss_weighting",
    ),
    "run": ("num_proc", "cache", "cache_dir", "cache_max_size", "engine", "ray_address"),
}


# A preset holds options, not data: what it may be, so that reading one is instant whatever the file.
MAX_PRESET_BYTES = 1 << 20
MAX_PRESET_DEPTH = 32  # tables and lists within each other (a template keyword's value may nest a few)


class _PresetLimit(Exception):
    """A preset past a limit of this module (its words, for the one line the user reads)."""


def load_config_file(path: str) -> dict[str, Any]:
    """Read a preset (.toml, .yaml/.yml or .json); return its options with field renames merged over the defaults.

    ``inputs`` (a path or a list of them) and ``output`` are returned relative to the current
    directory: a preset's paths are relative to the preset file. A preset is at most
    ``MAX_PRESET_BYTES`` and ``MAX_PRESET_DEPTH`` levels deep, and YAML aliases (``*name``) are
    refused: their expansion ("billion laughs") would make a 1 KB file gigabytes.
    """
    import yaml

    p = Path(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_PRESET_BYTES + 1)
        if len(raw) > MAX_PRESET_BYTES:
            raise _PresetLimit(f"is larger than {MAX_PRESET_BYTES >> 20} MiB; a preset holds options, not data")
        text = raw.decode("utf-8")
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = yaml.load(text, Loader=_preset_yaml_loader())  # a SafeLoader, aliases refused
            data = {} if data is None else data
        else:
            data = tomllib.loads(text)
        _check_depth(data)
    except FileNotFoundError as exc:
        raise UsageError(f"{path}: no such config file; check the --config path") from exc
    except _PresetLimit as exc:
        raise UsageError(f"{path}: {exc}; fix the preset") from exc
    except RecursionError as exc:
        raise UsageError(f"{path}: nested more than {MAX_PRESET_DEPTH} levels deep; fix the preset") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not a valid YAML file ({' '.join(str(exc).split())}); fix it") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(f"{path}: not a valid config file ({exc}); fix it") from exc
    except ValueError as exc:  # the parsers' only other one: an integer past Python's digit limit
        raise UsageError(f"{path}: holds {too_many_digits()}; fix the preset") from exc
    if not isinstance(data, dict):
        raise UsageError(
            f"{path}: a preset must be an object of option = value, not {describe_value(data)}; fix the file"
        )
    known = {f.name for f in fields(PackConfig)}
    data = {str(k).replace("-", "_"): v for k, v in data.items() if k != "description"}
    if "sources" in data or "mix" in data:  # -- mixtures: a preset's sources, as --mix PATH=SHARE values
        data["mix"] = _preset_sources(path, data.pop("sources", None), data.get("mix"))
    unknown = set(data) - known
    if unknown:
        raise UsageError(
            f"{path}: unknown option(s) {', '.join(sorted(unknown))}{did_you_mean(unknown, known)}; "
            "see packcli pack --help"
        )
    if "inputs" in data:
        data["inputs"] = _preset_inputs(path, data["inputs"])
    for key, value in data.items():
        if key != "inputs":
            _check_type(path, key, value)
    if "output" in data:
        data["output"] = _beside_preset(path, data["output"])
    if "fields" in data:
        data["fields"] = {**DEFAULT_FIELDS, **data["fields"]}
    return data


def _preset_yaml_loader() -> type:
    """Return YAML's safe loader with aliases refused and nesting bounded (see ``load_config_file``)."""
    import yaml

    class PresetLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _PresetLimit(
                    f"line {event.start_mark.line + 1}: YAML alias *{event.anchor}; a preset takes no aliases "
                    "(its values are written out in full)"
                )
            self.depth += 1
            if self.depth > MAX_PRESET_DEPTH:
                raise _PresetLimit(f"nested more than {MAX_PRESET_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return PresetLoader


def _check_depth(data: Any) -> None:
    """Raise _PresetLimit when tables and lists nest more than MAX_PRESET_DEPTH levels (without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_PRESET_DEPTH:
                raise _PresetLimit(f"nested more than {MAX_PRESET_DEPTH} levels deep")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


def _beside_preset(path: str, output: str) -> str:
    """A preset's output directory, relative to the preset's directory as its inputs are (URIs as written)."""
    if "://" in output or Path(output).is_absolute():
        return output
    return str(Path(path).parent / output)


def _preset_inputs(path: str, value: Any) -> tuple[str, ...]:
    """A preset's inputs (a string or a list of strings), each relative to the preset's directory."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise UsageError(
            f"{path}: 'inputs' must be a path or a list of paths, not {describe_value(value)}; fix the preset"
        )
    base = Path(path).parent
    out = []
    for item in items:
        # stdin, absolute paths and Hub names (owner/name, not a path beside the preset) stay as written.
        hub = item.count("/") == 1 and not item.startswith((".", "~")) and not Path(item).suffix
        hub = hub and not (base / item).exists()
        out.append(item if item == "-" or Path(item).is_absolute() or hub else str(base / item))
    return tuple(out)


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
        raise UsageError(f"--mix takes PATH=SHARE (e.g. chat.jsonl=0.7) or PATH=Nx (e.g. code/=2x), not '{value}'")
    if epochs and number <= 0:
        raise UsageError(f"--mix {value}: the epochs must be above 0 (e.g. 0.5x, 2x)")
    if not epochs and not 0 < number <= 1:
        raise UsageError(f"--mix {value}: the share must be above 0 and at most 1 (e.g. 0.7)")
    return path, "epochs" if epochs else "share", number


def _preset_sources(path: str, sources: Any, mix: Any) -> tuple[str, ...]:
    """A preset's ``sources`` list (``{path, share}`` or ``{path, epochs}`` tables) or ``mix`` list, as
    ``--mix`` values with each path relative to the preset's directory."""
    if sources is not None and mix is not None:
        raise UsageError(f"{path}: give 'sources' or 'mix', not both; fix the preset")
    if mix is not None:
        if not isinstance(mix, list) or not all(isinstance(v, str) for v in mix):
            raise UsageError(f"{path}: 'mix' must be a list of PATH=SHARE strings, not {describe_value(mix)}")
        entries = [(parse_mix(v)[0], v.rpartition("=")[2]) for v in mix]
    else:
        good = isinstance(sources, list) and bool(sources) and all(_source_entry(s) for s in sources)
        if not good:
            raise UsageError(
                f"{path}: 'sources' must be a list of tables each with a path and a share or epochs "
                "(e.g. {path: chat.jsonl, share: 0.7}); fix the preset"
            )
        entries = [(s["path"], f"{s['share']!r}" if "share" in s else f"{s['epochs']!r}x") for s in sources]
    paths = _preset_inputs(path, [p for p, _ in entries])
    return tuple(f"{p}={w}" for p, (_, w) in zip(paths, entries, strict=True))


def _source_entry(entry: Any) -> bool:
    """Whether a preset ``sources`` entry is a table of a path and a number, its share or its epochs."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return False
    weights = set(entry) - {"path"}
    return len(weights) == 1 and weights <= {"share", "epochs"} and _has_type("float", entry[weights.pop()])


def parse_template_kwargs(values: list[str]) -> dict[str, Any]:
    """Parse ``--template-kwarg KEY=VALUE`` flags; VALUE is JSON (``false``, ``"high"``) or else a string."""
    out: dict[str, Any] = {}
    for value in values:
        name, sep, raw = value.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--template-kwarg takes KEY=VALUE (e.g. enable_thinking=false), not '{value}'")
        try:
            out[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[name.strip()] = raw
        except ValueError as exc:  # an integer past Python's digit limit
            raise UsageError(
                f"--template-kwarg {name.strip()}: the value is {too_many_digits()}; quote it to pass it as a string"
            ) from exc
    return out


# -- the rule of every option, declared once ------------------------------------------------------
# PackConfig checks its fields with it, presets their values, the library the options of its calls
# (stats' batch_size, inspect_row's row...), so that the command line, a preset and a Python call
# refuse the same values in the same words (only the name differs: --max-len, 'max_len', max_len).

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
    "batch_size": (1, TOP),
    "row": (0, None),
    "sample_index": (0, None),
    "max_tokens": (1, None),
}
# Options that name a path, a tokenizer, a split or an address: an empty string names nothing.
NOT_EMPTY = ("output", "tokenizer", "chat_template", "split", "rejects", "fix_turns_log", "cache_dir", "ray_address")
# Options of the library's calls that are not PackConfig's, by their declared type.
CALL_OPTIONS: dict[str, str] = {
    "batch_size": "int",
    "row": "int | None",
    "sample_index": "int | None",
    "max_tokens": "int | None",
}
_EXPECTED = {
    "bool": "true or false (a boolean)",
    "int": "an integer",
    "str": "a string",
    "str | None": "a string",
    "int | None": "an integer",
    "float | None": "a number",
    "dict[str, str]": "a table of name = field strings",
    "dict[str, Any]": "a table of name = value",
    "tuple[str, ...]": "a list of paths",
}


def declared_type(name: str) -> str:
    """Return the declared type of option ``name`` as written in PackConfig (``int | None``...)."""
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
    if not _has_type(declared, value):
        return f"must be {_EXPECTED[declared]}, not {describe_value(value)}"
    if name in NOT_EMPTY and value == "":
        return "must not be an empty string"
    if name in CHOICES and value not in CHOICES[name]:
        return f"must be one of {', '.join(CHOICES[name])}, not '{value}'"
    if name in RANGES and value is not None:
        low, high = RANGES[name]
        if high is None and value < low:
            return f"must be at least {low}, not {_number(value)}"
        if high is not None and not low <= value <= high:  # NaN is in no range
            return f"must be between {low} and {high}, not {_number(value)}"
    return None


def _number(value: float) -> str:
    """A number as the messages show it: its digits, or the words for one past Python's digit limit."""
    try:
        return str(value)
    except ValueError:
        return too_many_digits()


def _has_type(declared: str, value: Any) -> bool:
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
        return f"the number {_number(value)}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return "null" if value is None else f"a value of type {type(value).__name__}"


def _check_type(path: str, key: str, value: Any) -> None:
    """Refuse a preset value of the wrong type or out of range: a string "false" is not false.

    Flags are typed by their parser; preset values are checked with the same rule as PackConfig's, so
    a preset cannot turn on --overwrite or the cache by spelling false as a string.
    """
    problem = option_problem(key, value)
    if problem:
        raise UsageError(f"{path}: '{key}' {problem}; fix the preset")


# A hint of an error or a warning: (option, value) it would set, or None for a step that is no option,
# and its words. ``suggest`` leaves out those that set what the run already has.
Hint = tuple[tuple[str, Any] | None, str]


def suggest(config: PackConfig, hints: Iterable[Hint]) -> str:
    """Join the hints (``A, or B``) that would change something: a suggestion never names what was passed."""
    kept = [words for setting, words in hints if setting is None or getattr(config, setting[0]) != setting[1]]
    return ", or ".join(kept)


def flag(name: str) -> str:
    """Return the flag of an option name: ``max_len`` -> ``--max-len``."""
    return "--" + name.replace("_", "-")


def parse_field_flags(values: list[str]) -> dict[str, str]:
    """Parse ``--field NAME=FIELD`` flags."""
    out = {}
    for value in values:
        name, sep, target = value.partition("=")
        if not sep or not name or not target:
            raise UsageError(f"--field takes NAME=FIELD (e.g. messages=dialog), not '{value}'")
        out[name.strip()] = target.strip()
    return out
