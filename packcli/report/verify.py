"""Check a packed output against its manifest and the output contract, one shard at a time.

Each shard is checked for presence, checksum, row and token counts, schema, and the row contract
(lengths, seq_lengths, position_ids, labels, padding segments), a batch of rows at a time with numpy;
only each row's sample_index values are kept across shards, for the uniqueness and count checks at
the end. Problems are returned, not raised: a damaged output is a result, not an error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packcli.contract import IGNORE_INDEX, MANIFEST, OPTIONAL_COLUMNS, SHARD_SCHEMA, Progress
from packcli.errors import first_line
from packcli.output.formats import FORMATS, MISSING_INDEX, ShardFormat, format_of, shard_batches, shard_schema
from packcli.output.rows import EXTENSIONS, file_sha256, loss_weights, manifest_problems, read_manifest
from packcli.plan.packing import pad_lengths
from packcli.report.stats import list_parts

SHARD_FILE = re.compile(r"^shard-\d+-of-\d+(" + "|".join(re.escape(e) for e in EXTENSIONS.values()) + ")$")
MAX_EXAMPLES = 5

# Each row check: a key, and the message for the rows that fail it.
CHECKS = {
    "nulls": "hold null values",
    "token_columns": "have input_ids, labels and position_ids of different lengths",
    "segment_columns": "have seq_lengths, sample_index and piece_index of different lengths",
    "empty": "are empty",
    "too_long": "are longer than max_len {max_len}",
    "not_padded": "are not padded to max_len {max_len} (the output was packed with --pad-to-max)",
    "seq_lengths_positive": "have a seq_lengths value below 1",
    "seq_lengths_sum": "have seq_lengths that do not sum to the row length",
    "vocab": "have input_ids outside the tokenizer's vocabulary [0, {vocab_size})",
    "positions": "have position_ids that do not run 0..n-1 restarting at every sample",
    "first_label": "have a sample whose first label is not -100",
    "labels": "have labels that differ from input_ids where they are not -100",
    "sample_index": "have a sample_index below -1",
    "padding_unexpected": "have a padding segment (sample_index -1) but the output was packed without --pad-to-max",
    "padding_labels": "have a padding segment with labels other than -100",
    "padding_not_last": "have a padding segment that is not the row's last segment",
    "sample_index_order": "have (sample_index, piece_index) pairs that do not ascend within the row",
    "piece_index": "have a piece_index below 0 (or other than 0 on a padding segment)",
    "unpadded": "have seq_lengths_unpadded values that are not the real length of their segment",
    "alignment": "have samples not padded to the multiple the output was packed with (--pad-to-multiple-of)",
    "alignment_labels": "have labels other than -100 in a sample's alignment padding",
    "sample_role": "have sample_role values that are not the task's (preference: 1 chosen, 2 rejected; kto: 3 "
    "desirable, 4 undesirable; 0 on a padding segment), or not one per sample",
    "pairs": "have a chosen sample not followed by its rejected sample (the same sample_index, piece 0 then 1), "
    "or a rejected sample without its chosen one before it",
    # -- mixtures
    "source": "have source values that are not the manifest's mix source of their sample_index (-1 on a padding "
    "segment), or not one per sample",
    "loss_weights": "have loss_weights that are negative, not finite, of the wrong length or set where labels are -100",
    "loss_weights_values": "have loss_weights that are not the {weighting} weighting the manifest records "
    "(--loss-weighting {weighting}: {rule} on each of a sample's n trained tokens)",
}
WEIGHTING_RULES = {"sample": "1/n", "sqrt": "1/sqrt(n)"}
# loss_weights are float32: a recomputed weight may differ from the stored one in its last bits only.
WEIGHT_RTOL = 1e-6


@dataclass(frozen=True)
class Problem:
    """One thing wrong, and the file it is in (a shard, or manifest.json for the whole output)."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


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
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
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
            "problems": [{"file": p.file, "message": p.message} for p in self.problems],
        }


@dataclass
class _Expect:
    max_len: int
    pad_to_max: bool
    vocab_size: int | None
    columns: tuple[str, ...] = tuple(SHARD_SCHEMA.names)
    pad_multiple: int = 1
    pad_offset: int = 0
    task: str = "sft"
    loss_weighting: str | None = None  # the manifest's --loss-weighting (None: not recorded)
    # -- mixtures: each input's first sample_index and its mix source (None: no --mix)
    mix_inputs: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class _ShardTotals:
    rows: int = 0
    tokens: int = 0  # every token in the rows, padding segments included (what the manifest's shard entry counts)
    sample_tokens: int = 0  # real sample tokens: padding segments and alignment padding left out
    alignment: int = 0  # alignment padding tokens
    trainable: int = 0
    failures: dict[str, list[int]] = field(default_factory=dict)  # check -> [count, first row]
    index: list[np.ndarray] = field(default_factory=list)
    pieces: list[np.ndarray] = field(default_factory=list)

    def fail(self, check: str, bad_rows: np.ndarray, first_row: int) -> None:
        rows = np.unique(bad_rows)
        if len(rows) == 0:
            return
        seen = self.failures.setdefault(check, [0, int(rows[0]) + first_row])
        seen[0] += len(rows)


def verify_output(directory: Path, progress: Progress | None = None) -> VerifyReport:
    """Check every shard of a packed output against its manifest and the contract; return the report.

    Raises OutputError only when the manifest itself cannot be read.
    """
    manifest = read_manifest(directory)
    report = VerifyReport(directory=str(directory))
    damaged = manifest_problems(manifest)
    if damaged:
        report.problems.extend(Problem(MANIFEST, f"{p}; the manifest is damaged") for p in damaged)
        return report
    options = manifest.get("options", {})
    listed_columns = manifest.get("columns")
    expect = _Expect(
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
    if complete:
        _check_totals(manifest, report, sample_tokens, trainable)
    _check_index_files(directory, manifest, entries, expect.max_len, report, complete)
    return report


def _output_format(manifest: dict[str, Any], entries: list[dict[str, Any]]) -> ShardFormat | None:
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
    manifest: dict[str, Any],
    entries: list[dict[str, Any]],
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
        found = fmt.index_problems(directory, entries, max_len)
    except (OSError, pa.ArrowException, ValueError) as exc:
        found = [(fmt.index_files[0], f"cannot be checked against the shards ({first_line(exc)})")]
    report.problems.extend(Problem(name, message) for name, message in found)


def _pad_multiple(options: dict[str, Any]) -> int:
    """The multiple the output's samples were padded to (PackConfig.pad_multiple, from the manifest)."""
    try:
        n, cp, tp = (int(options.get(k, 1) or 1) for k in ("pad_to_multiple_of", "context_parallel", "tensor_parallel"))
    except (TypeError, ValueError):
        return 1
    return math.lcm(max(n, 1), 2 * cp if cp > 1 else 1, tp * cp if tp > 1 else 1)


def _check_shard(
    directory: Path, entry: dict[str, Any], expect: _Expect, problems: list[Problem]
) -> _ShardTotals | None:
    name = str(entry.get("file", ""))
    path = directory / name
    if not name or not path.is_file():
        problems.append(Problem(name or MANIFEST, "is missing: manifest.json lists it but the file is not there"))
        return None
    if file_sha256(path) != entry.get("sha256"):
        problems.append(Problem(name, "sha256 differs from manifest.json: the file was changed or is damaged"))
    totals = _ShardTotals()
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
        if expect.pad_multiple > 1 and "seq_lengths_unpadded" not in schema.names:
            problems.append(Problem(name, "lacks the column seq_lengths_unpadded (the output was padded per sample)"))
        weighted = expect.loss_weighting in WEIGHTING_RULES
        if weighted and "loss_weights" not in schema.names:
            problems.append(
                Problem(
                    name,
                    f"lacks the column loss_weights (the output was packed with --loss-weighting "
                    f"{expect.loss_weighting})",
                )
            )
        elif expect.loss_weighting == "token" and "loss_weights" in schema.names:
            problems.append(
                Problem(name, "has a loss_weights column, but the output was packed with --loss-weighting token")
            )
        optional = [f.name for f in OPTIONAL_COLUMNS if f.name in schema.names and schema.field(f.name).type == f.type]
        for batch in shard_batches(path, [*[f.name for f in required], *optional]):
            _check_batch(batch, totals.rows, expect, totals)
            totals.rows += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        first = first_line(exc)
        problems.append(Problem(name, f"cannot be read ({first})"))
        return None
    for check, (count, first_row) in totals.failures.items():
        message = CHECKS[check].format(
            max_len=expect.max_len,
            vocab_size=expect.vocab_size,
            weighting=expect.loss_weighting,
            rule=WEIGHTING_RULES.get(str(expect.loss_weighting)),
        )
        noun = "row" if count == 1 else "rows"
        verb = message if count != 1 else _singular(message)
        problems.append(Problem(name, f"{count} {noun} {verb} (first: row {first_row})"))
    if entry.get("rows") != totals.rows:
        problems.append(Problem(name, f"has {totals.rows} rows, manifest.json says {entry.get('rows')}"))
    if entry.get("tokens") != totals.tokens:
        problems.append(Problem(name, f"has {totals.tokens} tokens, manifest.json says {entry.get('tokens')}"))
    return totals


def _singular(message: str) -> str:
    for plural, singular in (("have ", "has "), ("are ", "is ")):
        if message.startswith(plural):
            return singular + message[len(plural) :]
    return message


def _check_batch(batch: pa.RecordBatch, first_row: int, expect: _Expect, totals: _ShardTotals) -> None:
    """Run the row checks on one batch of rows; record failing rows (shard row numbers) in ``totals``.

    Token-sized work is a handful of comparisons over the flat columns; failing tokens and segments
    are mapped back to their rows only when there are any.
    """
    n = batch.num_rows
    cols = {name: batch.column(name) for name in expect.columns}
    null_rows = np.zeros(n, dtype=bool)
    for col in cols.values():
        null_rows |= col.is_null().to_numpy(zero_copy_only=False)
        if col.flatten().null_count:
            seg_lengths, _ = list_parts(col)
            nulls = col.flatten().is_null().to_numpy(zero_copy_only=False)
            null_rows[np.repeat(np.arange(n), seg_lengths)[nulls]] = True
    if null_rows.any():
        totals.fail("nulls", np.flatnonzero(null_rows), first_row)
        return
    row_len, ids = list_parts(cols["input_ids"])
    lab_len, labels = list_parts(cols["labels"])
    pos_len, positions = list_parts(cols["position_ids"])
    segs, seq_lengths = list_parts(cols["seq_lengths"])
    idx_len, index = list_parts(cols["sample_index"])
    if "piece_index" in cols:
        piece_len, piece = list_parts(cols["piece_index"])
    else:
        piece_len, piece = idx_len, np.zeros(len(index), np.int32)
    piece = piece.astype(np.int64)
    seq_lengths = seq_lengths.astype(np.int64)
    index = index.astype(np.int64)
    totals.tokens += int(row_len.sum())
    rows = np.arange(n)
    row_end = np.cumsum(row_len)
    seg_end = np.cumsum(segs)

    def token_rows(mask: np.ndarray) -> np.ndarray:
        return np.searchsorted(row_end, np.flatnonzero(mask), side="right")

    def segment_rows(mask: np.ndarray) -> np.ndarray:
        return np.searchsorted(seg_end, np.flatnonzero(mask), side="right")

    token_ok = (lab_len == row_len) & (pos_len == row_len)
    segment_ok = (idx_len == segs) & (piece_len == segs)
    totals.fail("token_columns", rows[~token_ok], first_row)
    totals.fail("segment_columns", rows[~segment_ok], first_row)
    totals.fail("empty", rows[row_len == 0], first_row)
    totals.fail("too_long", rows[row_len > expect.max_len], first_row)
    if expect.pad_to_max:
        totals.fail("not_padded", rows[row_len != expect.max_len], first_row)
    if expect.vocab_size:
        totals.fail("vocab", token_rows((ids < 0) | (ids >= expect.vocab_size)), first_row)
    if not (token_ok.all() and segment_ok.all()):
        return  # the columns do not line up; the checks below would only repeat this
    labelled = labels != IGNORE_INDEX
    totals.trainable += int(np.count_nonzero(labelled))
    totals.fail("labels", token_rows(labelled & (labels != ids)), first_row)
    totals.fail("sample_index", segment_rows(index < -1), first_row)
    totals.fail("piece_index", segment_rows((piece < 0) | ((index == -1) & (piece != 0))), first_row)
    totals.fail("seq_lengths_positive", segment_rows(seq_lengths < 1), first_row)
    seg_row = np.repeat(rows, segs)
    row_sums = np.bincount(seg_row, weights=seq_lengths, minlength=n).astype(np.int64)
    totals.fail("seq_lengths_sum", rows[row_sums != row_len], first_row)
    pad = index == -1
    # The contract: a row's samples are in ascending (sample_index, piece_index) order (padding aside).
    same_row = seg_row[1:] == seg_row[:-1]
    real_pair = ~pad[1:] & ~pad[:-1]
    unordered = np.zeros(len(index), dtype=bool)
    # (--mix: a repeated record's copies that no swap could part are equal neighbours)
    equal_bad = piece[1:] < piece[:-1] if expect.mix_inputs is not None else piece[1:] <= piece[:-1]
    before = (index[1:] < index[:-1]) | ((index[1:] == index[:-1]) & equal_bad)
    unordered[1:] = same_row & real_pair & before
    totals.fail("sample_index_order", seg_row[unordered], first_row)
    if pad.any():
        if not expect.pad_to_max:
            totals.fail("padding_unexpected", seg_row[pad], first_row)
        is_last = np.zeros(len(index), dtype=bool)
        is_last[seg_end[segs > 0] - 1] = True
        totals.fail("padding_not_last", seg_row[pad & ~is_last], first_row)
    totals.sample_tokens += int(row_len.sum()) - int(seq_lengths[pad].sum())
    if "seq_lengths_unpadded" in batch.schema.names:
        alignment = _check_unpadded(
            batch, segs, seq_lengths, pad, row_sums == row_len, labelled, expect, totals, first_row
        )
        totals.sample_tokens -= alignment
        totals.alignment += alignment
    if "loss_weights" in batch.schema.names:
        w_len, weights = list_parts(batch.column("loss_weights"))
        bad_len = rows[w_len != row_len]
        totals.fail("loss_weights", bad_len, first_row)
        if len(bad_len) == 0:
            bad = ~np.isfinite(weights) | (weights < 0) | ((weights != 0) & ~labelled)
            totals.fail("loss_weights", token_rows(bad), first_row)
            if expect.loss_weighting in WEIGHTING_RULES and (row_sums == row_len).all() and (seq_lengths > 0).all():
                # Each segment's weights as the writer computes them, from its labels (padding segments: 0).
                want = loss_weights(labels, seq_lengths, expect.loss_weighting)
                if not np.array_equal(weights, want):  # the writer's own values are equal bit for bit
                    wrong = ~np.isclose(weights, want, rtol=WEIGHT_RTOL, atol=0.0) & ~bad
                    totals.fail("loss_weights_values", token_rows(wrong), first_row)
    if "source" in batch.schema.names:  # -- mixtures
        _check_source(batch, segs, index, pad, seg_row, expect, totals, first_row)
    if "sample_role" in batch.schema.names:
        _check_roles(batch, segs, index, piece, pad, seg_row, expect, totals, first_row)
    totals.index.append(index[~pad])
    totals.pieces.append(piece[~pad])
    tiled = (row_sums == row_len) & (np.bincount(seg_row[seq_lengths < 1], minlength=n) == 0)
    if not tiled.all():
        # Positions and first labels can be placed only in rows whose segments tile the row.
        keep_tokens = np.repeat(tiled, row_len)
        keep_segments = np.repeat(tiled, segs)
        rows, row_len, segs = rows[tiled], row_len[tiled], segs[tiled]
        positions, labelled = positions[keep_tokens], labelled[keep_tokens]
        seq_lengths, pad = seq_lengths[keep_segments], pad[keep_segments]
        row_end = np.cumsum(row_len)
        seg_row = np.repeat(rows, segs)
    seg_start = np.cumsum(seq_lengths) - seq_lengths
    # position_ids are 0 at every segment start and grow by one everywhere else.
    starts = np.zeros(len(positions), dtype=bool)
    starts[seg_start] = True
    bad_position = np.zeros(len(positions), dtype=bool)
    bad_position[seg_start] = positions[seg_start] != 0
    if len(positions) > 1:
        bad_position[1:] |= ~starts[1:] & (np.diff(positions) != 1)
    totals.fail("positions", rows[token_rows(bad_position)], first_row)
    totals.fail("first_label", seg_row[labelled[seg_start]], first_row)
    if pad.any():
        totals.fail("padding_labels", rows[token_rows(np.repeat(pad, seq_lengths) & labelled)], first_row)


def _mix_inputs(manifest: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """-- mixtures: each input's first sample_index, ascending, and its source, from the manifest's ``mix``."""
    if "mix" not in manifest:
        return None
    sources = manifest["mix"].get("sources") if isinstance(manifest["mix"], dict) else None
    try:
        assert isinstance(sources, list)
        pairs = sorted((int(r[0]), m) for m, s in enumerate(sources) for r in s["sample_index"])
    except (AssertionError, TypeError, ValueError, KeyError, IndexError, AttributeError):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)  # no sample can match: every source value fails
    return np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)


def _check_source(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    index: np.ndarray,
    pad: np.ndarray,
    seg_row: np.ndarray,
    expect: _Expect,
    totals: _ShardTotals,
    first_row: int,
) -> None:
    """-- mixtures: one source per sample, the manifest's source of its sample_index, -1 on padding."""
    src_len, source = list_parts(batch.column("source"))
    bad_len = np.flatnonzero(src_len != segs)
    if len(bad_len):
        totals.fail("source", bad_len, first_row)
        return
    want = np.full(len(index), -1, dtype=np.int64)
    if expect.mix_inputs is not None and len(expect.mix_inputs[0]):
        firsts, owners = expect.mix_inputs
        at = np.searchsorted(firsts, index[~pad], side="right") - 1
        want[~pad] = np.where(at >= 0, owners[np.clip(at, 0, None)], -2)
    totals.fail("source", seg_row[source.astype(np.int64) != want], first_row)


def _check_roles(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    index: np.ndarray,
    piece: np.ndarray,
    pad: np.ndarray,
    seg_row: np.ndarray,
    expect: _Expect,
    totals: _ShardTotals,
    first_row: int,
) -> None:
    """Check sample_role: one per sample, the task's values, and every pair whole and in order in its row."""
    r_len, role = list_parts(batch.column("sample_role"))
    if (r_len != segs).any():
        totals.fail("sample_role", np.flatnonzero(r_len != segs), first_row)
        return
    role = role.astype(np.int64)
    allowed = {"preference": (1, 2), "kto": (3, 4)}.get(expect.task, (0,))
    bad = np.where(pad, role != 0, ~np.isin(role, allowed))
    totals.fail("sample_role", seg_row[bad], first_row)
    if expect.task == "kto":
        totals.fail("pairs", seg_row[~pad & (piece != 0)], first_row)
    if expect.task != "preference":
        return
    chosen, rejected = role == 1, role == 2
    nxt = np.zeros(len(role), dtype=bool)  # the next segment is this chosen sample's rejected one
    nxt[:-1] = (
        rejected[1:] & (seg_row[1:] == seg_row[:-1]) & (index[1:] == index[:-1]) & (piece[:-1] == 0) & (piece[1:] == 1)
    )
    prev = np.zeros(len(role), dtype=bool)
    prev[1:] = nxt[:-1] & chosen[:-1]
    totals.fail("pairs", seg_row[(chosen & ~nxt) | (rejected & ~prev)], first_row)


def _check_unpadded(
    batch: pa.RecordBatch,
    segs: np.ndarray,
    seq_lengths: np.ndarray,
    pad: np.ndarray,
    tiled: np.ndarray,
    labelled: np.ndarray,
    expect: _Expect,
    totals: _ShardTotals,
    first_row: int,
) -> int:
    """Check seq_lengths_unpadded and the samples' alignment padding; return the padding tokens."""
    rows = np.arange(batch.num_rows)
    u_len, unpadded = list_parts(batch.column("seq_lengths_unpadded"))
    if (u_len != segs).any():
        totals.fail("segment_columns", rows[u_len != segs], first_row)
        return 0
    unpadded = unpadded.astype(np.int64)
    seg_row = np.repeat(rows, segs)
    wrong = (unpadded < 0) | (unpadded > seq_lengths) | ((unpadded == 0) != pad)
    totals.fail("unpadded", seg_row[wrong], first_row)
    if expect.pad_multiple > 1:
        aligned = pad_lengths(np.maximum(unpadded, 1), expect.pad_multiple, expect.pad_offset) == seq_lengths
        totals.fail("alignment", seg_row[~pad & ~aligned], first_row)
    if tiled.all() and not wrong.any():
        within = np.arange(int(seq_lengths.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(seq_lengths) - seq_lengths, seq_lengths
        )
        in_padding = within >= np.repeat(np.where(pad, seq_lengths, unpadded), seq_lengths)
        token_row = np.repeat(seg_row, seq_lengths)
        totals.fail("alignment_labels", token_row[in_padding & labelled], first_row)
    return int((seq_lengths[~pad] - unpadded[~pad]).sum())


def _check_samples(
    index: np.ndarray,
    pieces: np.ndarray,
    owner: np.ndarray,
    entries: list[dict[str, Any]],
    manifest: dict[str, Any],
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
            f"manifest.json counts {allowed} duplicated by rank padding or repeated by --mix"
            if allowed
            else "each must appear once"
        )
        problems.append(Problem(MANIFEST, f"{what}; {expected}"))
    packed = counts.get("packed")
    if packed is not None and distinct != packed:
        message = f"the shards hold {distinct} distinct records, manifest.json counts {packed} packed"
        if not complete:
            message += " (the missing or unreadable shards hold the rest)"
        problems.append(Problem(MANIFEST, message))
    held = len(index) - len(repeat) + repeats  # -- mixtures: a repeated record's copies are samples
    samples = counts.get("samples")  # pieces of split records are samples of their own
    if samples is not None and complete and held != samples:
        problems.append(Problem(MANIFEST, f"the shards hold {held} samples, manifest.json counts {samples}"))
    return distinct, held


def _check_totals(manifest: dict[str, Any], report: VerifyReport, sample_tokens: int, trainable: int) -> None:
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
