"""The floor of a cold pack: read, decode, render and encode a chat corpus, and nothing else.

    python benchmarks/floor.py chats.jsonl [--num-proc 2]

Reads the JSON lines file (``{"conversations": [{"from", "value"}]}`` ShareGPT records or ``{"messages":
[...]}``), decodes each line, renders it with the chat template packcli renders the default tokenizer's
chats with (its ``deepseek`` template, compiled once), and encodes the texts with ``fastokens`` in
``--num-proc`` forked processes, the encoder built once before the fork. No labels, no masks, no
checks, no store, no plan, no shards: what any packer must at least do. Prints the seconds of each part
and the whole, as one JSON line (``benchmarks/bench_fixed.py`` times it against ``packcli pack``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def messages_of(record: dict) -> list[dict]:
    if "messages" in record:
        return record["messages"]
    return [
        {"role": ROLES.get(t.get("from"), "user"), "content": t.get("value") or ""} for t in record["conversations"]
    ]


def work(lines: list[bytes], template: object, encoder: object) -> int:
    texts = [template.render(messages=messages_of(json.loads(line))) for line in lines]  # type: ignore[attr-defined]
    ids, _ = encoder.encode_batch_flat(texts, add_special_tokens=False)  # type: ignore[attr-defined]
    return len(ids) // 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--num-proc", type=int, default=2)
    args = ap.parse_args()
    began = time.perf_counter()
    import fastokens

    from packcli.contract import default_tokenizer_dir
    from packcli.tokenize.templates.choice import builtin_template
    from packcli.tokenize.templates.rendering import compile_template  # jinja2 in apply_chat_template's environment

    text = (Path(default_tokenizer_dir()) / "tokenizer.json").read_text(encoding="utf-8")
    encoder = fastokens.Tokenizer.from_json_str(text)
    template = compile_template(builtin_template("deepseek"))
    loaded = time.perf_counter()
    lines = args.data.read_bytes().splitlines()
    shares = [lines[k :: args.num_proc] for k in range(args.num_proc)]
    children = []
    for share in shares[1:]:
        pid = os.fork()
        if pid == 0:
            work(share, template, encoder)
            os._exit(0)
        children.append(pid)
    tokens = work(shares[0], template, encoder)
    for pid in children:
        os.waitpid(pid, 0)
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "load_s": round(loaded - began, 3),
                "work_s": round(done - loaded, 3),
                "total_s": round(done - began, 3),
                "records": len(lines),
                "tokens_first_share": tokens,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
