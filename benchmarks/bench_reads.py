"""The read path of a cache miss on a file the cache does not know: a pass that hashes the file for the
cache key, then the tokenizing pass (what 0.6.0 did with a JSON lines file, hashing what it read for the
check that the file did not change; what 0.8.0 did with a Parquet, CSV, Arrow or JSON file, reading it with
pyarrow's own file), against one read that hashes the file and cuts it into cache parts as it reads
(``io.readers.read_parts``: a JSON lines file by its bytes, the other kinds by their records, pickled).

Only the reading is timed (no tokenizing), by CPU seconds in this process, the two alternating in
paired rounds; the figure is the median of the in-round ratios (above 1: the one read costs less) and
their range. The file is read from the page cache after the first round.

    python benchmarks/make_chat_corpus.py --conversations 20000 --seed 0 -o benchmarks/data/chat20k.jsonl
    python benchmarks/bench_reads.py benchmarks/data/chat20k.jsonl --rounds 7
    python benchmarks/bench_reads.py chats.parquet --rounds 7   # any input file packcli reads
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from packcli.io.fingerprint import fingerprint_and_count
from packcli.io.readers import PartEnds, read_batches, read_parts
from packcli.io.sources import InputSource, resolve_inputs
from packcli.store.parts import PART_BYTES, PART_RECORDS
from packcli.tokenize.batches.ingest import BATCH_SIZE


def two_reads(source: InputSource) -> int:
    """The hash for the key (with the record count, for progress, in the same read), then the tokenizing
    pass with its hash."""
    fingerprint_and_count(source)
    digests = {} if source.kind == "jsonl" else None
    return sum(len(batch.items) for batch in read_batches([source], BATCH_SIZE, digests=digests))


def one_read(source: InputSource) -> int:
    """One read: hashed by lines, cut into parts, each part's end hashed."""
    ends = PartEnds(PART_RECORDS, PART_BYTES)
    return sum(len(batch.items) for batch in read_parts(source, BATCH_SIZE, ends, {}))


def cpu_seconds(work: object, source: InputSource) -> tuple[float, int]:
    began = time.process_time()
    records = work(source)  # type: ignore[operator]
    return time.process_time() - began, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="an input file: JSON lines, JSON, CSV, Parquet or Arrow")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    (source,) = resolve_inputs([str(args.data)])
    size = args.data.stat().st_size
    one_read(source)  # the page cache, warmed
    ratios = []
    for k in range(args.rounds):
        before, n_before = cpu_seconds(two_reads, source)
        now, n_now = cpu_seconds(one_read, source)
        assert n_before == n_now
        ratios.append(before / now)
        print(f"round {k}: two reads {before:.3f} s, one read {now:.3f} s, ratio {before / now:.3f}")
    print(
        f"{size / 1e6:.1f} MB, {n_now:,} records: two reads / one read (CPU seconds), median "
        f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
