"""One token store being made: the workers' batches written into it and accounted for, then its meta.

``ingest.tokenize_to_store`` makes one store of all the inputs; ``ingest.tokenize_to_parts`` one per
part of an input (``packcli.store.parts``). Either way a ``StoreBuilder`` takes each TokenizedBatch in
input order: its samples go to a TokenStoreWriter, its rejected records and --fix-turns changes to the
store's JSON lines files, its counts to the tallies that become the store's meta.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from packcli.errors import InputError, Opt, OutputError, Text, record_fix, where as where_of
from packcli.io.sources import InputSource
from packcli.records import turns
from packcli.results import EncoderInfo, Split, StoreMade, StoreMeta, StoreSource, TokenizerIdentity
from packcli.store.images import IMAGES_FILE, image_line
from packcli.store.tokens import TokenStore
from packcli.store.writer import TokenStoreWriter
from packcli.tokenize import trees
from packcli.tokenize.batches.record_entries import DETAIL_PARTS
from packcli.tokenize.batches.worker import TokenizedBatch
from packcli.tokenize.options import TokenizeOptions
from packcli.tokenize.templates import rounds
from packcli.version import __version__

# Reasons a record is left out by policy: always counted, never an error. Every other reason is bad
# data, which stops the run unless --on-error skip.
POLICY_DROPS = frozenset(
    {
        "empty",
        "empty_conversation",
        "no_assistant_turn",
        "nothing_to_train",
        "no_answer_after_fix",
        "too_long",
        "nothing_to_train_after_truncation",
        "no_piece_left",
        "image_cut",
        "world_size_remainder",
    }
)
# In the token store: one JSON line per record --fix-turns changed (copied out by --fix-turns-log).
TURN_FIXES = "turn_fixes.jsonl"
REJECTS = "rejects.jsonl"


class StoreBuilder:
    """A token store being made from TokenizedBatch results, in input order (``take``), then ``finish``.

    Every failure to write is an OutputError naming ``where`` and ending with ``fix`` (see
    TokenStoreWriter). A rejected record that the run's policy makes an error (``--on-error fail``,
    ``--overflow error``) raises InputError from ``take``.
    """

    def __init__(self, options: TokenizeOptions, path: Path, where: Path, fix: Text) -> None:
        self.options, self.where, self.fix = options, where, fix
        self.writer = TokenStoreWriter(path, fix, where)
        assert self.writer.tmp is not None  # set by the writer, or it raised
        self.tmp = self.writer.tmp
        self._files: contextlib.ExitStack = contextlib.ExitStack()
        try:
            self._rejects = self._files.enter_context(_open_for_writing(self.tmp / REJECTS, where, fix))
            self._fixes = self._files.enter_context(_open_for_writing(self.tmp / TURN_FIXES, where, fix))
        except BaseException:
            self.abort()
            raise
        self._images: Any = None
        self.dropped: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()  # records, records_split, pieces, empty/leading answers, ...
        self.left_out: Counter[str] = Counter()
        self.left_out_tokens: Counter[str] = Counter()
        self.turns_fixed: Counter[str] = Counter()
        self.reasoning: Counter[str] = Counter()
        self.expanded: Counter[str] = Counter()
        self.prefix_trees: Counter[str] = Counter()
        self.image_counts: Counter[str] = Counter()  # the store's (embedded: whether rows need image_bytes)
        self.starts: dict[str, int] = {}
        self.units: dict[str, str] = {}
        self.samples = 0  # samples stored so far: the image table's sample numbers

    def take(self, result: TokenizedBatch) -> None:
        """Write one batch's samples, rejects and fixes into the store, and count what it says."""
        options, where, fix = self.options, self.where, self.fix
        c = self.counts
        c["records"] += result.n_records
        c["records_split"] += result.records_split
        c["pieces"] += result.pieces_made
        c["empty_answers"] += result.empty_answers
        c["leading_answers"] += result.leading_answers
        c["tools_left_out"] += result.tools_left_out
        c["slow_records"] += result.slow_records
        self.left_out.update(result.pieces_left_out)
        self.left_out_tokens.update(result.tokens_left_out)
        self.turns_fixed.update(result.turns_fixed)
        self.reasoning.update(result.reasoning)
        self.expanded.update(result.expanded)
        self.prefix_trees.update(result.prefix_trees)
        for entry in result.turn_fixes:
            _write_line(self._fixes, json.dumps(entry, ensure_ascii=False), where, fix)
        self.starts.setdefault(result.source, result.first_index)
        self.units.setdefault(result.source, result.unit)
        for reject in result.rejects:
            detail = reject.pop(DETAIL_PARTS, None) or (reject["detail"],)
            if reject["reason"] == "too_long" and options.overflow == "error":
                where_record = where_of(reject["source"], reject["unit"], reject["position"])
                raise InputError(
                    f"{where_record}: ",
                    *detail,
                    hint=("raise ", Opt("max_len"), " or pass ", Opt("overflow", "split", "truncate", "drop")),
                )
            if reject["reason"] not in POLICY_DROPS and options.on_error == "fail":
                where_record = where_of(reject["source"], reject["unit"], reject["position"])
                raise InputError(f"{where_record}: ", *detail, hint=record_fix(reject["reason"]))
            self.dropped[reject["reason"]] += 1
            _write_line(self._rejects, json.dumps(reject, ensure_ascii=False), where, fix)
        if result.images is not None:
            for j, images in enumerate(result.images):
                if not images:
                    continue
                if self._images is None:
                    self._images = self._files.enter_context(_open_for_writing(self.tmp / IMAGES_FILE, where, fix))
                _write_line(self._images, image_line(self.samples + j, images), where, fix)
                self.image_counts["samples"] += 1
                self.image_counts["images"] += len(images)
                self.image_counts["image_tokens"] += sum(im["tokens"] for im in images)
                self.image_counts["embedded"] += sum(im.get("bytes") is not None for im in images)
        self.samples += len(result.lengths)
        arrays = (
            result.sample_index,
            result.lengths,
            result.trainable,
            result.first_trained,
            result.positions,
            result.piece_index,
            result.roles,
        )
        if result.segment is not None:
            self.writer.add_segment(
                result.segment,
                result.segment_files,
                *arrays,
                content_keys=result.content_keys,
                tree_nodes=result.tree_nodes,
            )
        else:
            self.writer.add(
                result.sample_index,
                result.lengths,
                result.ids,
                result.labels,
                *arrays[2:],
                content_keys=result.content_keys,
                tree_nodes=result.tree_nodes,
            )

    def meta(
        self,
        sources: list[InputSource],
        formats: dict[str, str | None],
        identity: TokenizerIdentity,
        pad_id: int,
        encoder_record: EncoderInfo,
    ) -> StoreMeta:
        """The store's meta.json but its segments, files and checksum (``TokenStoreWriter.finish`` sets
        them): its counts.

        ``identity`` is the tokenizer's (``Encoder.identity``, with the processor's under one);
        ``encoder_record`` which encoder made the tokens, to which ``records_slow`` is added: the
        records whose masks the fast encoder left to the reference, as the batches counted them.
        """
        options, c = self.options, self.counts
        records = c["records"]
        expanding = options.expand_turns != "off"
        if "processor" in identity:
            images = {k: self.image_counts[k] for k in ("samples", "images", "image_tokens", "embedded")}
            identity = {**identity, "processor": identity["processor"] | {"images": images}}
        split = None
        if options.overflow == "split":
            split = Split(
                records_split=c["records_split"],
                pieces=c["pieces"],
                pieces_left_out=dict(sorted(self.left_out.items())),
                # The tokens of the pieces left out, by reason: counted in the summary's lost tokens.
                tokens_left_out=dict(sorted(self.left_out_tokens.items())),
            )
        return StoreMeta(
            tokenizer=identity,
            pad_id=pad_id,
            records_read=records,
            dropped=dict(sorted(self.dropped.items())),
            sources=[
                StoreSource(
                    path=s.display, kind=s.kind, format=formats[s.display], unit=self.units.get(s.display, "record")
                )
                for s in sources
            ],
            source_starts=[self.starts.get(s.display, records) for s in sources],
            segments=[],
            files={},
            meta_sha256="",
            turns_fixed={kind: self.turns_fixed[kind] for kind in turns.KINDS} if options.fix_turns else None,
            empty_answers=c["empty_answers"] or None,
            leading_answers=c["leading_answers"] or None,
            tools_left_out=c["tools_left_out"] or None,
            # Which encoder made the tokens (the cache key does not depend on it: every one gives the same).
            encoder=dataclasses.replace(encoder_record, records_slow=c["slow_records"]),
            reasoning={key: self.reasoning[key] for key in rounds.REASONING_KEYS} if self.reasoning else None,
            expanded={key: self.expanded[key] for key in rounds.EXPANDED_KEYS} if expanding else None,
            trees={key: self.prefix_trees[key] for key in trees.TREE_KEYS} if options.prefix_tree else None,
            split=split,
            made=StoreMade(packcli_version=__version__, time=round(time.time(), 3)),
        )

    def ruled_out(self, meta: StoreMeta, ruled_out_bytes: int | None) -> StoreMeta:
        """``meta``, recording that records over ``ruled_out_bytes`` were left out untokenized, if any was.

        Only runs whose limit is no higher may then use this store (``run.entries.locked_entry``).
        """
        if ruled_out_bytes is not None and self.dropped["too_long"]:
            limit = self.options.max_len
            return dataclasses.replace(meta, ruled_out_over_bytes=ruled_out_bytes, ruled_out_max_len=limit)
        return meta

    def finish(self, meta: StoreMeta, segment_root: str | None = None, verify: bool = True) -> TokenStore:
        """Close the store's files and move it into place (``TokenStoreWriter.finish``)."""
        self._files.close()
        return self.writer.finish(meta, segment_root=segment_root, verify=verify)

    def place(self, path: Path) -> None:
        """Move the store to ``path`` when it is finished, not to the path it was begun for (the same
        directory: a cache entry whose key is known once the inputs are read)."""
        assert path.parent == self.writer.final_path.parent
        self.writer.final_path = path

    def abort(self) -> None:
        """Close the files and remove the store being made."""
        self._files.close()
        self.writer.abort()


@contextlib.contextmanager
def _open_for_writing(path: Path, where: Path, fix: Text) -> Any:
    try:
        fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise OutputError(f"{where}: cannot write the token store ({exc.strerror or exc})", hint=fix) from exc
    try:
        yield fh
    finally:
        with contextlib.suppress(OSError):  # a failed flush was reported by the write that failed
            fh.close()


def _write_line(fh: Any, line: str, where: Path, fix: Text) -> None:
    try:
        fh.write(line + "\n")
    except OSError as exc:
        raise OutputError(f"{where}: cannot write the token store ({exc.strerror or exc})", hint=fix) from exc
