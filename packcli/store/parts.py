"""Cache parts: each input tokenized once, in parts of a fixed number of records, reused by any run.

A run's token store (its cache entry, keyed by all its inputs) is assembled from *parts*: one input's
records ``[first, first + records)``, tokenized with the run's tokenization options, kept as a cache
entry of its own (a token store whose meta.json says ``part``). A part is keyed by its input's
content hash, its reader and record format, its number and the tokenization options, never by the
other inputs: a run that adds an input, or swaps a --mix source, finds the parts of the inputs it
shares with an earlier run and tokenizes only the rest. Parts are committed as they are finished
(atomically, with their checksums, as any entry), so a run killed while it tokenizes leaves the parts
it finished, and the next run resumes after them.

Part ``i`` of an input holds the batches of ``BATCH_SIZE`` records whose first record's number
(within the input, from 0) divided by ``PART_RECORDS`` is ``i``; its meta.json records its first
record's number, its records and whether it is the input's last. Its samples' ``sample_index`` counts
from the input's first record, its rejects and --fix-turns lines likewise: assembling adds the
input's start in the run (``assemble``), so a store assembled from parts equals, sample for sample,
one made in one pass.

The assembled store's token files are hard links to its parts' (a copy where links are refused):
the parts may be pruned without harming it, and the cache holds the tokens once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.errors import OutputError, Text
from packcli.io.readers import PartEnds
from packcli.io.sources import InputSource
from packcli.jsontypes import JSONObject
from packcli.results import PartInfo, Split, StoreMade, StoreMeta, StoreSource
from packcli.store.integrity import segment_files
from packcli.store.key import cache_key
from packcli.store.tokens import TokenStore
from packcli.store.writer import TokenStoreWriter
from packcli.version import __version__

# Records of one input in a part (a multiple of the tokenizing batch, so a batch lies in one part).
PART_RECORDS = 32768
# A JSON lines file's part also ends at the record that takes it to this many bytes (what a read holds
# while it finds whether the cache has the part).
PART_BYTES = 1 << 25
REJECTS, TURN_FIXES = "rejects.jsonl", "turn_fixes.jsonl"


def part_key(
    source: list[Any],
    index: int,
    options: JSONObject,
    batch_size: int,
    cuts: list[Any] | None = None,
    through: str | None = None,
) -> str:
    """The cache key of part ``index`` of an input (``source``: its kind, compression, format and
    content hash), tokenized with ``options`` (the run's key but its inputs).

    ``cuts``: where an engine cuts the input otherwise than in parts of PART_RECORDS records (the Ray
    engine: byte ranges, row groups), its cuts, the part's own in its key.

    ``through``: a local file's part is keyed by the hash of what the file holds from its start through
    the part's last record, not by the file's hash (``source`` then holds no hash): a JSON lines file's
    bytes, another kind's records (``io.readers.read_parts``). A run finds the part once it has read it,
    before the whole is hashed, and a file that grew, or was edited after it, keeps the part.
    """
    if through is not None:
        layout: JSONObject = {
            "index": index, "records": PART_RECORDS, "bytes": PART_BYTES, "batch": batch_size, "through": through,
        }  # fmt: skip
    elif cuts is None:
        layout = {"index": index, "records": PART_RECORDS, "batch": batch_size}
    else:
        layout = {"index": index, "cut": cuts[index], "batch": batch_size}
    return cache_key({"part": source, "layout": layout, **options})


def part_layout(source: InputSource) -> str:
    """How a file is cut into parts (``PartEnds``: a JSON lines file by its bytes, the other kinds by their
    records): the memo keeps the ends of its parts under it."""
    by = "" if source.kind == "jsonl" else "records:"
    return f"{by}{PART_RECORDS}/{PART_BYTES}"


@dataclass
class InputParts:
    """One input of a run: its parts found in the cache, and the keys of those to make.

    A local file read in this process (``chained``) is cut into parts by what it holds and each part
    keyed by the hash through its end: its parts are found as it is read (``read``), or without reading
    it when the memo remembers those hashes for the file as it is (``chain``). The others' parts (a saved
    or Hub dataset, a URI, an input the Ray engine reads) are keyed by the input's hash, and found before
    it is read.
    """

    source: InputSource
    number: int  # its place among the run's inputs
    keying: Any  # Callable[..., str]: part number (and ``through``, chained) -> cache key
    cuts: list[Any] | None = None  # the engine's cuts of the input (None: parts of PART_RECORDS records)
    found: list[TokenStore] = field(default_factory=list)  # parts found usable
    made: list[TokenStore] = field(default_factory=list)  # parts made by this run
    chained: bool = False
    chain: list[str] | None = None  # a chained input's part ends, remembered with its hash
    read: PartEnds | None = None  # what reading a chained input learned of its parts
    ended: bool = False  # a chained input's parts are all found or made
    find: Any = None  # Callable[[str], TokenStore | None]: a part found (and locked) by its key, or None

    def key_of(self, number: int) -> str:
        """The cache key of part ``number`` (a chained input's once its end is known)."""
        if not self.chained:
            return str(self.keying(number))
        ends = self.read.ends if self.read is not None else self.chain
        assert ends is not None and number < len(ends)
        return str(self.keying(number, through=ends[number]))

    @property
    def complete(self) -> bool:
        """Whether the parts found hold the whole input (the last of them is its last part)."""
        if self.chained:
            return self.ended and not self.made
        return bool(self.found) and bool(part_info(self.found[-1])["last"])

    @property
    def next_index(self) -> int:
        return len(self.found) + len(self.made)

    @property
    def next_record(self) -> int:
        """The number of the first record no part found or made holds."""
        done = self.parts
        if not done:
            return 0
        last = part_info(done[-1])
        return int(last["first"]) + int(last["records"])

    @property
    def next_unit(self) -> int:
        """The lines (or records) that the reading of the parts found or made passed (parts of an engine's cuts)."""
        return sum(int(part_info(p).get("units", 0)) for p in self.found + self.made)

    @property
    def parts(self) -> list[TokenStore]:
        """The parts found and made, in input order (a chained input's are found and made as it is read)."""
        done = self.found + self.made
        return sorted(done, key=lambda p: int(part_info(p)["index"])) if self.chained else done

    def records(self, which: list[TokenStore]) -> int:
        return sum(int(part_info(p)["records"]) for p in which)


def part_info(part: TokenStore) -> PartInfo:
    """A cache part's place in its input (its meta.json's ``part``)."""
    assert part.meta.part is not None, "a cache part's meta.json says which part it is"
    return part.meta.part


def part_meta(
    index: int,
    first: int,
    records: int,
    last: bool,
    units: int | None = None,
    read: PartEnds | None = None,
) -> PartInfo:
    """What a part's meta.json says of its place in its input (``units``: the lines or records its
    reading passed, for a part of an engine's cuts: what the positions of the parts after it add;
    ``read``: a JSON lines file's ends, its part's ``end`` taken from it. Such a part may be another
    file's too, or the same file's once it grew: ``last`` is then False)."""
    info: PartInfo = {"index": index, "first": first, "records": records, "last": last and read is None}
    if units is not None:
        info["units"] = units
    if read is not None:
        info["end"] = read.ends[index]
    return info


def assemble(
    inputs: list[InputParts], formats: dict[str, str | None], path: Path, where: Path, fix: Text
) -> TokenStore:
    """Make the run's token store at ``path`` from its inputs' parts, in input order.

    The samples' arrays are joined (each input's ``sample_index`` moved on by the records before it),
    the token files linked (a segment per part), the rejects and --fix-turns lines joined and renamed
    to this run's inputs, and the counts added up. Nothing is tokenized and no token read.
    """
    writer = TokenStoreWriter(path, fix, where)
    assert writer.tmp is not None
    tmp = writer.tmp
    try:
        metas: list[StoreMeta] = []
        start = 0
        starts: list[int] = []
        units: list[str] = []
        linked = 0  # parts with samples: a segment each
        with (
            open(tmp / REJECTS, "w", encoding="utf-8") as rejects,
            open(tmp / TURN_FIXES, "w", encoding="utf-8") as fixes,
        ):
            for item in inputs:
                starts.append(start)
                unit = "record"
                for part in item.parts:  # their sample_index counts from the input's first record
                    meta = part.meta
                    metas.append(meta)
                    unit = meta.sources[0].unit if meta.records_read else unit
                    _lines(part.path / REJECTS, rejects, start, item.source.display)
                    _lines(part.path / TURN_FIXES, fixes, start, item.source.display)
                    if len(part.lengths):
                        _add_part(writer, tmp, part, start, linked)
                        linked += 1
                start += sum(part.meta.records_read for part in item.parts)
                units.append(unit)
        sources = [
            StoreSource(path=i.source.display, kind=i.source.kind, format=formats[i.source.display], unit=u)
            for i, u in zip(inputs, units, strict=True)
        ]
        return writer.finish(dataclasses.replace(merged_meta(metas), sources=sources, source_starts=starts))
    except OSError as exc:
        writer.abort()
        raise OutputError(f"{where}: cannot write the token store ({exc.strerror or exc})", hint=fix) from exc
    except BaseException:
        writer.abort()
        raise


def _add_part(writer: TokenStoreWriter, tmp: Path, part: TokenStore, start: int, number: int) -> None:
    """Add a part's samples to the store being assembled, its token files linked in as one segment."""
    (segment,) = part.meta.segments  # a part is made in one pass by this process: one segment
    prefix = f"segments/part{number:05d}-"
    (tmp / "segments").mkdir(exist_ok=True)
    files = {}
    for theirs, ours in zip(segment_files(segment["prefix"]), segment_files(prefix), strict=True):
        _link(Path(part.segment_root) / theirs, tmp / ours)
        files[ours] = part.meta.files[theirs]
    roles = part.sample_role if part.sample_role is not None and part.sample_role.any() else None
    writer.add_segment(
        {"prefix": prefix, "tokens": int(segment["tokens"])},
        files,
        part.sample_index + start,
        part.lengths,
        part.trainable,
        part.first_trained,
        part.positions,
        part.piece_index,
        roles,
        content_keys=part.content_key,
        tree_nodes=part.tree_nodes,
    )


def _link(src: Path, dst: Path) -> None:
    """Hard-link ``src`` at ``dst``; copy it where the filesystem refuses links."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(src, dst)


def _lines(path: Path, out: Any, start: int, display: str) -> None:
    """Copy a part's rejects or --fix-turns lines, their ``sample_index`` moved on by ``start`` and their
    ``source`` this run's name of the input."""
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as src:
        for line in src:
            entry = json.loads(line)
            entry["sample_index"] = int(entry["sample_index"]) + start
            entry["source"] = display
            try:
                text = json.dumps(entry, ensure_ascii=False)
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: kept escaped, as it was
                text = json.dumps(entry)
            out.write(text + "\n")


def merged_meta(metas: list[StoreMeta]) -> StoreMeta:
    """The meta.json of a store assembled from parts but its sources, starts, segments, files and checksum
    (which are empty): counts added up, the tokenizer's identity and the pad id those of the parts (the
    same: they are in the key), the records ruled out untokenized those of the strictest part."""
    split = _added(metas, "split")
    encoders = [m.encoder for m in metas if m.encoder is not None]
    slow = sum(e.records_slow or 0 for e in encoders)
    return StoreMeta(
        tokenizer=metas[0].tokenizer,
        pad_id=metas[0].pad_id,
        records_read=_added(metas, "records_read"),
        dropped=dict(sorted((_added(metas, "dropped") or {}).items())),
        sources=[],
        source_starts=[],
        segments=[],
        files={},
        meta_sha256="",
        turns_fixed=_added(metas, "turns_fixed"),
        empty_answers=_added(metas, "empty_answers"),
        leading_answers=_added(metas, "leading_answers"),
        tools_left_out=_added(metas, "tools_left_out"),
        reasoning=_added(metas, "reasoning"),
        expanded=_added(metas, "expanded"),
        trees=_added(metas, "trees"),
        split=None if split is None else Split.from_dict(split),
        encoder=dataclasses.replace(encoders[-1], records_slow=slow) if encoders else None,
        ruled_out_over_bytes=_least(metas, "ruled_out_over_bytes"),
        ruled_out_max_len=_least(metas, "ruled_out_max_len"),
        made=StoreMade(packcli_version=__version__, time=round(time.time(), 3), parts=len(metas)),
    )


def _added(metas: list[StoreMeta], key: str) -> Any:
    """A count of the parts' meta.json added up over the parts that have it (None: none has), a dict of
    counts key by key."""
    values = [v.to_dict() if isinstance(v, Split) else v for m in metas if (v := getattr(m, key)) is not None]
    return _sum(values) if values else None


def _least(metas: list[StoreMeta], key: str) -> int | None:
    values = [int(v) for m in metas if (v := getattr(m, key)) is not None]
    return min(values) if values else None


def _sum(values: list[Any]) -> Any:
    if isinstance(values[0], dict):
        keys: dict[str, None] = {}
        for v in values:
            keys.update(dict.fromkeys(v))
        return {k: _sum([v[k] for v in values if k in v]) for k in keys}
    return sum(int(v) for v in values)


def reused_records(inputs: list[InputParts]) -> dict[str, int]:
    """How many parts and records a run found in the cache, and how many it tokenized."""
    return {
        "parts_reused": sum(len(i.found) for i in inputs),
        "parts_made": sum(len(i.made) for i in inputs),
        "records_reused": sum(i.records(i.found) for i in inputs),
        "records_tokenized": sum(i.records(i.made) for i in inputs),
    }
