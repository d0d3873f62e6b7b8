"""The cost of --dedup's content key, computed for every record in the worker, against the encode.

Every record's normalised sample is hashed (packcli.records.dedup.content_key) so that turning
``--dedup exact`` on or off re-packs from the cache. This prints, per sample, the microseconds of the
key and of the batched encode in one process, in rounds (the key, then the encode), and the ratio in
each round: compare ratios, not times, on a shared machine.

    python benchmarks/bench_content_key.py --data examples/chat.jsonl --repeat 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from packcli.records.dedup import content_key
from packcli.records.formats import DEFAULT_FIELDS, detect_format, normalize
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="examples/chat.jsonl", help="a JSON lines file of chat records")
    parser.add_argument("--repeat", type=int, default=20, help="read the file this many times over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="samples per encode_batch call")
    args = parser.parse_args()
    with open(args.data, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()] * args.repeat
    fields = dict(DEFAULT_FIELDS)
    samples = [normalize(r, str(detect_format(r, fields)), fields) for r in records]
    encoder = Encoder(None, None, EncodeOptions())
    ratios = []
    for r in range(args.rounds):
        t = time.perf_counter()
        for sample in samples:
            content_key(sample)
        key_us = (time.perf_counter() - t) * 1e6 / len(samples)
        t = time.perf_counter()
        for i in range(0, len(samples), args.batch):
            encoder.encode_batch(list(samples[i : i + args.batch]))
        encode_us = (time.perf_counter() - t) * 1e6 / len(samples)
        ratios.append(key_us / encode_us)
        print(f"round {r + 1}: content key {key_us:.1f} us/sample, encode {encode_us:.1f} us/sample")
    print(
        f"{len(samples)} samples: key / encode median {statistics.median(ratios):.1%} "
        f"(range {min(ratios):.1%} to {max(ratios):.1%})"
    )


if __name__ == "__main__":
    main()
