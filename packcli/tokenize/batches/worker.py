"""The worker side of tokenizing: one RawBatch of records in, one TokenizedBatch (flat arrays) out.

A JSON line is decoded by ``records.json_line``; the entries of the rejects file and of the --fix-turns-log
are made by ``record_entries``: both re-exported here.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packcli.contract import IGNORE_INDEX
from packcli.errors import Opt, RecordError
from packcli.io.sources import RawBatch
from packcli.io.uri import is_uri
from packcli.records import preference, turns
from packcli.records.checks import UnusableRecord, check_sample, raw_line_is_clean
from packcli.records.dedup import content_key
from packcli.records.formats import PREFERENCE_FORMATS, Sample, detect_format, normalize
from packcli.records.images import attach_images
from packcli.records.json_line import parse_line as parse_line
from packcli.results import FileDigest, ImageRecord, Segment
from packcli.tokenize import trees
from packcli.tokenize.batches.record_entries import (
    DETAIL_PARTS as DETAIL_PARTS,
    REJECT_RECORD_CHARS as REJECT_RECORD_CHARS,
    TurnFix as TurnFix,
    fix_entry,
    record_text as record_text,
    reject as reject,
)
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.images import window_cuts_image
from packcli.tokenize.long.bounds import rule_out_too_long
from packcli.tokenize.long.split import Pieces, SplitRule, chunk_tokens, split_chat
from packcli.tokenize.templates import rounds
from packcli.tokenize.templates.chat_template import trained_turns


@dataclass
class TokenizedBatch:
    """A worker's output for one RawBatch: kept samples as flat arrays, and the rejected records."""

    source: str
    unit: str  # what positions count: line or record
    first_index: int
    n_records: int
    sample_index: np.ndarray
    lengths: np.ndarray
    trainable: np.ndarray
    first_trained: np.ndarray
    positions: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    rejects: list[dict[str, Any]] = field(default_factory=list)
    piece_index: np.ndarray | None = None  # per kept sample, when records were split (None: all 0)
    records_split: int = 0
    pieces_made: int = 0  # samples made from split records (pieces kept)
    pieces_left_out: dict[str, int] = field(default_factory=dict)  # reason -> pieces
    tokens_left_out: dict[str, int] = field(default_factory=dict)  # reason -> the tokens of those pieces
    roles: np.ndarray | None = None  # int8 sample_role per kept sample, for preference data (None: all SFT)
    # --fix-turns: its changes counted by kind (packcli.records.turns.KINDS), and one entry per record it changed.
    turns_fixed: dict[str, int] = field(default_factory=dict)
    turn_fixes: list[TurnFix] = field(default_factory=list)
    empty_answers: int = 0  # trained answers that are empty or whitespace only, in the samples kept
    leading_answers: int = 0  # conversations kept whose first message (after system ones) is a trained answer
    tools_left_out: int = 0  # conversations kept with a tools list the chat template does not render
    # Trained turns with reasoning, and what the template leaves out of them (rounds.reasoning_counts).
    reasoning: dict[str, int] = field(default_factory=dict)
    # --expand-turns: the records expanded, the samples made of them, their tokens beyond the records' own
    expanded: dict[str, int] = field(default_factory=dict)
    # --dedup exact: per kept sample, its record's content key (packcli.records.dedup), uint64 (n, 2)
    content_keys: np.ndarray | None = None
    # Seconds this batch took in the worker: decode (parse, detect, normalise, check), tokenize (render,
    # spans, encode, split) and cpu (the worker's CPU seconds for the batch, all threads).
    seconds: dict[str, float] = field(default_factory=dict)
    # From an engine that writes the tokens where it makes them (the Ray engine): the token store segment
    # that holds this batch's tokens, and its files' entries; ``ids`` and ``labels`` are then empty.
    segment: Segment | None = None
    segment_files: dict[str, FileDigest] = field(default_factory=dict)
    # A run with a processor: per kept sample, its images (packcli.tokenize.images); None without one.
    images: list[tuple[ImageRecord, ...]] | None = None
    # --prefix-tree: the kept samples' nodes (a plain sample one node), and the trees counted
    # (records, trees, samples in them, their tokens and the expansion's); None and empty without it.
    tree_nodes: trees.TreeNodes | None = None
    prefix_trees: dict[str, int] = field(default_factory=dict)
    # Records whose label masks the fast encoder left to the reference (packcli.tokenize.encoders.text_encoders).
    slow_records: int = 0


@dataclass(frozen=True)
class WorkerContext:
    """What ``tokenize_batch`` works with: made once by the run (or a Ray actor), handed to the worker
    processes by the pool's initializer (``procs.pool.map_ordered``), so workers start without loading
    anything.

    ``rule_out`` is (max_len, the most bytes one token covers): the early too-long rule, measured on
    the very text the encoder encodes (``ChatTemplate.text``). ``split`` cuts records longer than its
    max_len into pieces (``--overflow split``, see packcli.tokenize.long.split). ``fix_turns`` cleans conversations
    (packcli.records.turns). ``image_window`` is (the most tokens a sample keeps, the side it is cut from)
    under --overflow truncate or split: a sample with images that the cut would cut an image of is left out.
    ``expand_turns``: --expand-turns (packcli.tokenize.templates.rounds). ``prefix_tree``: with --prefix-tree, the
    most tokens a tree holds (--max-len): an expanded record's rounds become trees (packcli.tokenize.trees).
    """

    encoder: Encoder
    fields: dict[str, str]
    rule_out: tuple[int, int] | None = None
    split: SplitRule | None = None
    fix_turns: bool = False
    image_window: tuple[int, str] | None = None
    expand_turns: str = "off"
    prefix_tree: int | None = None
    content_keys: bool = True  # each sample's record's content key (packcli.records.dedup), for --dedup exact


def tokenize_batch(context: WorkerContext, batch: RawBatch, fmt: str | None) -> TokenizedBatch:
    """Tokenize one batch of raw records: decode and check them, encode them, keep their samples."""
    started, cpu_started = time.perf_counter(), time.process_time()
    encoder = context.encoder
    slow_before = encoder.text.slow_records
    samples, raws, changed = _decode(context, batch, fmt)
    decoded = time.perf_counter()
    if any(isinstance(sample, preference.Members) for sample in samples):  # a preference or KTO record
        results = preference.encode(encoder, samples)
    else:
        results = encoder.encode_batch(samples)
    expanded: dict[str, int] = {}
    if context.expand_turns != "off":
        expansion = rounds.expand(encoder, samples, results, context.expand_turns)
        results, expanded = expansion.results, expansion.counts()
    if not context.fix_turns:
        _hint_fix_turns(encoder, samples, results)
    kept = _Kept(context, batch, raws)
    for k, result in enumerate(results):
        kept.take(k, result, samples[k])
    encoded = time.perf_counter()
    fixed: Counter[str] = Counter()
    fixes: list[TurnFix] = []
    for k, changes in changed.items():
        fixed.update(turns.counts(changes))
        fixes.append(fix_entry(batch.first_index + k, batch.source, batch.positions[k], changes, raws[k], batch))
    out = kept.result(expanded)
    out.empty_answers, out.leading_answers, out.tools_left_out = _answer_counts(encoder, samples, results)
    out.turns_fixed, out.turn_fixes = dict(fixed), fixes
    out.reasoning = rounds.reasoning_counts(results)
    out.slow_records = encoder.text.slow_records - slow_before
    out.seconds = {"decode": decoded - started, "tokenize": encoded - decoded, "cpu": time.process_time() - cpu_started}
    return out


def _decode(
    context: WorkerContext, batch: RawBatch, fmt: str | None
) -> tuple[list[Any], list[Any], dict[int, list[turns.TurnChange]]]:
    """Each raw record of the batch made a sample (or the RecordError that says why not), checked.

    Return the samples, the records as the rejects file shows them, and, by batch position, the
    changes --fix-turns made.
    """
    encoder, fields, fix = context.encoder, context.fields, context.fix_turns
    errors = {pos: (reason, detail) for pos, reason, detail in batch.errors}
    base = os.path.dirname(os.path.abspath(batch.source)) if encoder.vision is not None else ""
    samples: list[Any] = []
    raws: list[Any] = []
    changed: dict[int, list[turns.TurnChange]] = {}
    for item, pos in zip(batch.items, batch.positions, strict=True):
        raws.append(item)
        try:
            if pos in errors:
                raise RecordError(*errors[pos])
            record = parse_line(item) if batch.raw_lines else item
            record_format = fmt or detect_format(record, fields)
            if record_format is None:
                keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
                raise RecordError("unknown_format", f"no known record format fits the fields ({keys})")
            if record_format in PREFERENCE_FORMATS:
                members = preference.normalize_members(record, record_format, fields)
                if not (batch.raw_lines and raw_line_is_clean(item)):
                    for member in members.samples:
                        check_sample(member)
                samples.append(members)
                continue
            sample = normalize(record, record_format, fields, rename_roles=fix)
            if encoder.vision is not None:
                sample = attach_images(sample, record, base, is_uri)
            if fix:
                sample, changes = turns.clean(sample)
                if changes:
                    changed[len(samples)] = changes
            if not (batch.raw_lines and raw_line_is_clean(item)):
                check_sample(sample)
            if context.rule_out is not None:
                max_len, token_bytes = context.rule_out
                rule_out_too_long(sample, max_len, token_bytes, render=encoder.chat.text)
            samples.append(sample)
        except RecordError as err:
            if isinstance(err, UnusableRecord):
                raws[-1] = err.record  # the rejects file shows the record, not the line standing for it
            samples.append(err)
    return samples, raws, changed


def _answer_counts(encoder: Encoder, samples: list[Any], results: list[Any]) -> tuple[int, int, int]:
    """Of the encoded conversations: blank answers, answers that open a conversation, and conversations
    with a tools list the template leaves out."""
    chats = [
        (sample, trained_turns(sample, encoder.options.train_on))
        for sample, result in zip(samples, results, strict=True)
        if isinstance(sample, Sample) and sample.kind == "chat" and isinstance(result, (tuple, rounds.Rounds))
    ]
    empty_answers = sum(turns.blank_answers(sample, trained) for sample, trained in chats)
    leading_answers = sum(turns.opens_with_answer(sample, trained) for sample, trained in chats)
    with_tools = sum(bool(sample.tools) for sample, _ in chats)
    return empty_answers, leading_answers, with_tools if with_tools and encoder.chat.leaves_out_tools() else 0


class _Kept:
    """A batch's kept samples (and its rejects), taken record by record in order (``take``)."""

    def __init__(self, context: WorkerContext, batch: RawBatch, raws: list[Any]) -> None:
        self.context, self.batch, self.raws = context, batch, raws
        self.index: list[int] = []
        self.positions: list[int] = []
        self.pieces: list[int] = []
        self.ids: list[Any] = []  # each an int32 array of token ids
        self.labels: list[Any] = []
        self.rejects: list[dict[str, Any]] = []
        self.roles: list[int] = []
        self.content_keys: list[bytes] = []  # per kept sample, its record's content key
        self.images: list[tuple[ImageRecord, ...]] = []
        self.left_out: Counter[str] = Counter()
        self.left_out_tokens: Counter[str] = Counter()
        self.records_split = self.pieces_made = 0
        self.nodes: list[tuple[np.ndarray, np.ndarray] | None] = []  # --prefix-tree: per kept sample, None when plain
        self.tree_counts: Counter[str] = Counter()

    def reject(self, k: int, error: RecordError) -> None:
        batch = self.batch
        entry = reject(batch.first_index + k, batch.source, batch.positions[k], error, self.raws[k], batch.raw_lines)
        if any(isinstance(p, Opt) for p in error.parts):
            entry[DETAIL_PARTS] = error.parts  # for the error that names the record; never written (building.py)
        self.rejects.append(entry)

    def take(self, k: int, result: Any, sample: Any) -> None:
        """Keep record ``k``'s samples (its rounds, trees, pair members or pieces), or reject it."""
        context = self.context
        if isinstance(result, RecordError):
            self.reject(k, result)
            return
        tree_nodes: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None
        window = context.image_window
        if isinstance(result, rounds.Rounds):  # --expand-turns: one sample per round, piece_index the round
            kept = list(result)
            if context.prefix_tree is not None:  # --prefix-tree: the rounds as trees, piece_index the tree
                try:
                    grown = trees.record_trees(kept, context.prefix_tree)
                except RecordError as err:
                    self.reject(k, err)
                    return
                self.tree_counts.update(grown.counts)
                kept, tree_nodes = grown.samples, grown.nodes
        elif isinstance(result, list):  # a preference or KTO record: its samples, with their roles
            kept = [(piece_ids, piece_labels) for piece_ids, piece_labels, _ in result]
            self.roles.extend([0] * (len(self.index) - len(self.roles)) + [role for _, _, role in result])
        elif context.split is None or len(result[0]) <= context.split.max_len:
            if window is not None and window_cuts_image(getattr(result, "images", ()), len(result[0]), *window):
                cut = f"cutting it to {window[0]} would cut an image's tokens"
                self.reject(k, RecordError("image_cut", f"the sample has {len(result[0])} tokens; {cut}"))
                return
            kept = [result]
        else:
            pieces = self._split(k, result, sample)
            if pieces is None:
                return
            kept = pieces
        self._keep(k, kept, sample, tree_nodes)

    def _split(self, k: int, result: Any, sample: Any) -> list[Any] | None:
        """The pieces of a record longer than a row (--overflow split), or None when none is kept."""
        context = self.context
        assert context.split is not None
        self.records_split += 1
        pieces = _pieces(sample, result, context.split, context.encoder)
        self.left_out.update(pieces.left_out)
        self.left_out_tokens.update(pieces.left_out_tokens)
        if not pieces.pieces:
            why = ", ".join(f"{n} {r}" for r, n in sorted(pieces.left_out.items()))
            detail = f"the sample has {len(result[0])} tokens; no piece of it is kept ({why})"
            self.reject(k, RecordError("no_piece_left", detail))
            return None
        kept = pieces.pieces
        window = context.image_window
        if window is not None:
            cut = [p for p in kept if window_cuts_image(getattr(p, "images", ()), len(p[0]), *window)]
            if cut:
                self.left_out["piece_image_cut"] += len(cut)
                self.left_out_tokens["piece_image_cut"] += sum(len(p[0]) for p in cut)
                kept = [p for p in kept if not any(p is c for c in cut)]
            if not kept:
                self.reject(
                    k, RecordError("image_cut", f"the sample has {len(result[0])} tokens; every piece cuts an image")
                )
                return None
        self.pieces_made += len(kept)
        return kept

    def _keep(self, k: int, kept: list[Any], sample: Any, tree_nodes: Any) -> None:
        batch = self.batch
        if self.context.content_keys:
            self.content_keys.extend([content_key(sample)] * len(kept))
        if self.context.encoder.vision is not None:
            self.images.extend(getattr(piece, "images", ()) for piece in kept)
        if self.context.prefix_tree is not None:
            self.nodes.extend(tree_nodes or [None] * len(kept))
        for p, (piece_ids, piece_labels) in enumerate(kept):
            self.index.append(batch.first_index + k)
            self.positions.append(batch.positions[k])
            self.pieces.append(p)
            self.ids.append(piece_ids)
            self.labels.append(piece_labels)

    def result(self, expanded: dict[str, int]) -> TokenizedBatch:
        """The batch's result: its kept samples as arrays, with its rejects and counts."""
        batch, roles = self.batch, self.roles
        lengths = np.fromiter((len(x) for x in self.ids), dtype=np.int32, count=len(self.ids))
        flat_ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int32)
        flat_labels = np.concatenate(self.labels) if self.labels else np.zeros(0, np.int32)
        trainable, first_trained = label_stats(flat_labels, lengths)
        numbered = self.records_split or roles or expanded
        return TokenizedBatch(
            source=batch.source,
            unit="line" if batch.raw_lines else "record",
            first_index=batch.first_index,
            n_records=len(batch.items),
            sample_index=np.array(self.index, dtype=np.int64),
            lengths=lengths,
            trainable=trainable,
            first_trained=first_trained,
            positions=np.array(self.positions, dtype=np.int32),
            ids=flat_ids,
            labels=flat_labels,
            rejects=self.rejects,
            piece_index=np.array(self.pieces, dtype=np.int32) if numbered else None,
            roles=np.array(roles + [0] * (len(self.index) - len(roles)), dtype=np.int8) if roles else None,
            records_split=self.records_split,
            pieces_made=self.pieces_made,
            pieces_left_out=dict(self.left_out),
            expanded=expanded,
            tokens_left_out=dict(self.left_out_tokens),
            images=self.images if self.context.encoder.vision is not None else None,
            tree_nodes=trees.TreeNodes.of(self.nodes, lengths) if self.context.prefix_tree is not None else None,
            prefix_trees=dict(self.tree_counts),
            content_keys=np.frombuffer(b"".join(self.content_keys), dtype="<u8").reshape(-1, 2).copy()
            if self.context.content_keys
            else None,
        )


def _hint_fix_turns(encoder: Encoder, samples: list[Any], results: list[Any]) -> None:
    """Say, in a template's error, what --fix-turns would change, where the cleaned conversation renders.

    Only conversations the template refused are cleaned and encoded again (one batch call).
    """
    candidates: list[tuple[int, Sample, list[turns.TurnChange]]] = []
    for k, (sample, result) in enumerate(zip(samples, results, strict=True)):
        if not (isinstance(result, RecordError) and result.reason == "template_error" and isinstance(sample, Sample)):
            continue
        try:
            cleaned, changes = turns.clean(sample)
        except RecordError:
            continue
        if changes:
            candidates.append((k, cleaned, changes))
    if not candidates:
        return
    again = encoder.encode_batch([cleaned for _, cleaned, _ in candidates])
    for (k, _, changes), result in zip(candidates, again, strict=True):
        if isinstance(result, tuple):
            err = results[k]
            results[k] = RecordError(err.reason, *err.parts, "; ", Opt("fix_turns"), f" {turns.describe(changes)}")


def _pieces(sample: Any, whole: tuple[np.ndarray, np.ndarray], split: SplitRule, encoder: Encoder) -> Pieces:
    if sample.kind == "chat":
        encode = lambda piece: encoder.encode_batch([piece])[0]  # noqa: E731
        return split_chat(sample, encoder.options.train_on, split, encode, len(whole[0]), encoder.count_tokens)
    return chunk_tokens(whole[0], whole[1], split)


def label_stats(labels: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each sample's count of trained tokens and the position of its first trained token.

    Every sample has at least one trained token (samples without are rejected before).
    """
    if not len(lengths):
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = ends - lengths
    # The trained tokens up to each position: a sample's count is what its end adds to its start, and its
    # first trained token the first position that counts one more than there were before it.
    seen = np.cumsum(labels != IGNORE_INDEX, dtype=np.int32 if len(labels) < 2**31 else np.int64)
    before = np.concatenate(([0], seen[starts[1:] - 1]))
    counts = seen[ends - 1] - before
    return counts.astype(np.int32), (np.searchsorted(seen, before + 1) - starts).astype(np.int32)
