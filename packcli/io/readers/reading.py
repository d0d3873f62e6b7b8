"""How a reader reads one source (``Reading``), and a read cut at its first records (``first_records``)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from packcli.io.sources import RawBatch


@dataclass(frozen=True)
class Reading:
    """How a reader reads one source (``io.readers.read_source``): ``batch_size`` records a batch.

    ``digests`` receives the hash of a local file read through (by its path), taken from the bytes read;
    ``records``: the first records only are handed over (with ``digests``, the rest of the file is read for
    its hash before the last batch is); ``head``: only the first records will be read (the sniff), as
    little of the file as the reader can; ``hashed``: each batch with the hash of its records where the
    reader can make it from what it decoded them from (``RawBatch.digest``).
    """

    batch_size: int
    digests: dict[str, str] | None = None
    records: int | None = None
    head: bool = False
    hashed: bool = False


def first_records(
    batches: Iterator[RawBatch], records: int | None, finish: Callable[[], None] | None = None
) -> Generator[RawBatch, None, int]:
    """Yield ``batches``, or their first ``records`` records; return how many were yielded. ``finish`` runs
    once the last batch is known, before it is handed over (a reader that stops there has what it did)."""
    held: RawBatch | None = None
    handed = 0
    for batch in batches:
        if held is not None:
            yield held
        if records is not None and handed + len(batch.items) >= records:
            batch.cut(records - handed)
            handed, held = records, batch
            break
        handed, held = handed + len(batch.items), batch
    if finish is not None:
        finish()
    if held is not None:
        yield held
    return handed
