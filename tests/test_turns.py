"""Conversation cleaning (--fix-turns), its hint in template errors, per-message training marks, empty answers.

Real exports start with the assistant's greeting, repeat user turns, name roles human/gpt and hold empty
answers; strict templates refuse them. With --fix-turns they pack, and their ids equal
``apply_chat_template`` of the cleaned conversation (written out by hand below, not computed by packcli).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packcli.records.formats import DEFAULT_FIELDS, normalize
from packcli.tokenize.templates.choice import builtin_template

from .conftest import one_error_line, read_rows, trl_templates, write_jsonl

ZWSP = "\u200b"

# A Mistral-instruct-style template that refuses roles out of turn, as Mistral's own does; and its twin
# with generation blocks (the same text).
MISTRAL_STRICT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{GEN}{{ message['content'] + eos_token }}{END}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def _templates(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (the template, its twin with generation blocks), as files."""
    out = {}
    for name in ("llama3", "gemma"):
        out[name] = (str(trl_templates() / f"{name}.jinja"), str(trl_templates() / f"{name}_training.jinja"))
    plain = tmp_path / "mistral.jinja"
    plain.write_text(MISTRAL_STRICT.replace("{GEN}", "").replace("{END}", ""))
    twin = tmp_path / "mistral_training.jinja"
    twin.write_text(MISTRAL_STRICT.replace("{GEN}", "{% generation %}").replace("{END}", "{% endgeneration %}"))
    out["mistral"] = (str(plain), str(twin))
    return out


# Real-style records, (as written, as cleaned by hand); None: left with no answer, dropped.
SHAREGPT = [
    (  # the export's greeting first, a question nobody answered last
        [
            {"from": "gpt", "value": "Hello! How can I help you today?"},
            {"from": "human", "value": "What is a packed row?"},
            {"from": "gpt", "value": "Several samples in one sequence."},
            {"from": "human", "value": "And padding?"},
        ],
        [
            {"role": "user", "content": "What is a packed row?"},
            {"role": "assistant", "content": "Several samples in one sequence."},
        ],
    ),
    (  # a question sent in two parts
        [
            {"from": "human", "value": "Translate to French:"},
            {"from": "human", "value": "good morning"},
            {"from": "gpt", "value": "bonjour"},
        ],
        [
            {"role": "user", "content": "Translate to French:\n\ngood morning"},
            {"role": "assistant", "content": "bonjour"},
        ],
    ),
]
MESSAGES = [
    (  # human/gpt roles inside messages
        [{"role": "human", "content": "Name a prime."}, {"role": "gpt", "content": "Seven."}],
        [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}],
    ),
    (  # an empty answer (a zero-width space) between two questions
        [
            {"role": "user", "content": "First question?"},
            {"role": "assistant", "content": ZWSP},
            {"role": "user", "content": "Second question?"},
            {"role": "assistant", "content": "The answer."},
        ],
        [
            {"role": "user", "content": "First question?\n\nSecond question?"},
            {"role": "assistant", "content": "The answer."},
        ],
    ),
    (  # already clean
        [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}],
        [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}],
    ),
    (  # a greeting and an unanswered question: nothing to train is left
        [{"role": "assistant", "content": "Hi there!"}, {"role": "user", "content": "Hello?"}],
        None,
    ),
]


def _samples(rows: list[dict[str, Any]]) -> dict[int, tuple[list[int], list[int]]]:
    """Return each packed sample's (ids, labels) by sample_index."""
    out = {}
    for row in rows:
        at = 0
        for n, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            out[index] = (row["input_ids"][at : at + n], row["labels"][at : at + n])
            at += n
    return out


@pytest.mark.parametrize("name", ["llama3", "gemma", "mistral"])
def test_real_style_conversations_pack_with_strict_templates(
    name: str, tmp_path: Path, pack: Callable[..., Any], model_tokenizer: tuple[str, Any]
) -> None:
    tok_dir, tokenizer = model_tokenizer
    template, twin = _templates(tmp_path)[name]
    sharegpt = write_jsonl(tmp_path / "a-sharegpt.jsonl", [{"conversations": c} for c, _ in SHAREGPT])
    messages = write_jsonl(tmp_path / "b-messages.jsonl", [{"messages": m} for m, _ in MESSAGES])
    expected = [cleaned for _, cleaned in SHAREGPT + MESSAGES]
    log = tmp_path / "fixes.jsonl"
    for chat_template in (template, twin):
        out = tmp_path / f"out-{Path(chat_template).stem}"
        args = ["--tokenizer", tok_dir, "--chat-template", chat_template, "--max-len", "256", "-o", out]
        result = pack(sharegpt, messages, *args, "--fix-turns", "--fix-turns-log", log, "--json", "-q")
        summary = json.loads(result.stdout)
        assert summary["dropped"] == {"no_answer_after_fix": 1}
        # The changes of the records cleaning keeps; the one left without an answer is counted as dropped.
        assert summary["turns_fixed"] == {
            "role_renamed": 2,
            "leading_assistant_dropped": 1,
            "trailing_user_dropped": 1,
            "merged": 2,
            "empty_answer_dropped": 1,
            "orphan_tool_result_dropped": 0,
        }
        assert json.loads((out / "manifest.json").read_text())["turns_fixed"] == summary["turns_fixed"]
        samples = _samples(read_rows(out))
        assert sorted(samples) == [i for i, m in enumerate(expected) if m is not None]
        for index, (ids, labels) in samples.items():
            want = tokenizer.apply_chat_template(
                expected[index], chat_template=Path(template).read_text(), return_dict=True
            )
            assert ids == list(want["input_ids"]), (name, index)
            if chat_template == twin:
                ref = tokenizer.apply_chat_template(
                    expected[index],
                    chat_template=Path(twin).read_text(),
                    return_dict=True,
                    return_assistant_tokens_mask=True,
                )
                assert ref["input_ids"] == ids
                mask = np.array(ref["assistant_masks"], dtype=bool)
                mask[0] = False  # the first token is never a label
                assert labels == np.where(mask, ids, -100).tolist(), (name, index)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    # Records changed and kept (the one left without an answer is in the rejects, as dropped).
    assert [e["sample_index"] for e in entries] == [0, 1, 2, 3]
    assert entries[0]["changes"] == [
        {"kind": "leading_assistant_dropped", "message": 0},
        {"kind": "trailing_user_dropped", "message": 3},
    ]
    assert entries[2]["changes"] == [
        {"kind": "role_renamed", "message": 0, "from": "human", "to": "user"},
        {"kind": "role_renamed", "message": 1, "from": "gpt", "to": "assistant"},
    ]
    assert entries[3]["changes"] == [
        {"kind": "empty_answer_dropped", "message": 1},
        {"kind": "merged", "message": 2, "into": 0},
    ]
    assert json.loads(entries[3]["record"]) == {"messages": MESSAGES[1][0]}


def test_without_fix_turns_the_template_error_says_what_would_fix_it(
    tmp_path: Path, pack: Callable[..., Any], model_tokenizer: tuple[str, Any]
) -> None:
    tok_dir, _ = model_tokenizer
    gemma = str(trl_templates() / "gemma.jinja")
    greeting = [{"role": "assistant", "content": "Hi!"}, *MESSAGES[2][0]]
    data = write_jsonl(tmp_path / "a.jsonl", [{"messages": MESSAGES[2][0]}, {"messages": greeting}])
    args = ["--tokenizer", tok_dir, "--chat-template", gemma, "-o", tmp_path / "out"]
    line = one_error_line(pack(data, *args, expect=1))
    assert (
        "a.jsonl line 2: the chat template raised on message 0 (assistant): Conversation roles must alternate" in line
    )
    assert "; --fix-turns drops the leading assistant turn;" in line
    # Where cleaning would not make the template render it (Gemma takes no system message), no hint.
    system = [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi!"}, *MESSAGES[2][0]]
    data = write_jsonl(tmp_path / "b.jsonl", [{"messages": system}])
    line = one_error_line(pack(data, *args, expect=1))
    assert "System role not supported" in line and "--fix-turns" not in line
    # A role that --fix-turns would rename is named too.
    data = write_jsonl(tmp_path / "c.jsonl", [{"messages": MESSAGES[0][0]}])
    line = one_error_line(pack(data, *args, expect=1))
    assert "unknown role 'human'" in line and "--fix-turns renames it to 'user'" in line


def test_clean_rules() -> None:
    from packcli.records.turns import clean

    fields = dict(DEFAULT_FIELDS)
    record = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "Assistant", "content": "greeting"},
            {"role": "User", "content": "q"},
            {"role": "assistant", "content": " \u200c\u200d\u2060\ufeff\n"},  # blank: dropped
            {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]},  # a tool call: kept
            {"role": "tool", "content": "r1"},
            {"role": "tool", "content": "r2"},  # tool results are never merged
            {"role": "assistant", "content": "a1"},
            {"role": "assistant", "content": "a2", "train": False},  # another mark: not merged
            {"role": "user", "content": "left over"},
        ]
    }
    sample, changes = clean(normalize(record, "messages", fields, rename_roles=True))
    assert [m["role"] for m in sample.messages or []] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "assistant",
    ]
    assert sample.message_train == (None, None, None, None, None, None, False)
    assert [c["kind"] for c in changes] == [
        "role_renamed",
        "role_renamed",
        "empty_answer_dropped",
        "leading_assistant_dropped",
        "trailing_user_dropped",
    ]
    # A prompt/completion record keeps its boundary: the prompt's last user turn is not merged into the completion.
    pc = {"prompt": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "completion": "c"}
    sample, changes = clean(normalize(pc, "prompt_completion", fields))
    assert sample.prompt_len == 1 and (sample.messages or [])[0]["content"] == "a\n\nb"
    assert [c["kind"] for c in changes] == ["merged"]


def _trained_text(base_tokenizer: Any, ids: list[int], labels: list[int]) -> str:
    return base_tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != -100])


@pytest.mark.parametrize("mark", [{"train": False}, {"weight": 0}])
def test_a_message_marked_untrained_is_masked(
    mark: dict[str, Any], tmp_path: Path, pack: Callable[..., Any], base_tokenizer: Any
) -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "bad answer", **mark},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "good answer", "weight": 1},
    ]
    plain = [{k: v for k, v in m.items() if k not in ("train", "weight")} for m in messages]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    for train_on in ("assistant", "all"):
        out = tmp_path / f"out-{train_on}"
        pack(data, "--max-len", "128", "-o", out, "--train-on", train_on, "-q")
        ((ids, labels),) = _samples(read_rows(out)).values()
        # The marks never reach the template: the ids are those of the messages without them.
        want = base_tokenizer.apply_chat_template(plain, chat_template=builtin_template("deepseek"), return_dict=True)
        assert ids == list(want["input_ids"])
        trained = _trained_text(base_tokenizer, ids, labels)
        assert "good answer" in trained and "bad answer" not in trained
        if train_on == "all":
            assert "q2" in trained
    # "train": true trains an answer that --train-on last_assistant would not.
    messages[1] = {"role": "assistant", "content": "earlier answer", "train": True}
    data = write_jsonl(tmp_path / "e.jsonl", [{"messages": messages}])
    pack(data, "--max-len", "128", "-o", tmp_path / "last", "--train-on", "last_assistant", "-q")
    ((ids, labels),) = _samples(read_rows(tmp_path / "last")).values()
    assert "earlier answer" in _trained_text(base_tokenizer, ids, labels)
    bad = write_jsonl(tmp_path / "f.jsonl", [{"messages": [messages[0], {**messages[1], "weight": 0.5}]}])
    line = one_error_line(pack(bad, "-o", tmp_path / "bad", expect=1))
    assert "'weight' must be 0 or 1, not 0.5" in line


def test_an_empty_answer_is_counted_and_warned(tmp_path: Path, pack: Callable[..., Any]) -> None:
    records = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ZWSP}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "fine"}]},
    ]
    data = write_jsonl(tmp_path / "z.jsonl", records)
    result = pack(data, "--max-len", "128", "-o", tmp_path / "out", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["empty_answers"] == 1
    assert any("1 trained answer is empty or only whitespace" in w for w in summary["warnings"])
    assert "empty or only whitespace" in result.stderr
    fixed = json.loads(pack(data, "--max-len", "128", "-o", tmp_path / "fixed", "--fix-turns", "--json", "-q").stdout)
    # Cleaning changes tokens, so it is part of the cache key: the second run is not a hit of the first.
    assert fixed["cache"] == "miss"
    assert fixed["empty_answers"] == 0 and fixed["dropped"] == {"no_answer_after_fix": 1}


def test_fix_turns_log_needs_fix_turns_and_spares_inputs(tmp_path: Path, pack: Callable[..., Any]) -> None:
    data = write_jsonl(tmp_path / "g.jsonl", [{"messages": MESSAGES[2][0]}])
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--fix-turns-log", tmp_path / "log.jsonl", expect=2))
    assert "pass --fix-turns too" in line
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--fix-turns", "--fix-turns-log", data, expect=2))
    assert "is an input" in line


def test_stats_and_the_library_take_fix_turns(tmp_path: Path, cache_dir: Path) -> None:
    from typer.testing import CliRunner

    import packcli
    from packcli.cli import app

    data = write_jsonl(tmp_path / "s.jsonl", [{"conversations": c} for c, _ in SHAREGPT])
    argv = ["stats", str(data), "--max-len", "256", "--cache-dir", str(cache_dir), "--num-proc", "1", "--json"]
    result = CliRunner().invoke(app, [*argv, "--fix-turns"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["turns_fixed"]["merged"] == 1
    records = [{"messages": m} for m, _ in MESSAGES]
    done = packcli.pack(records, max_len=256, output=tmp_path / "lib", cache_dir=cache_dir, num_proc=1, fix_turns=True)
    assert done.summary["turns_fixed"]["role_renamed"] == 2 and done.dropped == {"no_answer_after_fix": 1}


def test_a_conversation_that_opens_with_an_answer_is_counted_and_warned(
    tmp_path: Path, pack: Callable[..., Any]
) -> None:
    greeting = {"role": "assistant", "content": "Hello! How can I help?"}
    records = [
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                greeting,
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ]
        },
        {"messages": [greeting, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    data = write_jsonl(tmp_path / "g.jsonl", records)
    result = pack(data, "--max-len", "128", "-o", tmp_path / "out", "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["leading_answers"] == 2 and summary["packed"] == 3
    words = "2 conversations open with an assistant turn that is trained as an answer to nothing"
    assert any(w.startswith(words) and w.endswith("pass --fix-turns to drop such turns") for w in summary["warnings"])
    assert words in result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["leading_answers"] == 2
    # Not trained, the greeting is context: nothing to warn about.
    last = pack(data, "--max-len", "128", "-o", tmp_path / "last", "--train-on", "last_assistant", "--json", "-q")
    assert json.loads(last.stdout)["leading_answers"] == 0
    fixed = pack(data, "--max-len", "128", "-o", tmp_path / "fixed", "--fix-turns", "--json", "-q")
    summary = json.loads(fixed.stdout)
    assert summary["leading_answers"] == 0 and summary["turns_fixed"]["leading_assistant_dropped"] == 2


def test_a_sharegpt_turn_is_its_role_and_text_with_its_other_keys_and_without_its_marks() -> None:
    """The speaker and the text alone make a message of two keys; any other key is kept, a training mark read
    and taken off; a field that names both the speaker and the text keeps the turn's other keys too."""
    record = {
        "conversations": [
            {"from": "human", "value": "q"},
            {"from": "gpt", "value": "a", "train": False, "name": "bot"},
            {"from": "human", "value": "more", "weight": 1},
            {"from": "gpt", "value": "b"},
        ]
    }
    sample = normalize(record, "conversations", dict(DEFAULT_FIELDS))
    assert sample.messages == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "name": "bot"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "b"},
    ]
    assert sample.message_train == (None, False, True, None)
    same = {**DEFAULT_FIELDS, "from": "x", "value": "x"}
    sample = normalize({"conversations": [{"x": "human", "y": 1}, {"x": "gpt", "y": 2}]}, "conversations", same)
    assert sample.messages == [
        {"role": "user", "content": "human", "y": 1},
        {"role": "assistant", "content": "gpt", "y": 2},
    ]
