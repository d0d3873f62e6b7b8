"""Check a packed output against its manifest and the output contract, one shard at a time.

Each shard is checked for presence, checksum, row and token counts, schema, and the row contract
(lengths, seq_lengths, position_ids, labels, padding segments), a batch of rows at a time with numpy;
only each row's sample_index values are kept across shards, for the uniqueness and count checks at
the end. Problems are returned, not raised: a damaged output is a result, not an error.

This module checks the output as a whole (the manifest, each shard's file, checksum, schema and
counts, the samples across shards, the format's index files); the row checks are ``row_checks``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from packcli.contract import MANIFEST, OPTIONAL_COLUMNS, PREFIX_TREES, SHARD_SCHEMA, TREE_COLUMNS, Progress
from packcli.errors import Message, Opt, Part, Terms, first_line, parts_of, python_term
from packcli.jsontypes import JSONObject
from packcli.output.formats import FORMATS, MISSING_INDEX, ShardFormat, format_of, shard_batches, shard_schema
from packcli.output.manifest import manifest_problems, read_manifest
from packcli.output.rows import EXTENSIONS, file_sha256
from packcli.report.images import ImageChecker, image_checker, image_columns as images_to_read, image_total_problems
from packcli.report.row_checks import CHECKS, WEIGHTING_RULES, Expected, ShardTotals, check_batch, check_images

if TYPE_CHECKING:
    from packcli.report.reencode import Reencoded

SHARD_FILE = re.compile(r"^shard-\d+-of-\d+(" + "|".join(re.escape(e) for e in EXTENSIONS.values()) + ")$")
MAX_EXAMPLES = 5


@dataclass(frozen=True)
class Problem:
    """One thing wrong, and the file it is in (a shard, or manifest.json for the whole output)."""

    file: str
    message: str | Message  # a Message when it names an option

    def render(self, terms: Terms = python_term) -> str:
        """The problem in one line, options named by ``terms`` (the command line's flags for ``packcli verify``)."""
        message = self.message.render(terms) if isinstance(self.message, Message) else self.message
        return f"{self.file}: {message}"

    def __str__(self) -> str:
        return self.render()


@dataclass
class VerifyReport:
    """What was checked and what was found wrong."""

    directory: str
    shards: int = 0
    rows: int = 0
    tokens: int = 0
    sequences: int = 0
    samples: int = 0  # distinct (sample_index, piece_index) pairs: a pair's two samples, a split record's pieces
    records: int = 0  # distinct sample_index values: the input records the shards hold
    # The manifest's ``tokens``: the samples' real tokens, without padding segments or alignment padding.
    sample_tokens: int = 0
    alignment_padding_tokens: int = 0  # padding inside the samples' segments (--pad-to-multiple-of, CP, TP)
    index_files: list[str] = field(default_factory=list)  # the format's files beside the shards, checked
    images: int | None = None  # the images the rows hold and were checked (None: a text output)
    problems: list[Problem] = field(default_factory=list)
    reencoded: Reencoded | None = None  # --reencode N: what was encoded again and compared

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self, terms: Terms = python_term) -> JSONObject:
        """The report as JSON data; messages name options by ``terms`` (the flags for ``packcli verify --json``)."""

        def text(message: str | Message) -> str:
            return message.render(terms) if isinstance(message, Message) else message

        reencoded = self.reencoded.to_dict() if self.reencoded is not None else None
        if reencoded is not None and reencoded.get("skipped") is not None:
            reencoded = {**reencoded, "skipped": text(reencoded["skipped"])}
        return {
            "ok": self.ok,
            "directory": self.directory,
            "shards": self.shards,
            "rows": self.rows,
            "tokens": self.tokens,
            "sequences": self.sequences,
            "samples": self.samples,
            "records": self.records,
            "sample_tokens": self.sample_tokens,
            "alignment_padding_tokens": self.alignment_padding_tokens,
            "index_files": list(self.index_files),
            **({"images": self.images} if self.images is not None else {}),
            **({"reencoded": reencoded} if reencoded is not None else {}),
            "problems": [{"file": p.file, "message": text(p.message)} for p in self.problems],
        }


def verify_output(directory: Path, progress: Progress | None = None, reencode: int = 0) -> VerifyReport:
    """Check every shard of a packed output against its manifest and the contract; return the report.

    ``reencode``: that many rows are also encoded again from the inputs by ``tokenizers`` and compared
    (``packcli.report.reencode``). Raises OutputError only when the manifest itself cannot be read.
    """
    manifest = read_manifest(directory)
    report = VerifyReport(directory=str(directory))
    damaged = manifest_problems(manifest)
    if damaged:
        report.problems.extend(Problem(MANIFEST, f"{p}; the manifest is damaged") for p in damaged)
        return report
    options = manifest.get("options", {})
    listed_columns = manifest.get("columns")
    expect = Expected(
        max_len=int(manifest.get("max_len") or options.get("max_len") or 0),
        pad_to_max=bool(options.get("pad_to_max", False)),
        vocab_size=manifest.get("tokenizer", {}).get("vocab_size"),
        # Outputs of releases before piece_index have no such column: they are checked without it.
        columns=tuple(f.name for f in SHARD_SCHEMA if not isinstance(listed_columns, list) or f.name in listed_columns),
        pad_multiple=_pad_multiple(options),
        pad_offset=1 if options.get("output_format") == "megatron" else 0,
        task=str(manifest.get("task") or "sft"),
        loss_weighting=str(options["loss_weighting"]) if "loss_weighting" in options else None,
        mix_inputs=_mix_inputs(manifest),
        images=_manifest_images(manifest, report.problems),
        trees=manifest.get(PREFIX_TREES) is True,
    )
    entries = manifest.get("shards")
    if not isinstance(entries, list) or expect.max_len < 1:
        report.problems.append(Problem(MANIFEST, "has no shard list or no max_len; the manifest is damaged"))
        return report
    listed = set()
    index_parts: list[np.ndarray] = []
    piece_parts: list[np.ndarray] = []
    shard_ids: list[np.ndarray] = []
    sample_tokens = trainable = 0
    max_ids: list[int] = []
    images = ShardTotals()  # the image counts of every shard read
    for k, entry in enumerate(entries):
        name = str(entry.get("file", ""))
        listed.add(name)
        totals = _check_shard(directory, entry, expect, report.problems)
        if progress is not None:
            progress("Verifying shards", 1, len(entries))
        if totals is None:
            continue
        report.shards += 1
        report.rows += totals.rows
        report.tokens += totals.tokens
        sample_tokens += totals.sample_tokens
        report.alignment_padding_tokens += totals.alignment
        trainable += totals.trainable
        images.images += totals.images
        images.image_tokens += totals.image_tokens
        images.image_samples += totals.image_samples
        images.embedded_images += totals.embedded_images
        if totals.max_id is not None:
            max_ids.append(totals.max_id)
        if totals.index:
            part = np.concatenate(totals.index)
            index_parts.append(part)
            piece_parts.append(np.concatenate(totals.pieces))
            shard_ids.append(np.full(len(part), k, dtype=np.int32))
    for path in sorted(directory.iterdir()):
        if SHARD_FILE.match(path.name) and path.name not in listed:
            report.problems.append(Problem(path.name, "is not listed in manifest.json (a leftover from another run?)"))
    index = np.concatenate(index_parts) if index_parts else np.zeros(0, np.int64)
    pieces = np.concatenate(piece_parts) if piece_parts else np.zeros(0, np.int64)
    owner = np.concatenate(shard_ids) if shard_ids else np.zeros(0, np.int32)
    report.sequences = len(index)
    report.sample_tokens = sample_tokens
    complete = report.shards == len(entries)
    report.records, report.samples = _check_samples(index, pieces, owner, entries, manifest, report.problems, complete)
    if expect.images is not None:
        report.images = images.images
    if complete:
        _check_totals(manifest, report, sample_tokens, trainable)
        if expect.images is not None:
            held = {
                "samples": images.image_samples,
                "images": images.images,
                "image_tokens": images.image_tokens,
                "embedded": images.embedded_images,
            }
            report.problems += [Problem(MANIFEST, p) for p in image_total_problems(manifest, held)]
        largest = max(max_ids, default=None)
        if manifest.get("max_token_id") is not None and manifest["max_token_id"] != largest:
            # Trainers size the embedding check by it (packcli.train.checks): a wrong value passes a model too small.
            report.problems.append(
                Problem(MANIFEST, f"says the largest id is {manifest['max_token_id']}, the shards hold {largest}")
            )
    _check_index_files(directory, manifest, entries, expect.max_len, report, complete)
    if reencode and complete and not report.problems:
        from packcli.report.reencode import reencode_rows

        again = reencode_rows(directory, manifest, reencode)
        report.reencoded = again
        report.problems += [Problem(file, what) for file, what in again.differ]
    return report


def _output_format(manifest: JSONObject, entries: list[JSONObject]) -> ShardFormat | None:
    """The format the output was written in: the manifest's --output-format, else its shards' extension."""
    name = manifest.get("options", {}).get("output_format")
    if isinstance(name, str) and name in FORMATS:
        return FORMATS[name]
    for entry in entries:
        try:
            return format_of(Path(str(entry.get("file", ""))))
        except ValueError:
            continue
    return None


def _check_index_files(
    directory: Path,
    manifest: JSONObject,
    entries: list[JSONObject],
    max_len: int,
    report: VerifyReport,
    complete: bool,
) -> None:
    """Check the files the output format keeps beside its shards (MDS's index.json, Megatron's metadata).

    A trainer's reader opens them, not the manifest: each must be there and say what the shards hold.
    Their contents are compared only when every shard could be read (the others' problems say why not).
    """
    fmt = _output_format(manifest, entries)
    names = list(fmt.index_files) if fmt is not None else []
    listed = manifest.get("index_files")
    if isinstance(listed, list):  # manifest_problems does not check this key: bare file names only
        names += [n for n in listed if isinstance(n, str) and n and Path(n).name == n and n not in names]
    report.index_files = names
    missing = [name for name in names if not (directory / name).is_file()]
    for name in missing:
        why = MISSING_INDEX if fmt is not None and name in fmt.index_files else "manifest.json lists it"
        report.problems.append(Problem(name, f"is missing: {why}, but the file is not there"))
    if fmt is None or not fmt.index_files or missing or not complete:
        return
    try:
        found = fmt.index_problems(directory, [str(e.get("file", "")) for e in entries], max_len)
    except (OSError, pa.ArrowException, ValueError) as exc:
        found = [(fmt.index_files[0], f"cannot be checked against the shards ({first_line(exc)})")]
    report.problems.extend(Problem(name, message) for name, message in found)


def _pad_multiple(options: JSONObject) -> int:
    """The multiple the output's samples were padded to (PackConfig.pad_multiple, from the manifest)."""
    try:
        n, cp, tp = (int(options.get(k, 1) or 1) for k in ("pad_to_multiple_of", "context_parallel", "tensor_parallel"))
    except (TypeError, ValueError):
        return 1
    return math.lcm(max(n, 1), 2 * cp if cp > 1 else 1, tp * cp if tp > 1 else 1)


def _check_shard(directory: Path, entry: JSONObject, expect: Expected, problems: list[Problem]) -> ShardTotals | None:
    name = str(entry.get("file", ""))
    path = directory / name
    if not name or not path.is_file():
        problems.append(Problem(name or MANIFEST, "is missing: manifest.json lists it but the file is not there"))
        return None
    if file_sha256(path) != entry.get("sha256"):
        problems.append(Problem(name, "sha256 differs from manifest.json: the file was changed or is damaged"))
    totals = ShardTotals()
    try:
        schema = shard_schema(path)
        required = [f for f in SHARD_SCHEMA if f.name in expect.columns]
        missing = [f.name for f in required if f.name not in schema.names]
        if missing:
            problems.append(Problem(name, f"lacks the column(s) {', '.join(missing)}"))
            return None
        wrong = [
            f"{f.name} is {schema.field(f.name).type}, not {f.type}"
            for f in required
            if schema.field(f.name).type != f.type
        ]
        if wrong:
            problems.append(Problem(name, "has columns of the wrong type: " + "; ".join(wrong)))
        if expect.task != "sft" and "sample_role" not in schema.names:
            problems.append(Problem(name, f"lacks the column sample_role (the output holds {expect.task} data)"))
        tree_columns = [c for c in TREE_COLUMNS if c in schema.names]
        if expect.trees and len(tree_columns) < len(TREE_COLUMNS):
            problems.append(Problem(name, f"lacks the tree columns ({MANIFEST} says the output holds prefix trees)"))
        elif tree_columns and not expect.trees:
            problems.append(
                Problem(name, f"has tree columns, but {MANIFEST} does not say prefix_trees (trainers read plain rows)")
            )
        if expect.pad_multiple > 1 and "seq_lengths_unpadded" not in schema.names:
            problems.append(Problem(name, "lacks the column seq_lengths_unpadded (the output was padded per sample)"))
        weighted = expect.loss_weighting in WEIGHTING_RULES
        if weighted and "loss_weights" not in schema.names:
            problems.append(
                Problem(
                    name,
                    Message(
                        "lacks the column loss_weights (the output was packed with ",
                        Opt("loss_weighting", expect.loss_weighting),
                        ")",
                    ),
                )
            )
        elif expect.loss_weighting == "token" and "loss_weights" in schema.names:
            problems.append(
                Problem(
                    name,
                    Message(
                        "has a loss_weights column, but the output was packed with ", Opt("loss_weighting", "token")
                    ),
                )
            )
        optional = [f.name for f in OPTIONAL_COLUMNS if f.name in schema.names and schema.field(f.name).type == f.type]
        image_columns: list[str] = []
        if expect.images is not None:
            found: list[str] = []
            image_columns = images_to_read(schema, found)
            problems += [Problem(name, p) for p in found]
        for batch in shard_batches(path, [*[f.name for f in required], *optional, *image_columns]):
            check_batch(batch, totals.rows, expect, totals)
            if image_columns:
                check_images(batch, totals.rows, expect.images, totals)  # type: ignore[arg-type]
            totals.rows += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        first = first_line(exc)
        problems.append(Problem(name, f"cannot be read ({first})"))
        return None
    for check, (count, first_row) in totals.failures.items():
        said = {
            "max_len": expect.max_len,
            "vocab_size": expect.vocab_size,
            "weighting": expect.loss_weighting,
            "rule": WEIGHTING_RULES.get(str(expect.loss_weighting)),
        }
        parts: list[Part] = [p.format(**said) if isinstance(p, str) else p for p in parts_of(CHECKS[check])]
        noun = "row" if count == 1 else "rows"
        if count == 1:
            parts[0] = _singular(str(parts[0]))
        detail = f": {totals.first_problem[check]}" if check in totals.first_problem else ""
        words = Message(f"{count} {noun} ", *parts, f" (first: row {first_row}{detail})")
        problems.append(Problem(name, words if any(isinstance(p, Opt) for p in parts) else str(words)))
    if entry.get("rows") != totals.rows:
        problems.append(Problem(name, f"has {totals.rows} rows, manifest.json says {entry.get('rows')}"))
    if entry.get("tokens") != totals.tokens:
        problems.append(Problem(name, f"has {totals.tokens} tokens, manifest.json says {entry.get('tokens')}"))
    if entry.get("max_token_id") is not None and entry["max_token_id"] != totals.max_id:
        problems.append(
            Problem(name, f"has {totals.max_id} as its largest id, manifest.json says {entry['max_token_id']}")
        )
    return totals


def _singular(message: str) -> str:
    for plural, singular in (("have ", "has "), ("are ", "is ")):
        if message.startswith(plural):
            return singular + message[len(plural) :]
    return message


def _mix_inputs(manifest: JSONObject) -> tuple[np.ndarray, np.ndarray] | None:
    """--mix: each input's first sample_index, ascending, and its source, from the manifest's ``mix``."""
    if "mix" not in manifest:
        return None
    sources = manifest["mix"].get("sources") if isinstance(manifest["mix"], dict) else None
    try:
        assert isinstance(sources, list)
        pairs = sorted((int(r[0]), m) for m, s in enumerate(sources) for r in s["sample_index"])
    except (AssertionError, TypeError, ValueError, KeyError, IndexError, AttributeError):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)  # no sample can match: every source value fails
    return np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)


def _check_samples(
    index: np.ndarray,
    pieces: np.ndarray,
    owner: np.ndarray,
    entries: list[JSONObject],
    manifest: JSONObject,
    problems: list[Problem],
    complete: bool,
) -> tuple[int, int]:
    """Check that each (sample_index, piece_index) appears once across shards, and the counts.

    Return the number of distinct records (sample_index values) and of distinct samples
    ((sample_index, piece_index) pairs). When some shards could not be read (``complete`` false) only
    what the others prove is reported.
    """
    counts = manifest.get("counts", {})
    order = np.lexsort((pieces, index))
    sorted_index, sorted_pieces = index[order], pieces[order]
    same_index = sorted_index[1:] == sorted_index[:-1]
    repeat = np.flatnonzero(same_index & (sorted_pieces[1:] == sorted_pieces[:-1])) + 1
    distinct = len(index) - int(np.count_nonzero(same_index))
    repeats = int(manifest.get("mix", {}).get("repeats", 0)) if isinstance(manifest.get("mix"), dict) else 0
    allowed = int(counts.get("duplicated", 0)) + repeats  # rank padding, and --mix's repeated records
    if len(repeat) > allowed or (complete and len(repeat) != allowed):
        for r in repeat[:MAX_EXAMPLES]:
            value, piece = int(sorted_index[r]), int(sorted_pieces[r])
            first = entries[int(owner[order[r - 1]])]["file"]
            again = entries[int(owner[order[r]])]["file"]
            where = "again in the same shard" if first == again else f"also in {first}"
            name = f"sample_index {value}" + (f" piece {piece}" if piece else "")
            problems.append(Problem(again, f"{name} appears {where}"))
        what = f"{len(repeat)} repeated (sample_index, piece_index) pair" + ("s" if len(repeat) != 1 else "")
        expected = (
            (f"manifest.json counts {allowed} duplicated by rank padding or repeated by ", Opt("mix"))
            if allowed
            else ("each must appear once",)
        )
        problems.append(Problem(MANIFEST, Message(f"{what}; ", *expected) if allowed else f"{what}; {expected[0]}"))
    packed = counts.get("packed")
    if packed is not None and distinct != packed:
        message = f"the shards hold {distinct} distinct records, manifest.json counts {packed} packed"
        if not complete:
            message += " (the missing or unreadable shards hold the rest)"
        problems.append(Problem(MANIFEST, message))
    held = len(index) - len(repeat) + repeats  # a repeated record's copies are samples
    samples = counts.get("samples")  # pieces of split records are samples of their own
    if samples is not None and complete and held != samples:
        problems.append(Problem(MANIFEST, f"the shards hold {held} samples, manifest.json counts {samples}"))
    return distinct, held


def _check_totals(manifest: JSONObject, report: VerifyReport, sample_tokens: int, trainable: int) -> None:
    if manifest.get("rows") is not None and manifest["rows"] != report.rows:
        report.problems.append(Problem(MANIFEST, f"counts {manifest['rows']} rows, the shards hold {report.rows}"))
    if manifest.get("tokens") is not None and manifest["tokens"] != sample_tokens:
        report.problems.append(
            Problem(MANIFEST, f"counts {manifest['tokens']} tokens, the shards hold {sample_tokens} sample tokens")
        )
    # Rank padding repeats rows but the manifest counts their trainable tokens once.
    duplicated = manifest.get("counts", {}).get("duplicated", 0)
    if not duplicated and manifest.get("trainable_tokens") is not None and manifest["trainable_tokens"] != trainable:
        report.problems.append(
            Problem(
                MANIFEST,
                f"counts {manifest['trainable_tokens']} trainable tokens, the shards hold {trainable}",
            )
        )


def _manifest_images(manifest: JSONObject, problems: list[Problem]) -> ImageChecker | None:
    found: list[str] = []
    checker = image_checker(manifest, found)
    problems += [Problem(MANIFEST, p) for p in found]
    return checker
