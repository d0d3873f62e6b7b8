"""Read a packcli MDS output with MosaicML streaming and compare every row with a Parquet output.

    packcli pack data.jsonl -o out-mds --output-format mds [options]
    packcli pack data.jsonl -o out-parquet [the same options]
    python examples/read_mds_with_streaming.py out-mds out-parquet

Needs ``pip install mosaicml-streaming`` (not a packcli dependency). streaming's top-level import
loads its vision datasets, which need a torchvision built for the installed torch;
``--skip-vision`` leaves them out where the two do not match.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mds", type=Path)
    parser.add_argument("parquet", type=Path)
    parser.add_argument("--skip-vision", action="store_true", help="do not import streaming.vision")
    args = parser.parse_args()
    if args.skip_vision:
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=str(args.mds), shuffle=False, batch_size=1)
    rows = [r for path in sorted(args.parquet.glob("shard-*.parquet")) for r in pq.read_table(path).to_pylist()]
    if len(dataset) != len(rows):
        sys.exit(f"streaming reads {len(dataset)} rows, the Parquet output has {len(rows)}")
    for i, row in enumerate(rows):
        sample = dataset[i]
        if set(sample) != set(row):
            sys.exit(f"row {i}: columns {sorted(sample)} against {sorted(row)}")
        for name, values in row.items():
            if not np.array_equal(sample[name], np.asarray(values, dtype=sample[name].dtype)):
                sys.exit(f"row {i}: {name} differs")
    print(f"{len(rows)} rows equal; columns {', '.join(sorted(rows[0]))}")


if __name__ == "__main__":
    main()
