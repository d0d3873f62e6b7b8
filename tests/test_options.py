"""Every option checked before any work, by one rule for the command line, presets and the library.

Presets are read with limits (size, YAML aliases, nesting); their paths are the preset's; a typo gets
a "did you mean". And the smaller rules of options: a suggestion never names what was passed, a
template keyword that would leave samples incomplete is refused, identical answers are no pair.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

import packcli
from packcli.config import PackConfig

from .conftest import one_error_line, write_jsonl

RECORDS = [
    {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
    for i in range(4)
]

# option: (a value of the wrong type, a value of the right type out of its range or choices). None: no
# such value (a boolean has no range). Every option of pack has its row (checked below).
WRONG: dict[str, tuple[Any, Any]] = {
    "output": (3, ""),
    "max_len": ("256", 1),
    "tokenizer": (3, ""),
    "chat_template": (["t.jinja"], ""),
    "split": (1, ""),
    "limit": ("10", 0),
    "format": (None, "xml"),
    "task": (1, "dpo"),
    "fields": (["messages"], {"mesages": "dialog"}),
    "train_on": (False, "everything"),
    "add_eos": ("false", None),
    "overflow": (None, "cut"),
    "truncate_side": (0, "middle"),
    "split_system": (0, "none"),
    "min_piece": (1.5, -1),
    "max_drop_fraction": ("0.1", 1.5),
    "on_error": (True, "ignore"),
    "algorithm": (0, "nfd"),
    "seed": ("0", -1),
    "world_size": (2.0, 0),
    "rank_remainder": (0, "keep"),
    "balance": (0, "cost"),
    "balance_model": (7, "huge"),
    "rows_per_shard": (True, 0),
    "output_format": (0, "npy"),
    "pad_to_max": ("false", None),
    "pad_to_multiple_of": ("8", 0),
    "context_parallel": (None, 0),
    "tensor_parallel": (None, 0),
    "loss_weighting": (0, "mean"),
    "overwrite": ("false", None),
    "num_proc": ("4", 0),
    "cache": ("false", None),
    "cache_dir": (3, ""),
    "cache_max_size": (10, "10XB"),
    "rejects": (3, ""),
    "fix_turns": ("true", None),
    "fix_turns_log": (3, ""),
    "dry_run": ("false", None),
    "engine": (None, "spark"),
    "encoder": (1, "tiktoken"),
    "ray_address": (3, ""),
    "template_kwargs": ([1], {"continue_final_message": True}),
    "mix": ("d.jsonl=0.5", ("d.jsonl=half",)),
    "mix_by": (1, "bytes"),
    "mix_max_epochs": ("10", 0.5),
    "dedup": (True, "fuzzy"),
    "expand_turns": (True, "rounds"),
    "prefix_tree": ("yes", None),
    "eval_fraction": ("0.1", 1.5),
    "eval_records": ("3", 0),
    "processor": (3, ""),
    "embed_images": ("true", None),
}
# Where the message does not start with the option's name, what it starts with.
STARTS = {
    ("fields", 1): r"unknown field name\(s\) mesages \(did you mean messages\?\)",
    ("cache_max_size", 1): r"cache_max_size takes a size such as 500MB, 10GB or 2GiB, not '10XB'",
    ("balance_model", 1): r"balance_model takes a size \(1b, 3b, 7b, 8b, 13b, 32b, 70b\) or LAYERS,D_MODEL,PARAMS",
    ("mix", 1): r"mix takes PATH=SHARE \(e\.g\. chat\.jsonl=0\.7\) or PATH=Nx",
    ("template_kwargs", 1): r"template keyword argument 'continue_final_message' leaves the last message open",
}
CASES = [
    pytest.param(name, k, values[k], id=f"{name}-{'type' if k == 0 else 'value'}")
    for name, values in WRONG.items()
    for k in (0, 1)
    if values[k] is not None
]


def test_the_table_has_every_option() -> None:
    assert set(WRONG) == {f.name for f in fields(PackConfig)} - {"inputs"}


@pytest.mark.parametrize(("name", "kind", "value"), CASES)
def test_every_option_is_checked_before_any_work(name: str, kind: int, value: Any, tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    given = {"output": out, "cache_dir": cache, "num_proc": 1, name: value}
    with pytest.raises(packcli.UsageError) as err:
        packcli.pack(RECORDS, **given)
    message = str(err.value)
    assert message.count("\n") == 0 and "--" not in message, message
    start = STARTS.get((name, kind), rf"{name} must ")
    assert re.match(start, message), message
    assert not out.exists() and not cache.exists()  # nothing written: not even the records, to the cache


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"max_len": "256"}, 'max_len must be an integer, not the string "256"'),
        ({"max_len": 256.0}, "max_len must be an integer, not the number 256.0"),
        ({"max_len": True}, "max_len must be an integer, not the boolean true"),
        ({"template_kwargs": [1]}, "template_kwargs must be a table of name = value, not a list"),
        ({"output": None}, "output must be a string, not null"),
        ({"num_proc": 0}, "num_proc must be between 1 and 1073741824, not 0"),
        ({"max_len": 10**5000}, "max_len must be between 2 and 1073741824, not an integer of more than 4300 digits"),
        ({"template_kwargs": {"x": {1}}}, "template keyword argument 'x' holds a value of type set, which JSON cannot"),
    ],
    ids=["max-len-string", "max-len-float", "max-len-bool", "kwargs-list", "output-none", "num-proc-0", "huge", "set"],
)
def test_the_named_cases(given: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(packcli.UsageError) as err:
        packcli.pack(RECORDS, **{"output": tmp_path / "out", "cache": False, **given})
    assert str(err.value).startswith(message), str(err.value)
    assert not (tmp_path / "out").exists() and not Path("None").exists()


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        (None, "not None"),
        ([], "not an empty list"),
        ("", "not an empty string"),
        ([{"text": "a b"}, 3], "item 1 is the number 3"),
        ({"text": "a b"}, "not one record (a table); put it in a list"),
        (b"x.jsonl", "not a value of type bytes"),
    ],
    ids=["none", "empty-list", "empty-string", "mixed", "one-record", "bytes"],
)
def test_inputs_of_no_known_kind(inputs: Any, words: str, tmp_path: Path) -> None:
    with pytest.raises(packcli.UsageError) as err:
        packcli.pack(inputs, output=tmp_path / "out", cache=False)
    assert str(err.value).startswith("inputs must be a path, a list of paths, a datasets.Dataset or a list of")
    assert str(err.value).endswith(words)


def test_an_iterator_of_records_is_read_once(tmp_path: Path) -> None:
    result = packcli.pack(iter(RECORDS), 256, tmp_path / "out", cache=False, num_proc=1)
    assert result.packed == len(RECORDS)


def test_num_proc_0_is_refused_alike_by_the_cli_and_the_library(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    cli = one_error_line(pack(data, "--num-proc", "0", "-o", tmp_path / "a", expect=2))
    with pytest.raises(packcli.UsageError) as err:
        packcli.pack(str(data), output=tmp_path / "b", num_proc=0, cache=False)
    assert cli == "Error: --num-proc must be between 1 and 1073741824, not 0"
    assert str(err.value) == "num_proc must be between 1 and 1073741824, not 0"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: packcli.stats(RECORDS, max_len="256"), "max_len must be an integer or a list of integers, not the"),
        (lambda d: packcli.stats(RECORDS, max_len=[512, True]), "max_len must be an integer, not the boolean true"),
        (lambda d: packcli.stats(RECORDS, max_len=[512, 1]), "max_len must be between 2 and"),
        (lambda d: packcli.stats(RECORDS, max_len=512, batch_size=0), "batch_size must be between 1 and"),
        (lambda d: packcli.stats(RECORDS, max_len=512, batch_size=8.0), "batch_size must be an integer, not"),
        (lambda d: packcli.stats(RECORDS, max_len=512, num_proc=0), "num_proc must be between 1 and"),
        (lambda d: packcli.stats(RECORDS, max_len=512, max_lenn=3), r"unknown option(s) max_lenn (did you mean"),
        (lambda d: packcli.stats(d, max_len=512), "max_len applies to raw inputs only;"),
        (lambda d: packcli.verify(None), "directory must be a path (a string or os.PathLike), not null"),
        (lambda d: packcli.inspect_row(d, "1"), 'row must be an integer, not the string "1"'),
        (lambda d: packcli.inspect_row(d, -1), "row must be at least 0, not -1"),
        (lambda d: packcli.inspect_row(d, sample_index=True), "sample_index must be an integer, not the boolean"),
        (lambda d: packcli.inspect_row(d, max_tokens=0), "max_tokens must be at least 1, not 0"),
        (lambda d: packcli.inspect_row(d, tokenizer=3), "tokenizer must be a string, not the number 3"),
    ],
    ids=lambda x: "" if callable(x) else x.split(" must")[0].split(" applies")[0].replace(" ", "-"),
)
def test_stats_verify_and_inspect_check_their_options(call: Any, message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    packcli.pack(RECORDS, 256, out, cache=False, num_proc=1)
    with pytest.raises(packcli.UsageError) as err:
        call(out)
    assert str(err.value).startswith(message), str(err.value)


def test_unknown_keyword_is_refused_before_any_work(tmp_path: Path) -> None:
    """pack() names every option in its signature: a typo is Python's TypeError (and a type checker's error,
    tests/test_typing.py); stats(), whose options pass through to the run, answers with a did-you-mean."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_length'"):
        packcli.pack(RECORDS, output=tmp_path / "o", max_length=1024, cache=False)  # type: ignore[call-arg]
    assert not (tmp_path / "o").exists()
    with pytest.raises(packcli.UsageError) as err:
        packcli.stats(RECORDS, max_len=64, max_length=1024, num_prc=2, cache=False)
    assert str(err.value).startswith(
        "unknown option(s) max_length, num_prc (did you mean max_length -> max_len, num_prc -> num_proc?); known: "
    )


# -- presets ---------------------------------------------------------------------------------------------

# Nine levels of nine references: 9**9 strings once expanded, from a file of 400 bytes. Under
# template_kwargs, the keys are valid: only the aliases can refuse it (it used to run for minutes).
BILLION_LAUGHS = "template_kwargs:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("p.yaml", "n: &n 512\nmax_len: *n\n", "line 2: YAML alias *n; a preset takes no aliases"),
        ("p.yaml", BILLION_LAUGHS, "line 3: YAML alias *a; a preset takes no aliases"),
        ("p.yaml", "template_kwargs:\n  x: " + "[" * 40 + "]" * 40 + "\n", "nested more than 32 levels deep"),
        ("p.json", '{"template_kwargs": {"x": ' + "[" * 5000 + "]" * 5000 + "}}", "nested more than 32 levels deep"),
        ("p.toml", "[template_kwargs]\nx = " + "[" * 40 + "]" * 40 + "\n", "nested more than 32 levels deep"),
        ("p.toml", "max_len = 512\n" + "#" * (1 << 20) + "\n", "is larger than 1 MiB; a preset holds options, not"),
        ("p.toml", "max_length = 512\n", "unknown option(s) max_length (did you mean max_len?); see packcli pack"),
    ],
    ids=["alias", "billion-laughs", "deep-yaml", "deep-json", "deep-toml", "large", "typo"],
)
def test_presets_are_read_with_limits(name: str, text: str, words: str, pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    preset = tmp_path / name
    preset.write_text(text)
    line = one_error_line(pack(data, "--config", preset, "-o", tmp_path / "out", "--dry-run", expect=2))
    assert line.startswith(f"Error: {preset}: {words}"), line


def test_a_presets_output_is_beside_the_preset(pack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    presets, elsewhere = tmp_path / "presets", tmp_path / "elsewhere"
    presets.mkdir()
    elsewhere.mkdir()
    write_jsonl(presets / "d.jsonl", RECORDS)
    (presets / "p.toml").write_text('inputs = ["d.jsonl"]\noutput = "out"\nmax_len = 256\n')
    monkeypatch.chdir(elsewhere)
    summary = json.loads(pack("--config", presets / "p.toml", "--json", "-q").stdout)
    assert (presets / "out" / "manifest.json").exists() and not (elsewhere / "out").exists()
    assert summary["output"] == str(presets / "out")
    pack("--config", presets / "p.toml", "-o", "mine", "-q")  # a flag is the current folder's, as always
    assert (elsewhere / "mine" / "manifest.json").exists()


# -- the smaller rules -----------------------------------------------------------------------------------


def test_continue_final_message_is_refused(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    line = one_error_line(pack(data, "--template-kwarg", "continue_final_message=true", "--dry-run", expect=2))
    assert line == (
        "Error: template keyword argument 'continue_final_message' leaves the last message open (its end-of-turn "
        "marker is dropped), and a packed sample must be complete so that the model learns where an answer ends; "
        "leave it out"
    )
    own = [dict(RECORDS[0], chat_template_kwargs={"continue_final_message": True}), *RECORDS[1:]]
    data = write_jsonl(tmp_path / "own.jsonl", own)
    summary = json.loads(pack(data, "--on-error", "skip", "--dry-run", "--json").stdout)
    assert summary["dropped"] == {"reserved_template_kwarg": 1} and summary["packed"] == len(RECORDS) - 1


def _long_prompts(path: Path) -> Path:
    """Records whose answer is past 32 tokens: a right cut leaves nothing to train."""
    long = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]
    return write_jsonl(path, [{"messages": long}] * 3)


@pytest.mark.parametrize(
    ("flags", "hint"),
    [
        ([], "raise --max-len, or pass --overflow split"),
        (["--overflow", "truncate"], "raise --max-len, or pass --overflow split, or pass --truncate-side left"),
        # split cuts such an exchange from the left by default (its answer stays): only an explicit right fails
        (["--overflow", "split", "--truncate-side", "right"], "raise --max-len, or pass --truncate-side left"),
    ],
    ids=["drop", "truncate", "split-right"],
)
def test_a_suggestion_never_names_what_was_passed(flags: list[str], hint: str, pack: Any, tmp_path: Path) -> None:
    data = _long_prompts(tmp_path / "d.jsonl")
    line = one_error_line(pack(data, "--max-len", 32, *flags, "--dry-run", expect=1))
    assert line.endswith(f"or have nothing to train on; {hint}"), line


def test_loss_hints_never_name_the_runs_own_settings() -> None:
    from packcli.config import flag_term
    from packcli.errors import render
    from packcli.results import Lost
    from packcli.run.accounting import loss_words

    reasons = ["too_long", "truncated", "nothing_to_train_after_truncation", "world_size_remainder"]
    reasons += ["no_piece_left", "no_assistant_turn", "nothing_to_train", "invalid_json"]
    for overflow in ("drop", "truncate", "split"):
        for side in ("auto", "right", "left"):
            for task in ("sft", "preference"):
                for remainder in ("drop", "pad"):
                    config = PackConfig(
                        inputs=("x",), overflow=overflow, truncate_side=side, task=task, rank_remainder=remainder
                    )
                    own = {f"--overflow {overflow}", f"--truncate-side {side}", f"--rank-remainder {remainder}"}
                    for reason in reasons:
                        lost = {
                            "records": 1,
                            "tokens": 9,
                            "records_fraction": 0.5,
                            "tokens_fraction": 0.1,
                            "records_by_reason": {reason: 1},
                            "tokens_by_reason": {reason: 9},
                        }
                        words = render(loss_words(Lost.from_dict(lost), config), flag_term).split("): ", 1)[1]
                        assert words and not any(f"pass {o}" in words or f"or {o}" in words for o in own), (
                            config,
                            reason,
                            words,
                        )


def _pairs(n: int) -> list[dict[str, Any]]:
    return [
        {
            "prompt": [{"role": "user", "content": "context " * (40 if i == 0 else 2) + f"question {i}"}],
            "chosen": [{"role": "assistant", "content": f"good answer {i}"}],
            "rejected": [{"role": "assistant", "content": f"bad {i}"}],
        }
        for i in range(n)
    ]


def test_truncate_side_right_is_refused_for_preference_data(pack: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "pref.jsonl", _pairs(6))
    line = one_error_line(
        pack(data, "--max-len", 64, "--overflow", "truncate", "--truncate-side", "right", "--dry-run", expect=2)
    )
    assert line == (
        "Error: --truncate-side right does not apply to preference data: a record is cut only in its prompt, "
        "from the left, so that its answers stay whole; leave --truncate-side out"
    )
    with pytest.raises(packcli.UsageError, match=r'^truncate_side="right" does not apply to preference data'):
        packcli.pack(str(data), 64, overflow="truncate", truncate_side="right", dry_run=True, cache=False)
    # Left is what is done; without the option, the same run packs, its first record's prompt cut.
    for side in ([], ["--truncate-side", "left"]):
        summary = json.loads(pack(data, "--max-len", 96, "--overflow", "truncate", *side, "--dry-run", "--json").stdout)
        assert summary["truncated"] == 1 and summary["packed"] == 6


@pytest.mark.parametrize("kind", ["strings", "messages"])
def test_identical_answers_are_no_pair(kind: str, pack: Any, tmp_path: Path) -> None:
    records = _pairs(4) if kind == "messages" else [{"prompt": "Q?", "chosen": " yes", "rejected": " no"}] * 4
    same = dict(records[2])
    same["rejected"] = same["chosen"]
    records[2] = same
    # The implicit-prompt form of identical conversations was dropped already, for the same reason.
    implicit = {"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    implicit["rejected"] = implicit["chosen"]
    records.append(implicit if kind == "messages" else same)
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    summary = json.loads(pack(data, "--max-len", 256, "--on-error", "skip", "--dry-run", "--json").stdout)
    assert summary["dropped"] == {"identical_completions": 2} and summary["packed"] == 3
    line = one_error_line(pack(data, "--max-len", 256, "--dry-run", expect=1))
    assert "line 3" in line and "'chosen' and 'rejected' are the same" in line, line


# -- one declaration per option --------------------------------------------------------------------------

# The pack parameters that set no PackConfig field.
NOT_OPTIONS = {"inputs", "config", "json_out", "quiet", "help"}


def _declared_defaults() -> dict[str, Any]:
    from dataclasses import MISSING

    return {
        f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        for f in fields(PackConfig)
        if f.name != "inputs"
    }


def _cli_problems(params: list[Any]) -> list[str]:
    """What differs between pack's click parameters and the declarations of PackConfig's fields."""
    from packcli.cli.options import choices
    from packcli.config import CHOICES, DECLARATIONS, HELP_PANELS, flag, flag_term
    from packcli.errors import parts_of, render

    problems = []
    owner: dict[str, str] = {}  # CLI parameter -> the field it sets
    order = [name for panel in HELP_PANELS.values() for name in panel]
    for name, default in _declared_defaults().items():
        declared = DECLARATIONS[name]
        found = [p for p in params if flag(name).split("/")[0] in p.opts]
        if len(found) != 1:
            problems.append(f"{name}: {len(found)} flags")
            continue
        [param] = found
        owner[param.name] = name
        if declared.repeatable or declared.none_means is not None:
            default = None  # none given; or what None stands for (the available cores)
        elif flag(name).startswith("--no-") and "/" not in flag(name):
            default = not default  # --no-cache
        shown = declared.none_means if declared.none_means is not None else True
        expected = {
            "default": default,
            "help": render(parts_of(declared.help), flag_term),
            "metavar": choices(name) if name in CHOICES else declared.metavar,
            "rich_help_panel": next(panel for panel, names in HELP_PANELS.items() if name in names),
            "show_default": shown,
            "secondary_opts": [declared.off_flag] if declared.off_flag else param.secondary_opts,
        }
        problems += [
            f"{name}: {key} {getattr(param, key)!r}" for key, v in expected.items() if getattr(param, key) != v
        ]
    if {p.name for p in params} - set(owner) != NOT_OPTIONS - {"help"}:
        problems.append(f"parameters of no option: {sorted({p.name for p in params} - set(owner))}")
    listed = [owner[p.name] for p in params if p.name in owner]
    if listed != order:
        problems.append(f"not in the help's order: {listed}")
    return problems


def _accepts(keyword: Any, declared: Any) -> bool:
    """Whether a keyword's type takes every value of the field's type (str by str | PathLike[str], a tuple by a
    Sequence, a dict by a Mapping)."""
    import types
    from collections.abc import Sequence
    from typing import Literal, Union, get_args, get_origin

    def members(kind: Any) -> tuple[Any, ...]:
        return get_args(kind) if get_origin(kind) in (Union, types.UnionType) else (kind,)

    def takes(k: Any, d: Any) -> bool:
        if k == d or k is Any:
            return True
        if get_origin(d) is Literal or get_origin(k) is Literal:
            return False
        k_origin, d_origin = get_origin(k) or k, get_origin(d) or d
        if not (isinstance(k_origin, type) and isinstance(d_origin, type) and issubclass(d_origin, k_origin)):
            return False
        k_args, d_args = get_args(k), tuple(a for a in get_args(d) if a is not Ellipsis)
        if k_origin is Sequence and d_origin is tuple:
            return all(takes(k_args[0], a) for a in d_args)
        return len(k_args) == len(d_args) and all(takes(ka, da) for ka, da in zip(k_args, d_args, strict=True))

    return all(any(takes(k, d) for k in members(keyword)) for d in members(declared))


def _library_problems(function: Any) -> list[str]:
    """What differs between a function's keywords and the declarations of PackConfig's fields."""
    from packcli.config import DECLARATIONS, OPTION_TYPES

    keywords = {n: p for n, p in inspect.signature(function, eval_str=True).parameters.items() if n != "inputs"}
    declared = _declared_defaults()
    problems = [f"{name}: no keyword" for name in sorted(set(declared) - set(keywords))]
    problems += [f"{name}: no option" for name in sorted(set(keywords) - set(declared))]
    for name in sorted(set(keywords) & set(declared)):
        param, default = keywords[name], declared[name]
        # None where it stands for something (the available cores) or for a table's default
        unset = DECLARATIONS[name].none_means is not None or isinstance(default, dict)
        if param.default != (None if unset else default) or type(param.default) is not type(None if unset else default):
            problems.append(f"{name}: default {param.default!r}")
        if not _accepts(param.annotation, OPTION_TYPES[name]):
            problems.append(f"{name}: type {param.annotation} does not take {OPTION_TYPES[name]}")
    return problems


def test_every_option_has_one_flag_and_one_keyword_as_declared() -> None:
    """Each PackConfig field is declared (help, flag, panel) and has exactly one flag of ``packcli pack`` built
    from that declaration, in the help's order, and one keyword of ``packcli.pack`` with its default and a type
    that takes its values (its Literal type for a choice); and it is in the docs' options table."""
    from typer.main import get_command

    from packcli.api import pack
    from packcli.cli import app
    from packcli.config import CHOICE_TYPES, DECLARATIONS, HELP_PANELS, flag

    assert set(DECLARATIONS) == {f.name for f in fields(PackConfig)} - {"inputs"}
    panels = [name for names in HELP_PANELS.values() for name in names]
    assert sorted(panels) == sorted(DECLARATIONS)  # each option in exactly one panel
    assert all(DECLARATIONS[name].help for name in DECLARATIONS)
    command = get_command(app).commands["pack"]  # type: ignore[attr-defined]
    assert _cli_problems(command.params) == []
    assert _library_problems(pack) == []
    for name, kind in CHOICE_TYPES.items():
        assert inspect.signature(pack, eval_str=True).parameters[name].annotation == kind, name
    table = (Path(__file__).parents[1] / "docs" / "reference" / "pack-options.md").read_text()
    for name in DECLARATIONS:
        assert f"`{flag(name).split('/')[0]}" in table, f"{flag(name)} is not in docs/reference/pack-options.md"


def test_the_declaration_checks_find_drift() -> None:
    """A field declared without option() is refused; a CLI or a library signature that drifted from the
    declarations is found: a default, a type, a keyword or a flag, its help or its place."""
    import copy
    from dataclasses import dataclass, field

    from typer.main import get_command

    from packcli.api import pack
    from packcli.cli import app
    from packcli.config.declare import declared

    @dataclass(frozen=True)
    class Undeclared:
        max_len: int = 4096
        fields: dict[str, str] = field(default_factory=dict)

    for f in fields(Undeclared):
        with pytest.raises(TypeError, match=rf"PackConfig.{f.name} is declared without option\(\)"):
            declared(f)

    signature = inspect.signature(pack, eval_str=True)
    params = dict(signature.parameters)
    params["max_len"] = params["max_len"].replace(default=2048)
    params["seed"] = params["seed"].replace(annotation=str)
    params["num_proc"] = params["num_proc"].replace(default=1)
    del params["dedup"]

    def drifted() -> None: ...

    drifted.__signature__ = signature.replace(parameters=list(params.values()))  # type: ignore[attr-defined]
    assert _library_problems(drifted) == [
        "dedup: no keyword",
        "max_len: default 2048",
        "num_proc: default 1",
        "seed: type <class 'str'> does not take <class 'int'>",
    ]
    assert _accepts(int | None, int) and not _accepts(int, int | None) and not _accepts(str, int)

    cli = [copy.copy(p) for p in get_command(app).commands["pack"].params]  # type: ignore[attr-defined]
    by_name = {p.name: p for p in cli}
    by_name["max_len"].default = 2048
    by_name["overflow"].help = "Samples too long."
    by_name["overwrite"].secondary_opts = []
    cli.remove(by_name["seed"])
    cli.remove(by_name["rejects"])
    cli.insert(0, by_name["rejects"])
    problems = _cli_problems(cli)
    assert problems[:4] == [
        "max_len: default 2048",
        "overflow: help 'Samples too long.'",
        "seed: 0 flags",
        "overwrite: secondary_opts []",
    ]
    assert problems[4].startswith("not in the help's order: ['rejects', 'split',")
    with pytest.raises(ValueError, match="not options of PackConfig: max_length"):
        from packcli.cli.options import with_options

        with_options("max_len", "max_length")


def test_choices_come_from_their_literal_types() -> None:
    from typing import get_args

    from packcli.config import CHOICE_TYPES, CHOICES
    from packcli.records.formats import FORMATS

    assert {name: get_args(kind) for name, kind in CHOICE_TYPES.items()} == CHOICES
    assert CHOICES["format"] == ("auto", *FORMATS)
