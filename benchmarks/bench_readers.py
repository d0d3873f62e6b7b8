"""Memory and time of reading a large JSON array, plain and compressed: the reader streams it.

    python benchmarks/bench_readers.py [--mb 200]

Writes a JSON array of about --mb megabytes (chat records of ~2 KB) as .json and .json.gz, and reads
each in a fresh process with packcli's reader (packcli.io.readers.read_batches, no tokenizing), printing
the records, seconds and the process's peak RSS. A reader that held the file would need at least
its size in memory (twice, as bytes and as text).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

READ = """
import resource, sys, time
from packcli.io.readers import read_batches
from packcli.io.sources import resolve_inputs
t = time.perf_counter()
n = sum(len(b.items) for b in read_batches(resolve_inputs([sys.argv[1]]), batch_size=256))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"{n} records, {time.perf_counter() - t:.1f} s, peak RSS {rss} MB")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    record = {"messages": [{"role": "user", "content": "q " * 200}, {"role": "assistant", "content": "a " * 800}]}
    line = json.dumps(record)
    n = args.mb * 1_000_000 // len(line)
    with tempfile.TemporaryDirectory() as tmp:
        plain, packed = Path(tmp) / "big.json", Path(tmp) / "big.json.gz"
        # Written by records: this process stays small, and a child's peak RSS starts from its parent's
        # (Linux keeps ru_maxrss across fork and exec).
        with open(plain, "w") as fh, gzip.open(packed, "wt", compresslevel=1) as gz:
            for out in (fh, gz):
                out.write("[")
            for i in range(n):
                for out in (fh, gz):
                    out.write(("," if i else "") + line + "\n")
            for out in (fh, gz):
                out.write("]")
        for path in (plain, packed):
            size = path.stat().st_size / 1e6
            result = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, check=True)
            print(f"{path.name} ({size:,.1f} MB): {result.stdout.strip()}")


if __name__ == "__main__":
    main()
