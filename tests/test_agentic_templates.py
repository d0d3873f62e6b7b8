"""Agent traces over every ``trl`` template whose text mentions ``tool_calls``: exact, or refused and counted.

For each template and each trace (arguments as an object and as a JSON string, two calls in one turn,
the function named in the user's text, reasoning in three rounds):

- either the record is packed: token ids equal ``apply_chat_template`` of the messages with the arguments
  in the form the template takes, every call's function and argument names are trained, tool outputs are
  not, and labels equal the twin's assistant mask where the twin renders the same tokens;
- or it is refused, with the reason the template gives: ``template_error`` where ``apply_chat_template``
  raises too, ``tool_calls_not_rendered`` where rendering without the calls changes nothing the answers
  train, ``template_spans_not_found`` where the answer cannot be cut.

Never a record trained without its call. And the reasoning count: the turns whose reasoning a template
leaves out, confirmed turn by turn (each turn's reasoning replaced by a unique text, looked for in the
rendering), and per template family as measured (docs/guides/agentic.md).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

trl = pytest.importorskip("trl")  # a test dependency (pyproject's test extra): never skipped in CI

from packcli.contract import IGNORE_INDEX  # noqa: E402
from packcli.errors import RecordError  # noqa: E402
from packcli.records.formats import Sample  # noqa: E402
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder  # noqa: E402
from packcli.tokenize.templates.choice import builtin_template  # noqa: E402

from .test_templates import (  # noqa: E402
    AFTER_TOOL_HEADERS,
    BOTH_FORMS,
    STRING_ARGUMENTS,
    TOOL_TEMPLATES,
    TRL_TEMPLATES,
    TWIN_DIFFERS_ON_TOOL_CALLS,
    TWIN_NOT_COMPARABLE,
    TWIN_RENDERS_OTHERWISE,
    _check_against_twin,
    _trained_runs,
    as_template_takes,
)

OUTPUTS = ("SECRET-OUT-ONE", "SECRET-OUT-TWO")


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _trace(case: str) -> list[dict[str, Any]]:
    weather = {"city": "Paris", "unit": "celsius"}
    if case == "object_args":
        calls, content = [_call("get_weather", weather)], None
    elif case == "string_args":
        calls, content = [_call("get_weather", json.dumps(weather))], None
    elif case == "two_calls":
        calls, content = [_call("get_weather", weather), _call("get_time", {"zone": "CET"})], None
    else:  # named_in_text: text before the call, and the user names the function
        calls, content = [_call("get_weather", weather)], "Let me check."
    user = "Use get_weather for Paris." if case == "named_in_text" else "Weather in Paris?"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": content, "tool_calls": calls},
    ]
    messages += [{"role": "tool", "content": OUTPUTS[k]} for k in range(len(calls))]
    messages.append({"role": "assistant", "content": "It is 18 degrees."})
    return messages


def _schemas(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    return [
        {"type": "function", "function": {"name": n, "description": "A tool.", "parameters": {"type": "object"}}}
        for n in dict.fromkeys(names)
    ]


@pytest.fixture(scope="module")
def encoders(template_encoders: dict[str, Encoder]) -> dict[str, Encoder]:
    return template_encoders


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, template: str, **kw: Any) -> Any:
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=True, return_dict=True, **kw
    )


def _calls_left_out(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, template: str) -> bool:
    """Return whether rendering without the first answer's calls leaves some call's name as often as with them
    (gpt-oss renders the first call of a turn only; DeepSeek-R1-Distill none where the content is not null)."""
    without = [dict(m) for m in messages]
    without[1] = {k: v for k, v in without[1].items() if k != "tool_calls"}
    without[1]["content"] = without[1].get("content") or ""
    full = tokenizer.decode(_render(tokenizer, messages, tools, template)["input_ids"])
    try:
        other = tokenizer.decode(_render(tokenizer, without, tools, template)["input_ids"])
    except Exception:  # tool results need a call before them (gpt-oss): the first message and the tools alone
        other = tokenizer.decode(_render(tokenizer, messages[:1], tools, template)["input_ids"])
    names = [c["function"]["name"] for c in messages[1]["tool_calls"]]
    return any(full.count(n) == other.count(n) for n in names)


@pytest.mark.parametrize("case", ["object_args", "string_args", "two_calls", "named_in_text"])
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_agent_traces_are_exact_or_refused(
    name: str, case: str, encoders: dict[str, Encoder], template_tokenizer: Any
) -> None:
    tokenizer = template_tokenizer(name)[1]
    given = _trace(case)
    tools = _schemas(given)
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    result = encoders[name].encode_batch([Sample("chat", messages=given, tools=tools)])[0]
    messages = as_template_takes(name, given)
    try:
        ref = _render(tokenizer, messages, tools, template)
    except Exception:
        assert isinstance(result, RecordError) and result.reason == "template_error", (name, result)
        return
    if isinstance(result, RecordError):
        if result.reason == "tool_calls_not_rendered":
            # Refused only where the template does leave a call out (DeepSeek-R1-Distill with content).
            assert _calls_left_out(tokenizer, messages, tools, template), (name, result.detail)
            return
        assert result.reason == "template_spans_not_found" and case == "named_in_text", (name, result.detail)
        return
    ids, labels = result
    assert ids.tolist() == list(ref["input_ids"]), f"{name}: token ids differ from apply_chat_template"
    trained = "\x00".join(_trained_runs(ids.tolist(), labels, tokenizer))
    for call in messages[1]["tool_calls"]:  # never an answer trained without its call
        assert call["function"]["name"] in trained, f"{name}: the call {call['function']['name']} is not trained"
    assert "city" in trained and "Paris" in trained, f"{name}: the call's arguments are not trained"
    assert "It is 18 degrees." in trained
    assert not any(out in trained for out in OUTPUTS), f"{name}: a tool's output is trained"
    twin_path = TRL_TEMPLATES / f"{name}_training.jinja"
    if not twin_path.exists() or name in TWIN_NOT_COMPARABLE or name in TWIN_DIFFERS_ON_TOOL_CALLS:
        return
    twin = twin_path.read_text(encoding="utf-8")  # DeepSeek-V3's twin takes the arguments as an object
    twin_messages = as_template_takes(f"{name}_training", given)
    out = _render(tokenizer, twin_messages, tools, twin, return_assistant_tokens_mask=True)
    if list(out["input_ids"]) != ids.tolist():
        assert name in TWIN_RENDERS_OTHERWISE or name == "deepseekv3", f"{name}: the twin renders other tokens"
        return
    mask = np.array(out["assistant_masks"], dtype=bool)
    mask[0] = False
    prompt = encoders[name].shape().generation_prompt
    _check_against_twin(name, ids.tolist(), labels != IGNORE_INDEX, mask, tokenizer, prompt, AFTER_TOOL_HEADERS)


# DeepSeek-R1-Distill renders a call only when the content is null, which apply_chat_template drops with
# the key: no probe call renders, and its records' arguments pass as they are.
NO_FORM = {"deepseek_r1_distill"}


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_each_template_takes_the_arguments_form_it_renders(name: str, encoders: dict[str, Encoder]) -> None:
    takes = encoders[name].chat.arguments_forms()
    if name in NO_FORM:
        assert takes == (False, False)
    elif name in BOTH_FORMS:
        assert takes == (True, True)
    else:
        assert takes == (name not in STRING_ARGUMENTS, name in STRING_ARGUMENTS)


# -- reasoning ---------------------------------------------------------------------------------------------


def reasoning_trace(reasoning: list[str], key: str = "reasoning_content", repeat: bool = False) -> list[dict[str, Any]]:
    """A call, its result, a report, a second question and its answer: three rounds with reasoning
    (``repeat``: each answer's text starts with its reasoning, as traces that echo it do)."""
    call = _call("get_weather", {"city": "Paris"})
    if repeat:
        out = reasoning_trace(reasoning, key)
        for m in out[3::2]:
            m["content"] = f"{m[key]} {m['content']}"
        return out
    return [
        {"role": "user", "content": "Use get_weather for Paris."},
        {"role": "assistant", "content": "", key: reasoning[0], "tool_calls": [call]},
        {"role": "tool", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C.", key: reasoning[1]},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Likely the same.", key: reasoning[2]},
    ]


REASONING = ["I call the weather tool first.", "The tool says 18 C.", "No forecast: say it is likely the same."]
# Measured (docs/guides/agentic.md): templates that render only the last round's reasoning, none, or all.
LAST_ROUND_ONLY = {
    "qwen3",
    "qwen3_5_think",
    "qwen3_5_nothink",
    "qwen3_6",
    "glm4moe",
    "nemotron_3_nano",
    "nemotron_3_super",
    "nemotron_3_ultra",
    "nemotron_3_5_lightning",
}
NO_REASONING = {"qwen2_5", "qwen3_instruct_2507", "qwen3_vl", "lfm2_v2"}
# Templates that render a call's reasoning only while no final answer follows it (gpt-oss): the expansion
# cuts after the call too.
CALL_REASONING_DROPPED = {"gptoss"}
EVERY_ROUND = {"qwen3_8", "muse_glimmer"}


def _left_out_one_by_one(name: str, tokenizer: Any, template: str, tools: Any, key: str, repeat: bool) -> int:
    """Count the turns whose reasoning is not in the rendering: each turn's replaced by a unique text in turn."""
    left = 0
    for k in range(3):
        marked = [f"QZXREASON{j}" if j == k else r for j, r in enumerate(REASONING)]
        messages = as_template_takes(name, reasoning_trace(marked, key))
        if repeat:  # the answers' text as in the record (the marked turn's reasoning only is replaced)
            real = reasoning_trace(REASONING, key, repeat=True)
            for m, r in zip(messages, as_template_takes(name, real), strict=True):
                m["content"] = r["content"]
        rendered = tokenizer.decode(_render(tokenizer, messages, tools, template)["input_ids"])
        left += f"QZXREASON{k}" not in rendered
    return left


@pytest.mark.parametrize("repeat", [False, True], ids=["own_text", "echoed_in_answer"])
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_the_reasoning_count_is_the_turns_the_template_leaves_out(
    name: str, repeat: bool, encoders: dict[str, Encoder], template_tokenizer: Any
) -> None:
    tokenizer = template_tokenizer(name)[1]
    key = "thinking" if name == "gptoss" else "reasoning_content"
    given = reasoning_trace(REASONING, key, repeat)
    tools = _schemas(given)
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    encoder = encoders[name]
    sample = Sample("chat", messages=given, tools=tools)
    try:
        made = encoder.chat.rendered(sample, "assistant")
    except RecordError as err:
        assert err.reason in ("template_error", "tool_calls_not_rendered", "template_spans_not_found"), err
        return
    assert made.reasoning is not None and made.reasoning.turns == 3
    expected = _left_out_one_by_one(name, tokenizer, template, tools, key, repeat)
    assert made.reasoning.left_out == expected, name
    if name in LAST_ROUND_ONLY:
        assert expected == 2 and made.reasoning.last_only, name
    if name in NO_REASONING:
        assert expected == 3, name
    if name in EVERY_ROUND:
        assert expected == 0, name


def test_packclis_deepseek_template_keeps_every_rounds_reasoning(model_tokenizer: tuple[str, Any]) -> None:
    """The default template renders reasoning as DeepSeek's thinking format does: <think>...</think> first."""
    tokenizer = model_tokenizer[1]
    given = reasoning_trace(REASONING)
    encoder = Encoder(None, None, EncodeOptions())
    made = encoder.chat.rendered(Sample("chat", messages=given), "assistant")
    assert made.reasoning is not None and (made.reasoning.turns, made.reasoning.left_out) == (3, 0)
    ids, labels = encoder.encode_batch([Sample("chat", messages=given)])[0]
    ref = tokenizer.apply_chat_template(
        given, chat_template=builtin_template("deepseek"), tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    assert ids.tolist() == list(ref["input_ids"])
    runs = _trained_runs(ids.tolist(), labels, tokenizer)
    assert [r.startswith("<think>") for r in runs] == [True, True, True]
    assert all(f"<think>\n{text}\n</think>\n\n" in run for text, run in zip(REASONING, runs, strict=True))


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_expanded_rounds_train_every_reasoning_once(
    name: str, encoders: dict[str, Encoder], template_tokenizer: Any
) -> None:
    """--expand-turns all on the three-round trace: ids equal apply_chat_template of each cut; each answer
    and (where the template renders a last round's reasoning) each reasoning trained exactly once over the
    rounds; the tool's output never."""
    from packcli.tokenize.templates import rounds

    tokenizer = template_tokenizer(name)[1]
    key = "thinking" if name == "gptoss" else "reasoning_content"
    given = reasoning_trace(REASONING, key)
    tools = _schemas(given)
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    encoder = encoders[name]
    sample = Sample("chat", messages=given, tools=tools)
    whole = encoder.encode_batch([sample])[0]
    if isinstance(whole, RecordError):
        assert whole.reason in ("template_error", "tool_calls_not_rendered", "template_spans_not_found"), whole
        return
    expansion = rounds.expand(encoder, [sample], [whole], "all")
    made = expansion.results[0]
    if isinstance(made, RecordError):  # a cut the template cannot render on its own
        assert made.reason in ("template_error", "template_spans_not_found"), made
        return
    # gpt-oss drops a call's analysis once a final answer follows: the call ends a sample of its own.
    cuts = ((4, REASONING[:2]), (6, REASONING[2:]))
    if name in CALL_REASONING_DROPPED:
        cuts = ((2, REASONING[:1]), (4, REASONING[1:2]), (6, REASONING[2:]))
    assert isinstance(made, rounds.Rounds) and len(made) == len(cuts)
    per_round = []
    for (ids, labels), (cut, own) in zip(made, cuts, strict=True):
        ref = _render(tokenizer, as_template_takes(name, given[:cut]), tools, template)
        assert ids.tolist() == list(ref["input_ids"]), f"{name}: round ending at {cut} differs"
        text = "\x00".join(_trained_runs(ids.tolist(), labels, tokenizer))
        rendered = tokenizer.decode(ids.tolist())
        for reasoning in own:  # a round's reasoning is trained where the template renders it (a last round)
            assert text.count(reasoning) == (reasoning in rendered), (name, reasoning)
        per_round.append(text)
    assert expansion.extra_tokens == sum(len(ids) for ids, _ in made) - len(whole[0]) > 0
    trained = "\x00".join(per_round)
    assert "18 C\x00" not in trained and "Use get_weather" not in trained
    assert "get_weather" in per_round[0] and "get_weather" not in per_round[1], name
    for answer in ("It is 18 C.", "Likely the same."):
        assert trained.count(answer) == 1, (name, answer)
    for reasoning in REASONING:  # never twice: an earlier round is context in the later cuts
        assert trained.count(reasoning) <= 1, (name, reasoning)
    if name in LAST_ROUND_ONLY or name in EVERY_ROUND or name in CALL_REASONING_DROPPED:
        assert all(trained.count(r) == 1 for r in REASONING), name
