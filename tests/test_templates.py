"""Exact labels with the official chat templates of real model families, as the ``trl`` package ships them.

Every template in ``trl/chat_templates`` is read as test data (nothing is copied into the repository).
For each one, on a few hundred multi-turn conversations:

- token ids equal ``tokenizer.apply_chat_template(messages, chat_template=T)``;
- no conversation that the template renders is dropped;
- every assistant answer is trained and no system or user text is;
- where the template has a ``*_training.jinja`` twin with ``{% generation %}`` blocks that renders the
  same tokens, the labels equal the twin's assistant mask, except for two differences that packcli's
  rule explains and that the test names: the twin also trains (a) whitespace and the tokenizer's EOS
  after the end-of-turn marker, or (b) the generation prompt (the role header, and what the prompt adds
  after it, such as ``<think>\\n``), which is the prompt at inference and so not trained here.
"""

from __future__ import annotations

import importlib.util
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
from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir  # noqa: E402

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
ORIGINALS = sorted(p.stem for p in TRL_TEMPLATES.glob("*.jinja") if not p.stem.endswith("_training"))
# Vision-language templates that only render content parts: a string content is passed as one text part.
PARTS_ONLY = {"idefics3", "smolvlm", "llava_next"}
# Twins that render other tokens than the original, so their masks cannot be compared token by token.
EMPTY_THINK = "<think>\n\n</think>\n\n"
# The twin always shows an (empty) think block; the original drops it from earlier answers.
TWIN_RENDERS_OTHERWISE = {"qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6"}
# The twin moves the next role's marker into the answer, so its tokens differ from the original's.
TWIN_NOT_COMPARABLE = {"glm4moe"}
N_CONVERSATIONS = 300


def _corpus_module() -> Any:
    path = Path(__file__).parents[1] / "benchmarks" / "make_chat_corpus.py"
    spec = importlib.util.spec_from_file_location("make_chat_corpus", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    """Multi-turn chat (2 to 12 answers; system turns, markdown, code, non-ASCII) from the corpus generator."""
    corpus = _corpus_module()
    pool = (corpus.make_conversation(7, i, 150, 0.6)["messages"] for i in range(10 * N_CONVERSATIONS))
    multi_turn = (m for m in pool if sum(x["role"] == "assistant" for x in m) >= 2)
    return [m for m, _ in zip(multi_turn, range(N_CONVERSATIONS), strict=False)]


def _as_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Return the [start, end) runs of True in a boolean array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _check_against_twin(
    name: str,
    ids: list[int],
    ours: np.ndarray,
    twin: np.ndarray,
    tokenizer: Any,
    generation_prompt: str,
    headers: tuple[str, ...] = (),
) -> None:
    """Labels equal the twin's mask but for the two differences the module docstring names.

    ``headers``: other texts that the template puts before an answer in place of the generation prompt
    (the marker that closes tool output, in DeepSeek's templates).
    """
    eos = tokenizer.eos_token or "\0"
    for start, end in _runs(ours != twin):
        text = tokenizer.decode(ids[start:end])
        assert twin[start:end].all() and not ours[start:end].any(), (
            f"{name}: packcli trains {text!r}, which the twin does not"
        )
        after_ours = start > 0 and ours[start - 1]
        before_ours = end < len(ours) and ours[end]
        if after_ours and text.replace(eos, "").strip() == "":
            continue  # (a) whitespace and EOS after the end-of-turn marker
        if before_ours and (text in generation_prompt or text in headers):
            continue  # (b) the generation prompt: the role header and what the prompt adds after it
        pytest.fail(f"{name}: the twin also trains {text!r} at token {start}, which no rule of packcli explains")


def _no_empty_think(run: str) -> str:
    return re.sub(r"^(?:<think>)?\n*</think>\n\n", "", run).rstrip()


def _trained_runs(ids: list[int], labels: np.ndarray, tokenizer: Any) -> list[str]:
    return [tokenizer.decode(ids[a:b]) for a, b in _runs(labels != IGNORE_INDEX)]


@pytest.mark.parametrize("name", ORIGINALS)
def test_official_template(
    name: str, conversations: list[Any], template_tokenizer: Any, template_encoders: dict[str, Encoder]
) -> None:
    tokenizer = template_tokenizer(name)[1]  # the model's own tokenizer where one is at hand
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    twin_path = TRL_TEMPLATES / f"{name}_training.jinja"
    twin = twin_path.read_text(encoding="utf-8") if twin_path.exists() else None
    encoder = template_encoders[name]
    results = encoder.encode_batch([Sample("chat", messages=m) for m in conversations])
    compared = 0
    for messages, result in zip(conversations, results, strict=True):
        given = _as_parts(messages) if name in PARTS_ONLY else messages
        try:
            ref = tokenizer.apply_chat_template(given, chat_template=template, tokenize=True, return_dict=True)
        except Exception:
            # The template itself refuses the conversation (gemma has no system role): so must packcli.
            assert isinstance(result, RecordError) and result.reason == "template_error", (name, result)
            continue
        assert not isinstance(result, RecordError), f"{name}: {result.reason}: {result.detail}"
        ids, labels = result
        assert ids.tolist() == list(ref["input_ids"]), f"{name}: token ids differ from apply_chat_template"
        runs = _trained_runs(ids.tolist(), labels, tokenizer)
        trained = "\x00".join(runs)
        for m in messages:
            text = m["content"].strip()
            if m["role"] == "assistant":
                assert any(text in run for run in runs), f"{name}: an assistant answer is not trained"
            elif len(text) > 12:
                assert text not in trained, f"{name}: {m['role']} text is trained"
        if twin is None or name in TWIN_NOT_COMPARABLE:
            continue
        out = tokenizer.apply_chat_template(
            given, chat_template=twin, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        mask = np.array(out["assistant_masks"], dtype=bool)
        if list(out["input_ids"]) == ids.tolist():
            mask[0] = False  # packcli never trains a sample's first token
            _check_against_twin(
                name, ids.tolist(), labels != IGNORE_INDEX, mask, tokenizer, encoder.shape().generation_prompt
            )
        else:
            # Compare answer by answer, without the empty think block that the twin adds to earlier answers
            # (and that both show on the last one, where packcli leaves the generation prompt's part).
            assert name in TWIN_RENDERS_OTHERWISE, f"{name}: the twin renders other tokens"
            twin_ids = list(out["input_ids"])
            twin_runs = [tokenizer.decode(twin_ids[a:b]) for a, b in _runs(mask)]
            assert [_no_empty_think(r) for r in runs] == [_no_empty_think(r) for r in twin_runs], name
        compared += 1
    if twin is not None and name not in TWIN_NOT_COMPARABLE:
        assert compared >= N_CONVERSATIONS // 3, f"{name}: only {compared} conversations compared with the twin"


# -- reasoning, tools, content parts, template keyword arguments ---------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _tool_conversation(reasoning_key: str = "reasoning_content") -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What is the weather in Paris right now?"},
        {
            "role": "assistant",
            "content": None,
            reasoning_key: "The user wants current weather, so I call the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temperature_c": 18, "sky": "cloudy"}'},
        {"role": "assistant", "content": "It is 18 °C and cloudy in Paris.", reasoning_key: "Report the tool result."},
        {"role": "user", "content": "Thanks! And should I take an umbrella?"},
        {"role": "assistant", "content": "<think>\nCloudy, no rain mentioned.\n</think>\n\nNo umbrella needed today."},
    ]


def _encode_one(encoder: Encoder, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
    result = encoder.encode_batch([sample])[0]
    assert not isinstance(result, RecordError), result
    return result


@pytest.mark.parametrize("name", ["qwen3", "qwen3_6", "gptoss", "nemotron_3_nano", "deepseekv3"])
def test_reasoning_and_tool_calls(name: str, template_tokenizer: Any, template_encoders: dict[str, Encoder]) -> None:
    tokenizer = template_tokenizer(name)[1]
    template_file = str(TRL_TEMPLATES / f"{name}.jinja")
    template = Path(template_file).read_text(encoding="utf-8")
    reasoning_key = "thinking" if name == "gptoss" else "reasoning_content"
    messages = _tool_conversation(reasoning_key)
    if name == "gptoss":  # its template wants no think tags in content, and the thinking field instead
        messages[-1] = {"role": "assistant", "content": "No umbrella needed today.", "thinking": "No rain."}
        messages[2]["content"] = ""
    if name == "deepseekv3":  # its template concatenates arguments as a string
        messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Paris"})
        messages[2]["content"] = ""
    encoder = template_encoders[name]
    ids, labels = _encode_one(encoder, Sample("chat", messages=messages, tools=[WEATHER_TOOL]))
    ref = tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], chat_template=template, tokenize=True, return_dict=True
    )
    assert ids.tolist() == list(ref["input_ids"])
    runs = _trained_runs(ids.tolist(), labels, tokenizer)
    trained = "\x00".join(runs)
    assert len(runs) == 3  # three answers: the tool call, the report, the last answer
    assert "Paris" in runs[0] and "get_weather" in runs[0]  # the tool call is trained
    assert "18 °C and cloudy" in runs[1]
    assert "No umbrella needed today." in runs[2]
    if name != "deepseekv3":  # DeepSeek-V3's template drops reasoning; the others show the last one
        assert "No rain" in runs[2] or "Cloudy, no rain" in runs[2]
    for text in ("temperature_c", "weather assistant", "What is the weather", "umbrella?", "Get the current"):
        assert text not in trained, f"{name}: {text!r} is trained"
    for run, end in zip(runs, encoder.shape().end_markers * 3, strict=False):
        assert any(run.endswith(m) for m in encoder.shape().end_markers), (name, run[-30:], end)


# Templates that render tool calls, and small tool-calling conversations in the shapes that datasets hold.
TOOL_TEMPLATES = [n for n in ORIGINALS if "tool_calls" in (TRL_TEMPLATES / f"{n}.jinja").read_text(encoding="utf-8")]
TOOL_OUTPUT = "SECRET TOOL OUTPUT 18 C"


def _call(name: str, arguments: Any, content: str | None, **extra: Any) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": content, **extra, "tool_calls": [call]}


TOOL_CASES = {
    # gpt-oss's own format: no content at all, the reasoning under "thinking"
    "null_content": _call("get_weather", {"city": "Paris"}, None, thinking="I should call the tool."),
    # arguments without text (numbers, booleans, no arguments), and an argument named like a structural key
    "numeric_args": _call("get_forecast", {"days": 3}, None),
    "no_args": _call("get_time", {}, ""),
    "mixed_args": _call("get_forecast", {"days": 3, "metric": True, "name": "Paris"}, None),
    # an answer with text and a call: some templates render the tool's output inside the same turn (Gemma 4)
    "content_and_call": _call("get_weather", {"city": "Paris"}, "Let me check."),
}


def _tool_case(case: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "What does the tool say?"},
        TOOL_CASES[case],
        {"role": "tool", "content": TOOL_OUTPUT},
        {"role": "assistant", "content": "It says it is 18 degrees."},
    ]


# Templates that write a call's arguments as given, a string (a mapping fails to render): packcli passes an
# object of arguments to them as JSON text (packcli.tokenize.templates.agentic); the others take the object as it is.
STRING_ARGUMENTS = {"deepseekv3"}
# Templates that render both forms, each its own way (a string as given): the arguments pass as they are.
BOTH_FORMS = {"gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "qwen3", "qwen3_instruct_2507", "qwen3_vl"}
BOTH_FORMS |= {f"{n}_training" for n in BOTH_FORMS}


def as_template_takes(name: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the messages with each call's arguments in the form template ``name`` takes them."""
    out = []
    for m in messages:
        calls = []
        for call in m.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            if name in BOTH_FORMS:
                pass
            elif name in STRING_ARGUMENTS and isinstance(arguments, dict):
                arguments = json.dumps(arguments, ensure_ascii=False)
            elif name not in STRING_ARGUMENTS and isinstance(arguments, str):
                arguments = json.loads(arguments)
            calls.append({**call, "function": {**call["function"], "arguments": arguments}})
        out.append({**m, "tool_calls": calls} if calls else m)
    return out


def _tool_schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "A tool.", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tool_encoders(template_encoders: dict[str, Encoder]) -> dict[str, Encoder]:
    return template_encoders


# What DeepSeek's templates put before an answer that follows tool output (its twin trains it, as a header).
AFTER_TOOL_HEADERS = ("<｜tool▁outputs▁end｜>",)
# Diffusion Gemma's twin does not train the <|tool_response> that follows a call, which packcli learns
# as the call's end marker (and trains): its labels are compared with the twin's on the other cases only.
TWIN_DIFFERS_ON_TOOL_CALLS = {"diffusion_gemma"}
# Gemma 4 v5 runs an answer's text into the next answer's with nothing between, and Diffusion Gemma
# leaves an answer with text and a call open (the next answer's header follows its text): each such
# answer ends with its own last character, its call through the call's end marker, the tool's response
# in between never trained (test_own_tokenizers holds them to the twin on Gemma's tokenizer).
# DeepSeek-R1-Distill's template renders an answer's calls only when its content is null: with text, or an
# empty string, it renders the text alone and drops the call. Trained so, the model would learn to answer
# without calling; the record is refused instead.
TOOL_NOT_RENDERED = {("deepseek_r1_distill", "content_and_call"), ("deepseek_r1_distill", "no_args")}


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_tool_calls_like_transformers(
    name: str, case: str, tool_encoders: dict[str, Encoder], template_tokenizer: Any
) -> None:
    """Ids equal apply_chat_template, the call is trained, the tool's output is not, labels equal the twin's."""
    tokenizer = template_tokenizer(name)[1]
    messages = _tool_case(case)
    tools = [_tool_schema(messages[1]["tool_calls"][0]["function"]["name"])]
    template = (TRL_TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    encoder = tool_encoders[name]
    result = encoder.encode_batch([Sample("chat", messages=messages, tools=tools)])[0]
    given, messages = messages, as_template_takes(name, messages)
    try:
        ref = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=True, return_dict=True
        )
    except Exception:
        assert isinstance(result, RecordError) and result.reason == "template_error", (name, result)
        return
    if (name, case) in TOOL_NOT_RENDERED:
        call = messages[1]["tool_calls"][0]["function"]["name"]
        assert call not in tokenizer.decode(ref["input_ids"])  # the template did drop it
        assert isinstance(result, RecordError) and result.reason == "tool_calls_not_rendered", (name, result)
        return
    assert not isinstance(result, RecordError), f"{name}: {result.reason}: {result.detail}"
    ids, labels = result
    assert ids.tolist() == list(ref["input_ids"]), f"{name}: token ids differ from apply_chat_template"
    runs = _trained_runs(ids.tolist(), labels, tokenizer)
    trained = "\x00".join(runs)
    rendered = tokenizer.decode(ids.tolist())
    assert TOOL_OUTPUT not in trained and "SECRET" not in trained, f"{name}: the tool's output is trained"
    assert "What does the tool say?" not in trained
    assert "It says it is 18 degrees." in trained
    if case == "content_and_call" and "Let me check." in rendered:
        assert "Let me check." in trained, f"{name}: the answer's text is not trained"
    function = messages[1]["tool_calls"][0]["function"]["name"]
    if rendered.count(function) > 1:  # the template renders the call (not only the tool's schema)
        assert function in trained, f"{name}: the tool call is not trained"
    twin_path = TRL_TEMPLATES / f"{name}_training.jinja"
    if not twin_path.exists() or name in TWIN_NOT_COMPARABLE or name in TWIN_DIFFERS_ON_TOOL_CALLS:
        return
    out = tokenizer.apply_chat_template(  # DeepSeek-V3's twin takes the arguments as an object
        given, tools=tools, chat_template=twin_path.read_text(encoding="utf-8"), tokenize=True,
        return_dict=True, return_assistant_tokens_mask=True,
    )  # fmt: skip
    if list(out["input_ids"]) != ids.tolist():
        assert name in TWIN_RENDERS_OTHERWISE, f"{name}: the twin renders other tokens"
        return
    mask = np.array(out["assistant_masks"], dtype=bool)
    mask[0] = False
    prompt = encoder.shape().generation_prompt
    _check_against_twin(name, ids.tolist(), labels != IGNORE_INDEX, mask, tokenizer, prompt, AFTER_TOOL_HEADERS)


def test_enable_thinking_kwarg_and_record_override(model_tokenizer: tuple[str, Any]) -> None:
    tok_dir, tokenizer = model_tokenizer
    template_file = str(TRL_TEMPLATES / "qwen3.jinja")
    template = Path(template_file).read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    off = Encoder(
        tok_dir, template_file, EncodeOptions(template_kwargs=EncodeOptions.kwargs_items({"enable_thinking": False}))
    )
    ids, labels = _encode_one(off, Sample("chat", messages=messages))
    ref = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True, enable_thinking=False
    )
    assert ids.tolist() == list(ref["input_ids"])
    # With thinking off, the empty think block is part of the generation prompt: not trained.
    assert _trained_runs(ids.tolist(), labels, tokenizer) == ["Hello! How can I help?<|im_end|>"]
    on = Encoder(tok_dir, template_file, EncodeOptions())
    ids_on, labels_on = _encode_one(on, Sample("chat", messages=messages))
    assert _trained_runs(ids_on.tolist(), labels_on, tokenizer) == [EMPTY_THINK + "Hello! How can I help?<|im_end|>"]
    # A record's own chat_template_kwargs override the run's.
    ids_rec, labels_rec = _encode_one(on, Sample("chat", messages=messages, template_kwargs={"enable_thinking": False}))
    assert ids_rec.tolist() == ids.tolist() and labels_rec.tolist() == labels.tolist()


def _reasoning_conversations() -> list[list[dict[str, Any]]]:
    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def answer(text: str, reasoning: str | None = None) -> dict[str, Any]:
        return {"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})}

    call = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants the weather: call the tool.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    }
    return [
        [user("What is two plus two?"), answer("Four.", "Add the two numbers.")],
        [user("What is two plus two?"), answer("Four.", "Add them up."), user("And three plus three?"),
         answer("Six.", "Add them again.")],
        [user("What is two plus two?"), answer("Four."), user("And three plus three?"), answer("Six.", "Add again.")],
        [user("What is two plus two?"), answer("Four.", "Add them up."), user("And three plus three?"), answer("Six.")],
        [user("Weather in Paris?"), call, {"role": "tool", "content": "18 C"}, answer("18 C.", "Report it.")],
    ]  # fmt: skip


# The Qwen3 family, and Nemotron, whose prompt also closes an empty think block with thinking off.
QWEN3_FAMILY = ["qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "qwen3_instruct_2507"]


@pytest.mark.parametrize("thinking", [None, False, True], ids=["default", "thinking_off", "thinking_on"])
@pytest.mark.parametrize("name", [*QWEN3_FAMILY, "nemotron_3_nano"])
def test_answers_with_reasoning_and_enable_thinking(name: str, thinking: bool | None, template_tokenizer: Any) -> None:
    """Answers carrying reasoning are kept, whether the prompt opens a think block, closes an empty one or has none.

    With thinking off, Qwen3.8 and Nemotron put an empty think block in the generation prompt but render
    an answer's own reasoning in its place: the answer is still found, reasoning included, and only the
    part of the prompt the rendering shares is left out.
    """
    tok_dir, tokenizer = template_tokenizer(name)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    template_file = TRL_TEMPLATES / f"{name}.jinja"
    template, twin = template_file.read_text(encoding="utf-8"), (TRL_TEMPLATES / f"{name}_training.jinja")
    encoder = Encoder(tok_dir, str(template_file), EncodeOptions(template_kwargs=EncodeOptions.kwargs_items(kwargs)))
    conversations = _reasoning_conversations()
    results = encoder.encode_batch([Sample("chat", messages=m, tools=[WEATHER_TOOL]) for m in conversations])
    for messages, result in zip(conversations, results, strict=True):
        assert not isinstance(result, RecordError), f"{name} {kwargs}: {result.reason}: {result.detail}"
        ids, labels = result
        options = {"tools": [WEATHER_TOOL], "tokenize": True, "return_dict": True, **kwargs}
        ref = tokenizer.apply_chat_template(messages, chat_template=template, **options)
        assert ids.tolist() == list(ref["input_ids"]), f"{name} {kwargs}: token ids differ from apply_chat_template"
        rendered = tokenizer.decode(ids.tolist())
        trained = "\x00".join(_trained_runs(ids.tolist(), labels, tokenizer))
        for m in messages:
            if m["role"] == "assistant":
                for text in (m["content"], m.get("reasoning_content")):
                    # Reasoning the template shows is part of the answer (the twin trains it too).
                    assert not text or text not in rendered or text in trained, (name, kwargs, text)
        out = tokenizer.apply_chat_template(
            messages, chat_template=twin.read_text(encoding="utf-8"), return_assistant_tokens_mask=True, **options
        )
        if list(out["input_ids"]) == ids.tolist():
            mask = np.array(out["assistant_masks"], dtype=bool)
            mask[0] = False
            generation_prompt = encoder.shape().generation_prompt
            _check_against_twin(name, ids.tolist(), labels != IGNORE_INDEX, mask, tokenizer, generation_prompt)
    if name == "qwen3_8" and thinking is False:  # the same tokens as with thinking on, and the same labels
        ids, labels = _encode_one(encoder, Sample("chat", messages=conversations[0]))
        assert _trained_runs(ids.tolist(), labels, tokenizer) == ["Add the two numbers.\n</think>\n\nFour.<|im_end|>"]


def test_content_parts(model_tokenizer: tuple[str, Any]) -> None:
    tok_dir, tokenizer = model_tokenizer
    parts = [{"type": "text", "text": "Describe packing"}, {"type": "text", "text": "in one line."}]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": "Rows."}]},
    ]
    # Qwen3 renders only string content: text parts are joined with newlines.
    qwen = Encoder(tok_dir, str(TRL_TEMPLATES / "qwen3.jinja"), EncodeOptions())
    ids, _ = _encode_one(qwen, Sample("chat", messages=messages))
    joined = [{"role": "user", "content": "Describe packing\nin one line."}, {"role": "assistant", "content": "Rows."}]
    template = (TRL_TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
    assert ids.tolist() == tokenizer.apply_chat_template(joined, chat_template=template, tokenize=True)["input_ids"]
    # Gemma 3 iterates parts itself: they are passed as they are.
    gemma = Encoder(tok_dir, str(TRL_TEMPLATES / "gemma3.jinja"), EncodeOptions())
    ids, labels = _encode_one(gemma, Sample("chat", messages=messages))
    template = (TRL_TEMPLATES / "gemma3.jinja").read_text(encoding="utf-8")
    assert ids.tolist() == tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True)["input_ids"]
    assert _trained_runs(ids.tolist(), labels, tokenizer) == ["Rows.<end_of_turn>"]
    image = [
        {"role": "user", "content": [{"type": "image", "url": "x.png"}]},
        {"role": "assistant", "content": "A cat."},
    ]
    result = gemma.encode_batch([Sample("chat", messages=image)])[0]
    assert isinstance(result, RecordError) and result.reason == "unsupported_content_part"
    assert "'image'" in result.detail


def test_tokenizer_json_truncation_and_padding_are_off(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.backend_tokenizer.enable_truncation(max_length=16)
    tok.backend_tokenizer.enable_padding(length=64, pad_id=0, pad_token="<pad>")
    tok.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["truncation"] and saved["padding"]  # the file really carries both settings
    encoder = Encoder(str(tmp_path), None, EncodeOptions())
    messages = [
        {"role": "user", "content": "Explain why packing several samples into one row saves compute " * 3},
        {"role": "assistant", "content": "Because padding tokens cost as much as real ones. " * 3},
    ]
    ids, _ = _encode_one(encoder, Sample("chat", messages=messages))
    reference = AutoTokenizer.from_pretrained(tmp_path)
    expected = reference.apply_chat_template(messages, chat_template=encoder.template, tokenize=True)["input_ids"]
    assert ids.tolist() == list(expected) and len(ids) > 64
    assert 0 not in ids.tolist()[-5:]  # not padded
    assert encoder.identity()["overridden"] == ["truncation", "padding"]
    assert encoder.tokenizer.backend_tokenizer.truncation is not None  # a copy was changed, not the loaded one


def test_markers_that_are_not_tokens_warn(model_tokenizer: tuple[str, Any]) -> None:
    tok_dir, _ = model_tokenizer
    plain = Encoder(None, str(TRL_TEMPLATES / "qwen3.jinja"), EncodeOptions())
    assert plain.warnings and "<|im_end|>" in plain.warnings[0] and "not single tokens" in plain.warnings[0]
    assert Encoder(tok_dir, str(TRL_TEMPLATES / "qwen3.jinja"), EncodeOptions()).warnings == []
    assert Encoder(None, None, EncodeOptions()).warnings == []  # the default pair: the tokenizer's own markers


@pytest.mark.parametrize("name", ["qwen3", "gptoss", "llama3", "deepseek_r1_distill", "phi3", "glm4moe"])
def test_one_rendering_for_all_answers_equals_one_per_answer(
    name: str, conversations: list[Any], model_tokenizer: tuple[str, Any]
) -> None:
    """The fast path (every answer perturbed in one rendering) finds the bodies one rendering each finds."""
    from packcli.tokenize.templates import spans

    encoder = Encoder(model_tokenizer[0], str(TRL_TEMPLATES / f"{name}.jinja"), EncodeOptions())
    render = encoder.chat.renderer(None, encoder.template_kwargs)
    fast = 0
    for messages in conversations[:80]:
        full = render(messages, False)
        which = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        at_once = spans._bodies_at_once(render, messages, full, which)
        if at_once is None:
            continue
        fast += 1
        assert at_once == [spans._body(render, messages, full, i) for i in which], name
    assert fast >= 20  # the fast path is taken on most multi-turn conversations


@pytest.mark.parametrize(
    "name", ["qwen3", "qwen3_8", "gptoss", "llama3", "deepseekv3", "phi3", "glm4moe", "gemma3", "gemma4", "cohere2"]
)
def test_one_rendering_for_answers_and_other_messages_changes_no_span(
    name: str, conversations: list[Any], model_tokenizer: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared rendering (answers perturbed, other messages marked) gives the spans their own renderings give."""
    from packcli.tokenize.templates import spans

    encoder = Encoder(model_tokenizer[0], str(TRL_TEMPLATES / f"{name}.jinja"), EncodeOptions())
    shape = encoder.shape()
    cases: list[tuple[list[dict[str, Any]], list[Any] | None]] = [(m, None) for m in conversations[:40]]
    cases += [(m[:3], None) for m in conversations[:10]]  # one answer (a system turn in about half of them)
    cases += [(_tool_case(c), [_tool_schema(TOOL_CASES[c]["tool_calls"][0]["function"]["name"])]) for c in TOOL_CASES]
    cases += [(_tool_conversation(), [WEATHER_TOOL])]

    def located(render: Any, messages: list[dict[str, Any]], full: str) -> Any:
        which = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        try:
            return spans.assistant_spans(render, messages, full, which, shape)
        except RecordError as err:
            return err.reason, err.detail

    shared = 0
    for messages, tools in cases:
        render = encoder.chat.renderer(tools, encoder.template_kwargs)
        try:
            full = render(messages, False)
        except RecordError:
            continue  # the template refuses the conversation (no system role, no tools)
        others = [k for k, m in enumerate(messages) if m["role"] != "assistant"]
        which = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        shared += spans._marked_at_once(render, messages, full, which, others) is not None
        fast = located(render, messages, full)
        with monkeypatch.context() as patched:
            patched.setattr(spans, "_marked_at_once", lambda *args: None)
            assert located(render, messages, full) == fast, (name, messages)
    assert shared >= 30, f"{name}: the shared rendering served only {shared} conversations"


def test_a_template_that_hides_answers_is_reported(tmp_path: Path) -> None:
    template = tmp_path / "hides.jinja"
    template.write_text(
        "{% for m in messages %}<|{{ m.role }}|>{% if m.role != 'assistant' %}{{ m.content }}{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    encoder = Encoder(None, str(template), EncodeOptions())
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(TokenizerError, match=r"hides\.jinja: cannot learn where the chat template puts"):
        encoder.encode_batch([Sample("chat", messages=messages)])


def test_a_template_without_answers_stops_the_run_and_names_the_template(tmp_path: Path, pack: Any) -> None:
    """The template is at fault, not the records: one line naming it, also with --on-error skip."""
    from .conftest import one_error_line, write_jsonl

    template = tmp_path / "count.jinja"
    template.write_text("hello {{ messages | length }}")
    records = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A."}]}
               for i in range(3)]  # fmt: skip
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    for extra in ([], ["--on-error", "skip"]):
        failed = pack(data, "-o", tmp_path / "out", "--chat-template", template, *extra, expect=1)
        line = one_error_line(failed)
        assert line.startswith(f"Error: {template}: cannot learn where the chat template puts assistant answers")
        assert "--train-on all" in line and "fix the record" not in line and "line 1" not in line
        assert not (tmp_path / "out").exists()
    pack(data, "-o", tmp_path / "out", "--chat-template", template, "--train-on", "all")


def test_pack_cli_with_template_kwargs_tools_and_warning(tmp_path: Path, pack: Any) -> None:
    """End to end: --template-kwarg and a record's tools reach the template, key the cache, and the warning shows."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from packcli.cli import app

    from .conftest import write_jsonl

    qwen3 = str(TRL_TEMPLATES / "qwen3.jinja")
    records = [{"messages": _tool_conversation(), "tools": [WEATHER_TOOL]}]
    records += [
        {"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "Yes."}]}
        for i in range(5)
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    first = pack(data, "--max-len", 2048, "-o", tmp_path / "a", "--chat-template", qwen3, "--json")
    summary = json.loads(first.stdout)
    assert summary["packed"] == 6 and summary["cache"] == "miss"
    assert summary["warnings"] and "not single tokens" in summary["warnings"][0]
    assert "Warning: the chat template's role markers" in first.stderr
    off = pack(
        data, "--max-len", 2048, "-o", tmp_path / "b", "--chat-template", qwen3, "--json",
        "--template-kwarg", "enable_thinking=false",
    )  # fmt: skip
    assert json.loads(off.stdout)["cache"] == "miss"  # the keyword arguments are part of the cache key
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["tokenizer"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert manifest["options"]["template_kwargs"] == {"enable_thinking": False}
    # One tokenizer, one identity: the keyword arguments do not change it, so inspect finds it the same.
    plain = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["tokenizer"]["sha256"] == plain["tokenizer"]["sha256"]
    inspected = CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), "--json"])
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(inspected.stdout)["tokenizer_matches"] is True
    assert "is not the one the output was packed with" not in inspected.stderr
    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    template = Path(qwen3).read_text(encoding="utf-8")
    rows = pq.read_table(next((tmp_path / "b").glob("shard-*.parquet"))).to_pylist()
    by_index = {}
    for row in rows:
        at = 0
        for n, k in zip(row["seq_lengths"], row["sample_index"], strict=True):
            by_index[k] = row["input_ids"][at : at + n]
            at += n
    for k, record in enumerate(records):
        expected = tokenizer.apply_chat_template(
            record["messages"], tools=record.get("tools"), chat_template=template, tokenize=True,
            return_dict=True, enable_thinking=False,
        )["input_ids"]  # fmt: skip
        assert by_index[k] == list(expected)
    again = pack(
        data, "--max-len", 2048, "-o", tmp_path / "c", "--chat-template", qwen3, "--json",
        "--template-kwarg", "enable_thinking=false",
    )  # fmt: skip
    assert json.loads(again.stdout)["cache"] == "hit"
    bad = pack(data, "-o", tmp_path / "d", "--template-kwarg", "enable_thinking", expect=2)
    assert "--template-kwarg takes KEY=VALUE" in bad.stderr


def test_template_kwargs_in_a_preset(tmp_path: Path, pack: Any) -> None:
    from .conftest import write_jsonl

    preset = tmp_path / "qwen3.toml"
    preset.write_text(
        f'chat_template = "{TRL_TEMPLATES / "qwen3.jinja"}"\n[template_kwargs]\nenable_thinking = false\n'
    )
    data = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}],
    )
    pack(data, "--config", preset, "-o", tmp_path / "a", "--max-len", 256)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["template_kwargs"] == {"enable_thinking": False}
    pack(data, "--config", preset, "-o", tmp_path / "b", "--max-len", 256, "--template-kwarg", "enable_thinking=true")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["options"]["template_kwargs"] == {"enable_thinking": True}  # the flag overrides the preset


def test_text_holding_a_perturbation_mark_falls_back_safely(model_tokenizer: tuple[str, Any]) -> None:
    from packcli.tokenize.templates import spans

    tok_dir, tokenizer = model_tokenizer
    encoder = Encoder(tok_dir, str(TRL_TEMPLATES / "qwen3.jinja"), EncodeOptions())
    messages = [
        {"role": "user", "content": "Which private-use characters are there?"},
        {"role": "assistant", "content": "This one: \ue100 and this one: \ue0c7."},
        {"role": "user", "content": "Thanks, and in short?"},
        {"role": "assistant", "content": "Two of them."},
    ]
    render = encoder.chat.renderer(None, encoder.template_kwargs)
    full = render(messages, False)
    assert spans._bodies_at_once(render, messages, full, [1, 3]) is None
    ids, labels = _encode_one(encoder, Sample("chat", messages=messages))
    runs = _trained_runs(ids.tolist(), labels, tokenizer)
    assert runs == ["This one: \ue100 and this one: \ue0c7.<|im_end|>", EMPTY_THINK + "Two of them.<|im_end|>"]


def test_tool_output_inside_an_answer_that_cannot_be_cut_drops_the_record(tmp_path: Path) -> None:
    """A template that runs a tool's output into the answer's text, with no marker between: never trained."""
    template = tmp_path / "inline.jinja"
    template.write_text(
        "{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|>{{ m.content }}"
        "{% if loop.nextitem and loop.nextitem.role == 'tool' %} [{{ loop.nextitem.content }}] ok{% endif %}"
        "<|end|>{% elif m.role != 'tool' %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    encoder = Encoder(None, str(template), EncodeOptions())
    messages = [
        {"role": "user", "content": "What does the tool say?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": TOOL_OUTPUT},
        {"role": "assistant", "content": "It says it is 18 degrees."},
    ]
    result = encoder.encode_batch([Sample("chat", messages=messages)])[0]
    assert isinstance(result, RecordError) and result.reason == "template_spans_not_found", result
    assert "another message's text is rendered inside it" in result.detail
    assert "training twin" not in result.detail  # none beside it
    # A training twin beside the template (NAME_training.jinja, as trl ships them) is named as the fix.
    (tmp_path / "inline_training.jinja").write_text("{% generation %}{% endgeneration %}")
    named = encoder.encode_batch([Sample("chat", messages=messages)])[0]
    assert isinstance(named, RecordError) and named.detail.endswith(
        f"(its training twin {tmp_path / 'inline_training.jinja'} has them: pass it as chat_template)"
    )
    # Without the tool message inside the turn, the same conversation is packed.
    plain = [messages[0], messages[1], {"role": "user", "content": "And?"}, messages[3]]
    assert not isinstance(encoder.encode_batch([Sample("chat", messages=plain)])[0], RecordError)
