"""The frozen options of a pack run, and presets loaded from config files (TOML, YAML or JSON).

A config file holds the same names as the ``pack`` flags (``max_len``, ``train_on``, ...) plus a
``[fields]`` table that renames record fields, and may name its ``inputs`` (paths relative to the
file). Flags given on the command line override the file; inputs given on the command line replace
the preset's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from packcli.errors import UsageError, too_many_digits
from packcli.formats import DEFAULT_FIELDS, FORMATS

CHOICES: dict[str, tuple[str, ...]] = {
    "format": ("auto", *FORMATS),
    "task": ("auto", "sft", "preference", "kto"),
    "train_on": ("auto", "all", "assistant", "last_assistant", "completion"),
    "overflow": ("drop", "truncate", "split", "error"),
    "truncate_side": ("right", "left"),
    "split_system": ("all", "first"),
    "on_error": ("fail", "skip"),
    "output_format": ("parquet", "arrow", "mds", "megatron"),
    "algorithm": ("ffd", "bfd"),
    "rank_remainder": ("drop", "pad"),
    "engine": ("local", "ray"),
    "loss_weighting": ("token", "sample", "sqrt"),
}

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
    truncate_side: str = "right"
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
    dry_run: bool = False
    engine: str = "local"
    ray_address: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not '{value}'")
        for name, low in (("max_len", 2), ("rows_per_shard", 1), ("world_size", 1), ("num_proc", 1), *_PARALLEL):
            value = getattr(self, name)
            if not low <= value <= 1 << 30:
                raise UsageError(f"--{name.replace('_', '-')} must be between {low} and {1 << 30}, not {value}")
        # Fields not named keep their default names, for callers that rename only some (the library).
        object.__setattr__(self, "fields", {**DEFAULT_FIELDS, **self.fields})
        if self.seed < 0:
            raise UsageError(f"--seed must be 0 or more, not {self.seed}")
        if self.limit is not None and not 1 <= self.limit <= 1 << 62:
            bound = "at least 1" if self.limit < 1 else f"at most {1 << 62}"
            raise UsageError(f"--limit must be {bound}, not {self.limit}")
        for name, value in self.template_kwargs.items():
            try:  # the manifest and the cache key are strict JSON: no NaN or Infinity in them
                json.dumps(value, allow_nan=False)
            except ValueError as exc:
                raise UsageError(
                    f"template keyword argument '{name}' holds a number JSON cannot write ({value}); "
                    "give a finite number, or quote the value to pass it as a string"
                ) from exc
        if not 0 <= self.min_piece <= self.max_len:
            raise UsageError(f"--min-piece must be between 0 and --max-len {self.max_len}, not {self.min_piece}")
        if self.max_drop_fraction is not None and not 0 <= self.max_drop_fraction <= 1:
            raise UsageError(f"--max-drop-fraction must be between 0 and 1, not {self.max_drop_fraction}")
        if self.pad_to_max and self.max_len > PAD_TO_MAX_LIMIT:
            gib = self.max_len * PADDED_ROW_BYTES_PER_TOKEN / (1 << 30)
            raise UsageError(
                f"--max-len {self.max_len} with --pad-to-max: every row would be {self.max_len} tokens, about "
                f"{gib:.0f} GiB of memory to build; with --pad-to-max, --max-len must be at most {PAD_TO_MAX_LIMIT}"
            )
        self._check_padding()
        if self.cache_max_size is not None:
            from packcli.cachedir import parse_size

            parse_size(self.cache_max_size, "--cache-max-size")
        unknown = set(self.fields) - set(DEFAULT_FIELDS)
        if unknown:
            raise UsageError(f"unknown field name(s) {', '.join(sorted(unknown))}; known: {', '.join(DEFAULT_FIELDS)}")

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
    "tokenization": ("tokenizer", "chat_template", "template_kwargs", "train_on", "add_eos", "on_error"),
    "packing": (
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
    "output": ("output", "output_format", "rows_per_shard", "overwrite", "rejects", "dry_run", "loss_weighting"),
    "run": ("num_proc", "cache", "cache_dir", "cache_max_size", "engine", "ray_address"),
}


def load_config_file(path: str) -> dict[str, Any]:
    """Read a preset (.toml, .yaml/.yml or .json); return its options with field renames merged over the defaults.

    ``inputs`` (a path or a list of them) are returned relative to the current directory: a preset's
    paths are relative to the preset file.
    """
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
            data = {} if data is None else data
        else:
            data = tomllib.loads(text)
    except FileNotFoundError as exc:
        raise UsageError(f"{path}: no such config file; check the --config path") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not a valid YAML file ({' '.join(str(exc).split())}); fix it") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(f"{path}: not a valid config file ({exc}); fix it") from exc
    except ValueError as exc:  # the parsers' only other one: an integer past Python's digit limit
        raise UsageError(f"{path}: holds {too_many_digits()}; fix the preset") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a preset must be an object of option = value, not {_kind(data)}; fix the file")
    known = {f.name for f in fields(PackConfig)}
    data = {str(k).replace("-", "_"): v for k, v in data.items() if k != "description"}
    unknown = set(data) - known
    if unknown:
        raise UsageError(f"{path}: unknown option(s) {', '.join(sorted(unknown))}; see packcli pack --help")
    if "inputs" in data:
        data["inputs"] = _preset_inputs(path, data["inputs"])
    for key, value in data.items():
        if key != "inputs":
            _check_type(path, key, value)
    if "fields" in data:
        data["fields"] = {**DEFAULT_FIELDS, **data["fields"]}
    return data


def _preset_inputs(path: str, value: Any) -> tuple[str, ...]:
    """A preset's inputs (a string or a list of strings), each relative to the preset's directory."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise UsageError(f"{path}: 'inputs' must be a path or a list of paths, not {_kind(value)}; fix the preset")
    base = Path(path).parent
    out = []
    for item in items:
        # stdin, absolute paths and Hub names (owner/name, not a path beside the preset) stay as written.
        hub = item.count("/") == 1 and not item.startswith((".", "~")) and not Path(item).suffix
        hub = hub and not (base / item).exists()
        out.append(item if item == "-" or Path(item).is_absolute() or hub else str(base / item))
    return tuple(out)


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


# The lowest value of each integer option ("seed" included: a negative seed is refused, not wrapped).
_PARALLEL = (("pad_to_multiple_of", 1), ("context_parallel", 1), ("tensor_parallel", 1))
_INT_LOW = {"max_len": 2, "rows_per_shard": 1, "world_size": 1, "num_proc": 1, "seed": 0, "min_piece": 0, "limit": 1}
_INT_LOW |= dict(_PARALLEL)
_EXPECTED = {
    "bool": "true or false (a boolean)",
    "int": "an integer",
    "str": "a string",
    "str | None": "a string",
    "int | None": "an integer",
    "float | None": "a number",
    "dict[str, str]": "a table of name = field strings",
    "dict[str, Any]": "a table of name = value",
}


def _kind(value: Any) -> str:
    """How a preset value reads, for error messages: 'the string "false"', 'the number 2048.5'..."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return {dict: "a table", list: "a list", type(None): "null"}.get(type(value), type(value).__name__)


def _check_type(path: str, key: str, value: Any) -> None:
    """Refuse a preset value of the wrong type: a string "false" is not false, 2048.5 is not a length.

    Flags are typed by their parser; preset values are checked here with the same strictness, so a
    preset cannot turn on --overwrite or the cache by spelling false as a string.
    """
    declared = str(next(f.type for f in fields(PackConfig) if f.name == key))
    expected = _EXPECTED[declared]
    if declared == "bool":
        ok = isinstance(value, bool)
    elif declared in ("int", "int | None"):
        ok = (value is None and declared != "int") or (isinstance(value, int) and not isinstance(value, bool))
    elif declared == "str":
        ok = isinstance(value, str)
    elif declared == "str | None":
        ok = value is None or isinstance(value, str)
    elif declared == "float | None":
        ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    elif declared == "dict[str, Any]":
        ok = isinstance(value, dict)
    else:
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if not ok:
        raise UsageError(f"{path}: '{key}' must be {expected}, not {_kind(value)}; fix the preset")
    if declared.startswith("int") and key in _INT_LOW and value is not None and value < _INT_LOW[key]:
        raise UsageError(f"{path}: '{key}' must be an integer of at least {_INT_LOW[key]}, not {value}; fix the preset")


def parse_field_flags(values: list[str]) -> dict[str, str]:
    """Parse ``--field NAME=FIELD`` flags."""
    out = {}
    for value in values:
        name, sep, target = value.partition("=")
        if not sep or not name or not target:
            raise UsageError(f"--field takes NAME=FIELD (e.g. messages=dialog), not '{value}'")
        out[name.strip()] = target.strip()
    return out
