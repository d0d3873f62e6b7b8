"""``pack --expand-turns reasoning``, with and without ``--prefix-tree``, on agent traces of several rounds.

Writes seeded synthetic agent traces as chat records (text, not token ids): a tools list of
``--tools`` function schemas and a system prompt, then ``--rounds`` rounds, each a user message, an
assistant turn with reasoning and a tool call, the tool's result, and an assistant answer with
reasoning. Words are drawn from a fixed vocabulary; per round the user's message and the tool's
result have 30-300 words, each reasoning 100-400, each answer or call 20-160. Packs them with
Qwen3's chat template (trl's, which renders the last round's reasoning only), first as the plain
expansion, then as prefix trees, and prints for each the samples, tokens, trained tokens, rows and
wall seconds, and the ratio of the trees' tokens to the expansion's.

    python benchmarks/bench_prefix_tree_pack.py --traces 200 --rounds 5 --tools 12
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

WORDS = ["tide", "harbour", "chart", "moon", "current", "depth", "vessel", "anchor", "signal", "weather"]
WORDS += ["forecast", "pressure", "wind", "swell", "pilot", "channel", "buoy", "draft", "keel", "mooring"]
WORDS += ["ebb", "flood", "slack", "range", "datum", "station", "reading", "table", "hour"]


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _tools(rng: random.Random, n: int) -> list[dict[str, Any]]:
    tools = []
    for k in range(n):
        properties = {f"arg_{j}": {"type": "string", "description": _text(rng, 8, 20)} for j in range(4)}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{k}",
                    "description": _text(rng, 15, 40),
                    "parameters": {"type": "object", "properties": properties, "required": ["arg_0"]},
                },
            }
        )
    return tools


def trace(rng: random.Random, rounds: int, tools: list[dict[str, Any]]) -> dict[str, Any]:
    system = "You are a harbour assistant. " + _text(rng, 40, 60)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for _ in range(rounds):
        name = tools[rng.randrange(len(tools))]["function"]["name"]
        call = {"type": "function", "function": {"name": name, "arguments": {"arg_0": _text(rng, 20, 160)}}}
        messages += [
            {"role": "user", "content": _text(rng, 30, 300)},
            {"role": "assistant", "content": "", "reasoning_content": _text(rng, 100, 400), "tool_calls": [call]},
            {"role": "tool", "content": _text(rng, 30, 300)},
            {"role": "assistant", "content": _text(rng, 20, 160), "reasoning_content": _text(rng, 100, 400)},
        ]
    return {"messages": messages, "tools": tools}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tools", type=int, default=12, help="function schemas in every trace's tools list")
    parser.add_argument("--max-len", type=int, default=32768)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import trl

    import packcli

    template = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"
    rng = random.Random(args.seed)
    tools = _tools(rng, args.tools)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "traces.jsonl"
        with open(data, "w", encoding="utf-8") as fh:
            for _ in range(args.traces):
                fh.write(json.dumps(trace(rng, args.rounds, tools)) + "\n")
        from packcli.tokenize.encoders.tokenizer import load_tokenizer

        first = trace(random.Random(args.seed), args.rounds, tools)
        prefix = load_tokenizer(None).apply_chat_template(
            first["messages"][:1], tools=tools, chat_template=template.read_text(), tokenize=True, return_dict=True
        )["input_ids"]
        print(
            f"{args.traces} traces of {args.rounds} rounds, {args.tools} tools (system prompt and tools: about "
            f"{len(prefix):,} tokens), Qwen3's template, --max-len {args.max_len}, --expand-turns reasoning "
            f"(seed {args.seed})"
        )
        found = {}
        for name, tree in (("plain expansion", False), ("prefix trees", True)):
            start = time.perf_counter()
            result = packcli.pack(
                data,
                max_len=args.max_len,
                chat_template=template,
                expand_turns="reasoning",
                prefix_tree=tree,
                output=Path(tmp) / name.replace(" ", "_"),
                cache=False,
                num_proc=1,
            )
            seconds = time.perf_counter() - start
            s = result.summary
            found[name] = s
            print(
                f"{name:16s} {s.samples:>7,} samples {s.tokens:>12,} tokens {s.trainable_tokens:>10,} trained "
                f"{s.rows:>6,} rows  {seconds:6.1f} s"
            )
        plain, trees = found["plain expansion"], found["prefix trees"]
        assert trees.trees is not None
        once = plain.tokens - (plain.expanded or {}).get("extra_tokens", 0)
        print(f"whole conversations (rendered once): {once:,} tokens")
        print(
            f"trees / expansion: tokens {trees.tokens / plain.tokens:.3f}, rows {trees.rows / plain.rows:.3f}; "
            f"trained tokens equal: {trees.trainable_tokens == plain.trainable_tokens}; "
            f"trees per record {trees.trees['trees'] / max(trees.trees['records'], 1):.2f}"
        )


if __name__ == "__main__":
    main()
