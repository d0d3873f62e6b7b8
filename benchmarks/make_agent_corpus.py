"""Write a synthetic agent-trace corpus for benchmarking ``packcli pack`` on tool calls and reasoning.

Each conversation of ``make_chat_corpus.py`` (same seed, same text) becomes an agent trace: ``tools``
(one function schema), and before the first answer an assistant turn with ``reasoning_content`` and a
``tool_calls`` entry (arguments as an object, or as a JSON string for every other record), then the
``tool`` result; every answer carries ``reasoning_content``: its first sentence (the answer repeats its
reasoning: the costly case, where the count renders a probe), or with ``--distinct-reasoning`` that
sentence's words reversed (text of its own). The function's name is also in the first user turn, as people
write it ("use search_notes").

    python benchmarks/make_agent_corpus.py --conversations 2000 -o /tmp/agent.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

TOOL = {
    "type": "function",
    "function": {
        "name": "search_notes",
        "description": "Search the user's notes.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def _chat_corpus() -> Any:
    path = Path(__file__).with_name("make_chat_corpus.py")
    spec = importlib.util.spec_from_file_location("make_chat_corpus", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agent_trace(messages: list[dict[str, str]], index: int, distinct: bool = False) -> dict[str, Any]:
    """Return the record of one conversation made an agent trace (see the module doc)."""
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    query = messages[first_user]["content"][:60]
    arguments: Any = {"query": query}
    if index % 2:
        arguments = json.dumps(arguments, ensure_ascii=False)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if i == first_user:
            out.append({**m, "content": "Use search_notes first. " + m["content"]})
            out.append(
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "I should search the notes for: " + query,
                    "tool_calls": [{"type": "function", "function": {"name": "search_notes", "arguments": arguments}}],
                }
            )
            out.append({"role": "tool", "content": "Found 3 notes about " + query})
        elif m["role"] == "assistant":
            reasoning = m["content"].split(".")[0][:200] or "Answer."
            if distinct:
                reasoning = "Reasoning: " + " ".join(reversed(reasoning.split()))
            out.append({**m, "reasoning_content": reasoning})
        else:
            out.append(dict(m))
    return {"messages": out, "tools": [TOOL]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--median-tokens", type=float, default=600)
    parser.add_argument("--distinct-reasoning", action="store_true")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    corpus = _chat_corpus()
    with open(args.output, "w", encoding="utf-8") as fh:
        for i in range(args.conversations):
            messages = corpus.make_conversation(args.seed, i, args.median_tokens, 0.6)["messages"]
            fh.write(json.dumps(agent_trace(messages, i, args.distinct_reasoning), ensure_ascii=False) + "\n")
    print(f"wrote {args.conversations} agent traces to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
