"""Presets: options read from config files (TOML, YAML or JSON), and the parsing of repeatable flags.

A config file holds the same names as the ``pack`` flags (``max_len``, ``train_on``, ...) plus a
``[fields]`` table that renames record fields, and may name its ``inputs`` (paths relative to the
file). Flags given on the command line override the file; inputs given on the command line replace
the preset's. Each value is checked by the rule of its option (``config.option_problem``).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from packcli.config import PackConfig, describe_value, did_you_mean, has_type, option_problem, parse_mix
from packcli.errors import Opt, UsageError, too_many_digits
from packcli.io.uri import is_uri
from packcli.jsontypes import JSONObject, TemplateKwargs
from packcli.records.formats import DEFAULT_FIELDS

# A preset holds options, not data: what it may be, so that reading one is instant whatever the file.
MAX_PRESET_BYTES = 1 << 20
MAX_PRESET_DEPTH = 32  # tables and lists within each other (a template keyword's value may nest a few)


class _PresetLimit(Exception):
    """A preset past a limit of this module (its words, for the one line the user reads)."""


def load_config_file(path: str) -> JSONObject:
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
        raise UsageError(f"{path}: no such config file", hint=("check the ", Opt("config"), " path")) from exc
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
    if "sources" in data or "mix" in data:  # a preset's sources, as --mix PATH=SHARE values
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
    if is_uri(output) or Path(output).is_absolute():
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


def parse_template_kwargs(values: list[str]) -> TemplateKwargs:
    """Parse ``--template-kwarg KEY=VALUE`` flags; VALUE is JSON (``false``, ``"high"``) or else a string."""
    out: TemplateKwargs = {}
    for value in values:
        name, sep, raw = value.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"takes KEY=VALUE (e.g. enable_thinking=false), not '{value}'", option="template_kwargs")
        try:
            out[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[name.strip()] = raw
        except ValueError as exc:  # an integer past Python's digit limit
            raise UsageError(
                f"{name.strip()}: the value is {too_many_digits()}; quote it to pass it as a string",
                option="template_kwargs",
            ) from exc
    return out


def _check_type(path: str, key: str, value: Any) -> None:
    """Refuse a preset value of the wrong type or out of range: a string "false" is not false.

    Flags are typed by their parser; preset values are checked with the same rule as PackConfig's, so
    a preset cannot turn on --overwrite or the cache by spelling false as a string.
    """
    problem = option_problem(key, value)
    if problem:
        raise UsageError(f"{path}: '{key}' {problem}; fix the preset")


def parse_field_flags(values: list[str]) -> dict[str, str]:
    """Parse ``--field NAME=FIELD`` flags."""
    out = {}
    for value in values:
        name, sep, target = value.partition("=")
        if not sep or not name or not target:
            raise UsageError(f"takes NAME=FIELD (e.g. messages=dialog), not '{value}'", option="fields")
        out[name.strip()] = target.strip()
    return out


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
    return len(weights) == 1 and weights <= {"share", "epochs"} and has_type("float", entry[weights.pop()])
