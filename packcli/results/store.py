"""What the token store records: its ``meta.json`` (``StoreMeta``, with its files, segments and cache
part), the tokenizer's identity it shares with the manifest, and a sample's images in its image table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NotRequired, TypedDict

from packcli.jsontypes import JSONObject, TemplateKwargs
from packcli.results.base import IN_MEMORY, DamagedResult, JSONRecord, record_dict, record_from_dict
from packcli.results.summary import EncoderInfo, Split

# -- a sample's images -----------------------------------------------------------------------------


class ImageRecord(TypedDict, total=False):
    """One image of a sample, as the token store's image table (images.jsonl) and the rows record it:
    the file (``path``, with its ``stat`` stamp when read) or the image's ``bytes`` (``path`` None), its
    size [height, width], the processor's grid and tokens, and where its tokens are in the sample
    (``offset``, ``span``)."""

    path: str | None
    stat: Any  # the file's stamp when it was read (packcli.io.fingerprint.file_stamp), or None
    bytes: bytes
    size: list[int]
    grid: list[int]
    tokens: int
    offset: int
    span: int


# -- the tokenizer's identity ----------------------------------------------------------------------


class ProcessorIdentity(TypedDict, total=False):
    """An image-text run's processor, as the store and the manifest record it under the tokenizer's
    identity: its directory, family, image token and its id, sha256, and the image counts."""

    dir: str
    family: str
    image_token: str
    image_token_id: int | None
    sha256: str
    images: dict[str, int]  # samples, images, image_tokens, embedded (packcli.output.images.IMAGE_COUNTS)


class TokenizerIdentity(TypedDict, total=False):
    """What identifies the tokenizer and its chat template (packcli.tokenize.encoders.encoder.Encoder.identity):
    recorded in the store's meta.json and the manifest, part of the cache key. Keys are missing from
    entries made before they were recorded (hence not total)."""

    name: str
    sha256: str
    vocab_size: int
    vocab_sha256: str
    eos_token: str | None
    special_tokens: dict[str, str]
    special_token_ids: dict[str, int]
    chat_template: str
    chat_template_source: str  # tokenizer | file | packcli | default
    chat_template_sha256: str
    chat_template_generation_blocks: bool
    chat_template_kwargs: TemplateKwargs
    overridden: list[str]
    warnings: list[str]
    processor: ProcessorIdentity  # an image-text run's


# -- the token store's meta.json -------------------------------------------------------------------


class FileDigest(TypedDict):
    """A store file's entry in meta.json (``files``): its size and sha256."""

    bytes: int
    sha256: str


class Segment(TypedDict):
    """A segment of a store's token files (``segments``): the prefix of its files' names and its tokens."""

    prefix: str
    tokens: int


class PartInfo(TypedDict):
    """A cache part's place in its input (``part``): its number, first record, records, whether it is
    its input's last, and (a part of an engine's cuts) the lines or records its reading passed.

    A part of a JSON lines file (keyed by it) also holds ``end``, the hash of the file's bytes from its
    start through the part's last record."""

    index: int
    first: int
    records: int
    last: bool
    units: NotRequired[int]
    end: NotRequired[str]


@dataclass(frozen=True, kw_only=True)
class StoreSource(JSONRecord):
    """An input of the store (``sources``): its path as the run that made it named it, its kind, its
    record format (null when none was found for it) and the unit of its positions (line or record)."""

    NULLS: ClassVar[frozenset[str]] = frozenset({"format"})

    path: str
    kind: str  # jsonl | json | parquet | csv | arrow | saved_dataset | hub (packcli.io.sources.InputSource)
    format: str | None
    unit: str

    WHAT: ClassVar[str] = "a source of meta.json"


@dataclass(frozen=True, kw_only=True)
class StoreMade(JSONRecord):
    """When and by which packcli version a store was made (``made``), and, for a store assembled from
    cache parts, how many parts it joined."""

    packcli_version: str
    time: float  # seconds since the epoch, rounded to milliseconds
    parts: int | None = None

    WHAT: ClassVar[str] = "meta.json's made"


def _sources(value: object) -> list[StoreSource]:
    if not isinstance(value, list):
        raise DamagedResult("meta.json's sources is not a list")
    return [StoreSource.from_dict(s) for s in value]


@dataclass(frozen=True, kw_only=True)
class StoreMeta:
    """A token store's ``meta.json``: how its tokens were made, the records' counts, and its files.

    Written with sorted keys (its checksum, ``meta_sha256``, is of that text less itself); a field that
    is None is not written. A run that finds an entry made from other paths names its own in memory
    (``original_paths`` keeps the old). ``segments``, ``files`` and ``meta_sha256`` are set by
    ``TokenStoreWriter.finish``: the metadata handed to it holds them empty.
    """

    tokenizer: TokenizerIdentity
    pad_id: int
    records_read: int
    dropped: dict[str, int]
    sources: list[StoreSource]
    source_starts: list[int]  # the sample_index of each input's first record
    segments: list[Segment]
    files: dict[str, FileDigest]  # by file name
    meta_sha256: str
    made: StoreMade | None = None
    split: Split | None = None
    turns_fixed: dict[str, int] | None = None
    empty_answers: int | None = None
    leading_answers: int | None = None
    tools_left_out: int | None = None
    reasoning: dict[str, int] | None = None
    expanded: dict[str, int] | None = None
    trees: dict[str, int] | None = None  # --prefix-tree: the trees made (TREE_KEYS)
    ruled_out_over_bytes: int | None = None
    ruled_out_max_len: int | None = None
    segment_root: str | None = None
    encoder: EncoderInfo | None = None  # name, fallback, records_slow (packcli.tokenize.encoders.text_encoders)
    # A cache part (packcli.store.parts): its number, first record, records and whether it is its input's last.
    part: PartInfo | None = None
    # In memory only: the paths of the inputs as the run that made a found entry named them.
    original_paths: list[str] | None = field(default=None, metadata={IN_MEMORY: True})
    # In memory only, in a --mix's views of the store: the mix source of each input (packcli.plan.views).
    mix_source_of_input: list[int] | None = field(default=None, metadata={IN_MEMORY: True})

    def to_dict(self) -> JSONObject:
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> StoreMeta:
        convert = {
            "sources": _sources,
            "made": StoreMade.from_dict,
            "split": Split.from_dict,
            "encoder": EncoderInfo.from_dict,
        }
        return record_from_dict(cls, data, "meta.json", convert)
