"""The models' own tokenizers (tests/own_tokenizers.py): what the other template tests cannot show on DeepSeek's.

- The fast encoder gives the reference's ids and masks with each of the five tokenizers, and the encoder
  each one gets is the one the docs name.
- gpt-oss: a tokenizer without a chat template refuses chats; text and reasoning beside one call are
  refused naming the message; ``--expand-turns reasoning`` trains every message's reasoning and text
  once, each sample the template's rendering of its cut, and the summary counts what is left out after.
- Gemma 4's tool turns (Diffusion Gemma, v5): an answer with text and a call is packed, as the twin masks
  it but for the rules packcli names.
- Qwen3: the docs' example with its own template, and the empty think block it writes, counted.
- Every example of the docs that names its family renders as the docs show it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

trl = pytest.importorskip("trl")  # a test dependency (pyproject's test extra): never skipped in CI

from packcli.contract import IGNORE_INDEX  # noqa: E402
from packcli.errors import RecordError, TokenizerError  # noqa: E402
from packcli.records.formats import Sample  # noqa: E402
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder  # noqa: E402
from packcli.tokenize.encoders.text_encoders import ReferenceEncoder  # noqa: E402

from .conftest import make_conversations, read_rows, write_jsonl  # noqa: E402
from .test_templates import TRL_TEMPLATES, _runs, _trained_runs, as_template_takes  # noqa: E402

ROOT = Path(__file__).parents[1]
# The encoder each tokenizer gets (docs/explanation/encoder.md), and the template its chats render with
# here (None: the tokenizer's own).
ENCODERS = {"qwen3": "fastokens", "llama3_1": "fastokens", "gemma3": "fastokens", "gptoss": "fastokens"}
ENCODERS["gpt4o"] = "tokenizers"
CHAT_TEMPLATES = {"qwen3": None, "llama3_1": None, "gemma3": None, "gptoss": "gptoss", "gpt4o": "chatml"}


def _chats() -> list[list[dict[str, Any]]]:
    lines = (ROOT / "examples" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines[:100]] + make_conversations(40, seed=5, max_turns=4)


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_the_fast_encoder_gives_the_references_ids_and_masks(name: str, own_tokenizer: Any) -> None:
    """The encoder the probe chooses, and its ids and masks equal the reference's, record by record."""
    where, tokenizer = own_tokenizer(name)
    template = CHAT_TEMPLATES[name]
    path = str(TRL_TEMPLATES / f"{template}.jinja") if template not in (None, "chatml") else template
    encoder = Encoder(where, path, EncodeOptions())
    assert encoder.text.name == ENCODERS[name], encoder.choice.record()
    if name == "gpt4o":
        assert str(encoder.choice.fallback).startswith("fastokens cannot load the tokenizer (")
    items = [encoder.chat.spans(Sample("chat", messages=m), "assistant") for m in _chats()]
    got = encoder.text.encode_pieces(items, False)
    slow = encoder.text.slow_records  # records whose masks the fast encoder left to the reference
    eos = tokenizer.eos_token  # an added token inside the texts, and spans that cut words
    items += [(f"{eos}{text}{eos}", [(0, len(text) // 2)]) for text, _ in items[:40]]
    got += encoder.text.encode_pieces(items[len(got) :], False)
    want = ReferenceEncoder(encoder.backend).encode_pieces(items, False)
    for (ids, mask), (ref_ids, ref_mask) in zip(got, want, strict=True):
        assert np.array_equal(ids, ref_ids) and np.array_equal(mask, ref_mask)
    assert sum(mask.sum() for _, mask in got) > 0
    assert slow == 0  # every chat's pieces encode to its whole (or its bytes add up): no record slow


# -- gpt-oss -----------------------------------------------------------------------------------------


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


TOOLS = [
    {"type": "function", "function": {"name": n, "description": "A tool.", "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]


def _gptoss_trace(k: int) -> list[dict[str, Any]]:
    """Two exchanges: a call with its reasoning, the result, a final answer with its reasoning; arguments
    as an object in the first call, as JSON text in the second."""
    return [
        {"role": "user", "content": f"Weather in city {k}?"},
        {"role": "assistant", "thinking": f"CALL-A{k}: ask.", "tool_calls": [_call("get_weather", {"city": f"C{k}"})]},
        {"role": "tool", "content": f"OUT-A{k}: 18 C"},
        {"role": "assistant", "content": f"ANSWER-A{k}: it is 18 C.", "thinking": f"FINAL-A{k}: report it."},
        {"role": "user", "content": "And the time?"},
        {"role": "assistant", "thinking": f"CALL-B{k}: clock.", "tool_calls": [_call("get_time", '{"zone": "CET"}')]},
        {"role": "tool", "content": f"OUT-B{k}: 10:00"},
        {"role": "assistant", "content": f"ANSWER-B{k}: ten o'clock.", "thinking": f"FINAL-B{k}: say the time."},
    ]  # fmt: skip


def _samples(out: Path) -> dict[tuple[int, int], tuple[list[int], list[int]]]:
    """Each packed sample by (record, piece): its ids and labels."""
    found = {}
    for row in read_rows(out):
        at = 0
        pieces = row.get("piece_index") or [0] * len(row["seq_lengths"])
        for n, k, piece in zip(row["seq_lengths"], row["sample_index"], pieces, strict=True):
            found[(k, piece)] = (row["input_ids"][at : at + n], row["labels"][at : at + n])
            at += n
    return found


def test_gptoss_expansion_trains_every_reasoning_and_answer_once(pack: Any, own_tokenizer: Any, tmp_path: Path) -> None:
    where, tokenizer = own_tokenizer("gptoss")
    template = TRL_TEMPLATES / "gptoss.jinja"
    traces = [_gptoss_trace(k) for k in range(4)]
    data = write_jsonl(tmp_path / "agent.jsonl", [{"messages": m, "tools": TOOLS} for m in traces])
    common = ("--tokenizer", where, "--chat-template", template, "--max-len", 4096, "--json")
    whole = json.loads(pack(data, "-o", tmp_path / "whole", *common).stdout)
    # Not expanded: each call's reasoning, and the first final answer's, are left out (3 of 4 turns).
    assert whole["reasoning"]["turns"] == 16 and whole["reasoning"]["turns_left_out"] == 12
    summary = json.loads(pack(data, "-o", tmp_path / "out", *common, "--expand-turns", "reasoning").stdout)
    assert summary["expanded"]["records"] == 4 and summary["expanded"]["samples"] == 16
    assert summary["reasoning"] == {
        "turns": 16, "turns_left_out": 0, "records_left_out": 0, "records_last_round_only": 0, "empty_think": 0
    }  # fmt: skip
    assert not any("reasoning" in w for w in summary["warnings"])
    samples = _samples(tmp_path / "out")
    assert sorted(samples) == [(k, p) for k in range(4) for p in range(4)]
    text = template.read_text(encoding="utf-8")
    trained = []
    for (k, piece), (ids, labels) in sorted(samples.items()):
        cut = traces[k][: 2 * piece + 2]  # every assistant message ends a sample of its own
        cut = as_template_takes("gptoss", cut)  # the second call's arguments as the object the template takes
        ref = tokenizer.apply_chat_template(cut, tools=TOOLS, chat_template=text, tokenize=True, return_dict=True)
        assert ids == list(ref["input_ids"]), (k, piece)
        runs = _trained_runs(ids, np.array(labels), tokenizer)
        assert len(runs) == 1 and runs[0].endswith(("<|call|>", "<|return|>")), runs  # the last message only
        trained.append(runs[0])
    every = "\x00".join(trained)
    for trace in traces:
        for m in trace:
            if m["role"] == "assistant":
                for value in (m.get("content"), m["thinking"]):
                    assert value is None or every.count(value) == 1, value  # trained once, over all samples
                for call in m.get("tool_calls", []):
                    assert every.count(f"functions.{call['function']['name']}") >= 1
            else:
                assert m["content"] not in every  # no user text, no tool result


def test_gptoss_names_the_call_that_has_text_and_reasoning(own_tokenizer: Any) -> None:
    where, _ = own_tokenizer("gptoss")
    encoder = Encoder(where, str(TRL_TEMPLATES / "gptoss.jinja"), EncodeOptions())
    messages = _gptoss_trace(0)
    messages[5] = {**messages[5], "content": "Let me look."}
    result = encoder.encode_batch([Sample("chat", messages=messages, tools=TOOLS)])[0]
    assert isinstance(result, RecordError) and result.reason == "template_error"
    assert result.detail.startswith(
        "message 5 (assistant) has both text (content) and reasoning (thinking) beside its tool call, and this "
        "model's format carries either text or reasoning beside a call (the chat template raised: Cannot pass both"
    )
    assert result.detail.endswith("keep one of them: move the text into the reasoning, or leave one out")


def test_a_tokenizer_without_a_chat_template_refuses_chats_until_one_is_given(
    pack: Any, own_tokenizer: Any, tmp_path: Path
) -> None:
    where, _ = own_tokenizer("gptoss")  # its tokenizer_config.json has no chat template
    chats = make_conversations(3, seed=1)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    failed = pack(data, "--tokenizer", where, "-o", tmp_path / "a", expect=1)
    assert failed.stderr.strip().splitlines()[-1] == (
        f"Error: tokenizer '{where}' has no chat template, and ChatML's role markers (<|im_start|>, <|im_end|>) "
        "are not tokens of it: chats rendered so would be in a format the model was never trained on; pass the "
        "model's chat template as --chat-template FILE.jinja"
    )
    assert not (tmp_path / "a").exists()
    plain = Encoder(where, None, EncodeOptions())
    with pytest.raises(TokenizerError, match="has no chat template"):
        plain.encode_batch([Sample("chat", messages=chats[0])])
    assert not isinstance(plain.encode_batch([Sample("text", text="Plain text needs no template.")])[0], RecordError)
    given = Encoder(where, "chatml", EncodeOptions())  # given: today's warning, and encoded
    assert given.warnings and "are not single tokens of tokenizer" in given.warnings[0].render()
    assert not any(isinstance(r, RecordError) for r in given.encode_batch([Sample("chat", messages=m) for m in chats]))


# -- Gemma 4's tool turns ----------------------------------------------------------------------------

TOOL_OUTPUT = "SECRET TOOL OUTPUT 18 C"


def _text_and_call() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "What does the tool say?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [_call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": TOOL_OUTPUT},
        {"role": "assistant", "content": "It is 18 degrees."},
    ]


@pytest.mark.parametrize("name", ["diffusion_gemma", "gemma4_v5"])
def test_gemma4_answers_with_text_and_a_call_are_packed(name: str, own_tokenizer: Any, template_encoders: Any) -> None:
    """The call through its end marker and the answer's text are trained, the tool's response between
    them never; Diffusion Gemma's twin masks the same but for the two rules packcli names."""
    tokenizer = own_tokenizer("gemma4")[1]
    messages, tools = _text_and_call(), TOOLS[:1]
    encoder = template_encoders[name]  # on the same tokenizer (conftest.OWN_TOKENIZER)
    result = encoder.encode_batch([Sample("chat", messages=messages, tools=tools)])[0]
    assert not isinstance(result, RecordError), result.detail
    ids, labels = result
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    ref = tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=True, return_dict=True)
    assert ids.tolist() == list(ref["input_ids"])
    runs = _trained_runs(ids.tolist(), labels, tokenizer)
    call = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>'
    if name == "gemma4_v5":  # the text runs into the next answer's: one trained run
        assert runs == [call, "Let me check.It is 18 degrees.<turn|>"]
        return
    assert runs == [call, "Let me check.", "It is 18 degrees.<turn|>"]
    twin = (TRL_TEMPLATES / f"{name}_training.jinja").read_text(encoding="utf-8")
    out = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=twin, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert list(out["input_ids"]) == ids.tolist()
    twin_mask = np.array(out["assistant_masks"], dtype=bool)
    differ = [tokenizer.decode(ids[a:b].tolist()) for a, b in _runs(twin_mask != (labels != IGNORE_INDEX))]
    # packcli trains the marker a call ends with (the model stops there); the twin the newline after <turn|>.
    assert differ == ["<|tool_response>", "\n"]


# -- Qwen3 --------------------------------------------------------------------------------------------


def test_qwen3s_own_template_trains_an_empty_think_block_in_the_last_answer_counted(
    pack: Any, own_tokenizer: Any, tmp_path: Path
) -> None:
    where, tokenizer = own_tokenizer("qwen3")
    chats = make_conversations(12, seed=4, max_turns=3)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    summary = json.loads(pack(data, "--tokenizer", where, "-o", tmp_path / "out", "--json").stdout)
    assert summary["template_source"] == "tokenizer"
    assert summary["reasoning"] == {
        "turns": 0, "turns_left_out": 0, "records_left_out": 0, "records_last_round_only": 0, "empty_think": 12
    }  # fmt: skip
    for ids, labels in _samples(tmp_path / "out").values():
        runs = _trained_runs(ids, np.array(labels), tokenizer)
        assert [r.startswith("<think>\n\n</think>\n\n") for r in runs] == [False] * (len(runs) - 1) + [True]


# -- the docs' examples --------------------------------------------------------------------------------

EXAMPLE = re.compile(r"<!-- renders with: (\S+) (\S+) -->\n+```json\n(.*?)```\n+(`{3,})text\n(.*?)\4\n", re.S)
PAGES = ("guides/agentic.md", "guides/templates-and-labels.md")


def _shown(ids: list[int], labels: np.ndarray, tokenizer: Any) -> str:
    """The rendering as the docs show it: each trained run between ⟦ and ⟧."""
    out, at = [], 0
    for a, b in _runs(labels != IGNORE_INDEX):
        out += [tokenizer.decode(ids[at:a]), "⟦", tokenizer.decode(ids[a:b]), "⟧"]
        at = b
    return "".join([*out, tokenizer.decode(ids[at:])])


def test_every_docs_example_renders_as_shown_with_its_models_template(own_tokenizer: Any) -> None:
    """Each ``<!-- renders with: TOKENIZER TEMPLATE -->`` record (TEMPLATE a trl template, or "own") packs to
    the rendering shown under it, ⟦trained⟧; a line "..." stands for text the page leaves out."""
    examples = [(page, *found) for page in PAGES for found in EXAMPLE.findall((ROOT / "docs" / page).read_text())]
    assert {e[1] for e in examples} >= {"qwen3", "gptoss", "llama3_1", "deepseek", "gemma4"}, examples
    for page, family, template, record, _, shown in examples:
        where, tokenizer = own_tokenizer(family)
        path = None if template == "own" else str(TRL_TEMPLATES / f"{template}.jinja")
        if template == "deepseek":
            path = "deepseek"
        given = json.loads(record)
        encoder = Encoder(where, path, EncodeOptions())
        result = encoder.encode_batch([Sample("chat", messages=given["messages"], tools=given.get("tools"))])[0]
        assert not isinstance(result, RecordError), (page, family, result.detail)
        rendered = _shown(result[0].tolist(), result[1], tokenizer)
        pattern = "\n(?s:.*?)\n".join(re.escape(part) for part in shown.rstrip("\n").split("\n...\n"))
        assert re.fullmatch(pattern, rendered.removesuffix("\n")), (page, family, rendered)  # a block ends a line
