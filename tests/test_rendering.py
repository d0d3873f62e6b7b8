"""packcli renders chat templates as transformers does, without importing it (``packcli.tokenize.templates.rendering``).

Every template of the suite (packcli's, the tests', and the official ones in ``trl/chat_templates``) is
rendered with both renderers on conversations of every shape packcli passes them: the same text, the same
generation-block spans, or the same refusal. And a whole pack imports no transformers at all, while its
ids are ``apply_chat_template``'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from packcli.tokenize.templates import rendering

from .conftest import write_jsonl

PACKCLI_TEMPLATES = Path(rendering.__file__).parents[1] / "templates"
TEST_TEMPLATES = Path(__file__).parent / "templates"


def _trl_templates() -> list[Path]:
    import trl

    return sorted((Path(trl.__file__).parent / "chat_templates").glob("*.jinja"))


TEMPLATES = sorted(PACKCLI_TEMPLATES.glob("*.jinja")) + sorted(TEST_TEMPLATES.glob("*.jinja")) + _trl_templates()

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
CALL_TEXT = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city ü",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[Any] | None]] = {
    "chat": ([{"role": "user", "content": "Hi <b>there</b> ü"}, {"role": "assistant", "content": "Hello! 😀"}], None),
    "system": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "1"},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "2"},
        ],
        None,
    ),
    "parts": (
        [
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "seen"}]},
        ],
        None,
    ),
    "reasoning": (
        [
            {"role": "user", "content": "why?"},
            {"role": "assistant", "reasoning_content": "because it is", "content": "Because."},
            {"role": "user", "content": "and?"},
            {"role": "assistant", "thinking": "more", "content": "More."},
        ],
        None,
    ),
    "tools": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL, CALL_TEXT]},
            {"role": "tool", "name": "get_weather", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "21 degrees."},
        ],
        TOOLS,
    ),
}


def _both(template: str, messages: list[dict[str, Any]], tools: list[Any] | None, **kwargs: Any) -> tuple[Any, Any]:
    from transformers.utils.chat_template_utils import render_jinja_template

    def theirs() -> Any:
        rendered, spans = render_jinja_template(
            conversations=[json.loads(json.dumps(messages))],
            tools=tools,
            chat_template=template,
            return_assistant_tokens_mask=True,
            **kwargs,
        )
        return rendered[0], [tuple(s) for s in spans[0]]

    def ours() -> Any:
        text, spans = rendering.render(template, json.loads(json.dumps(messages)), tools=tools, spans=True, **kwargs)
        return text, [tuple(s) for s in spans]

    out = []
    for render in (theirs, ours):
        try:
            out.append(render())
        except Exception as exc:  # a template refuses a conversation: both must, alike
            out.append((type(exc).__name__, str(exc)))
    return out[0], out[1]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_every_template_renders_as_transformers_renders_it(path: Path) -> None:
    template = path.read_text(encoding="utf-8")
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    for name, (messages, tools) in CONVERSATIONS.items():
        for prompt in (False, True):
            for extra in ({}, {"enable_thinking": False}):
                kwargs = {**special, **extra}
                theirs, ours = _both(template, messages, tools, add_generation_prompt=prompt, **kwargs)
                assert ours == theirs, (name, prompt, extra)


def test_the_environment_refuses_what_transformers_refuses() -> None:
    cases = {
        "{{ raise_exception('no') }}": ("TemplateError", "no"),
        "{% set ns = namespace(_x=1) %}": ("SecurityError", None),
        "{{ messages.append(1) }}": ("SecurityError", None),
        "{{ ''.__class__ }}": None,  # rendered empty by the sandbox, as transformers renders it
    }
    for template, expected in cases.items():
        theirs, ours = _both(template, [{"role": "user", "content": "x"}], None)
        assert ours == theirs, template
        if expected is not None:
            assert ours[0] == expected[0], template


def test_a_compiled_templates_globals_are_one_dict_of_the_environments() -> None:
    """Each render copies the globals into its context: from one dict, not through Jinja's ChainMap of the
    template's and the environment's (a fifth of a short chat's render); the same names, the same values."""
    from packcli.tokenize.templates.rendering import compile_template, render

    template = "{{ raise_exception is defined }} {{ strftime_now is defined }} {{ dict(a=1)['a'] }} {{ x }}"
    compiled = compile_template(template)
    assert type(compiled.globals) is dict
    assert compiled.globals == dict(compiled.environment.globals)
    assert render(template, [], x="y")[0] == "True True 1 y"


def test_plain_data_is_what_the_template_sees() -> None:
    import numpy as np

    class Odd:
        pass

    value = {"a": (1, np.int64(2), np.float32(0.5)), "b": [Odd(), True, None], 3: "x"}
    assert rendering.plain(value) == {"a": (1, 2, 0.5), "b": ["<Odd>", True, None], 3: "x"}

    # Subclasses inside the dicts and lists JSON decoding makes become their base types, at any depth.
    class Text(str):
        pass

    class Number(int):
        pass

    class Ordered(dict):  # type: ignore[type-arg]
        pass

    record = {"m": [{"role": Text("user"), "n": Number(3), "x": [np.int32(1), Ordered(k=Text("v"))]}], Text("t"): 1.5}
    made = rendering.plain(record)
    assert made == {"m": [{"role": "user", "n": 3, "x": [1, {"k": "v"}]}], "t": 1.5}
    message = made["m"][0]
    assert type(message["role"]) is str and type(message["n"]) is int and type(message["x"][0]) is int
    assert type(message["x"][1]) is dict and type(message["x"][1]["k"]) is str
    assert all(type(key) is str for key in made)
    assert made is not record and made["m"] is not record["m"]  # a copy, whatever the template does with it


# Packs with a template of trl's (one with generation blocks, one without), in a process that must not
# import transformers; prints the shards' rows' input_ids and labels.
PACK_WITHOUT_TRANSFORMERS = """
import json, sys
import pyarrow.parquet as pq
from pathlib import Path
import packcli
data, template, out = sys.argv[1:4]
packcli.pack(data, output=out, chat_template=template, max_len=256, cache=False, seed=0)
assert "transformers" not in sys.modules, "transformers was imported"
rows = []
for shard in sorted(Path(out).glob("shard-*.parquet")):
    rows += pq.read_table(shard).select(["input_ids", "labels", "seq_lengths", "sample_index"]).to_pylist()
print(json.dumps(rows))
"""


@pytest.mark.parametrize("name", ["qwen3_training", "llama3"])
def test_a_pack_imports_no_transformers_and_gives_apply_chat_template_ids(name: str, tmp_path: Path) -> None:
    from packcli.contract import default_tokenizer_dir

    template = next(p for p in _trl_templates() if p.stem == name)
    chats = [m for m, _ in list(CONVERSATIONS.values())[:2]]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    run = subprocess.run(
        [sys.executable, "-c", PACK_WITHOUT_TRANSFORMERS, str(data), str(template), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tokenizer.chat_template = template.read_text(encoding="utf-8")
    samples = {}
    for row in rows:
        at = 0
        for length, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
            samples[index] = row["input_ids"][at : at + length]
            at += length
    assert len(samples) == len(chats)
    for index, messages in enumerate(chats):
        expected = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert samples[index] == list(expected), index
