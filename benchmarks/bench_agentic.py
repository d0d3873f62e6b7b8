"""Time the encoder on agent traces: what checking calls and counting reasoning costs per record.

Encodes the records of a JSON lines file (``make_agent_corpus.py``, or plain chat) with one chat template,
in batches, in this process, and prints records/s and what was refused. Run it against two checkouts
with ``PYTHONPATH`` to compare them, in paired rounds (A and B alternated, the ratio taken in each round).

    python benchmarks/make_agent_corpus.py --conversations 1000 -o /tmp/agent.jsonl
    PYTHONPATH=. python benchmarks/bench_agentic.py /tmp/agent.jsonl --chat-template qwen3.jinja
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from packcli.errors import RecordError
from packcli.records.formats import DEFAULT_FIELDS, detect_format, normalize
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--chat-template", default=None)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    with open(args.input, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh]
    samples = [normalize(r, detect_format(r, DEFAULT_FIELDS) or "messages", DEFAULT_FIELDS) for r in records]
    encoder = Encoder(None, args.chat_template, EncodeOptions())
    refused: Counter[str] = Counter()
    started = time.perf_counter()
    for at in range(0, len(samples), args.batch):
        for result in encoder.encode_batch(list(samples[at : at + args.batch])):
            if isinstance(result, RecordError):
                refused[result.reason] += 1
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {
                "records": len(samples),
                "seconds": round(seconds, 3),
                "records_per_s": round(len(samples) / seconds, 1),
                "refused": dict(refused),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
