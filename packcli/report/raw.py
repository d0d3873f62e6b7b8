"""Figures about raw input before packing: a what-if per max length, and what each overflow policy keeps.

The input goes through the same reading, formatting and tokenization as ``packcli pack`` (and the
same tokenization cache, so a later ``pack`` of the same input reuses it); only the sample lengths
are used. Nothing here prints; the functions return plain dictionaries that the CLI renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from packcli.errors import Message, Opt, UsageError
from packcli.plan import packing
from packcli.report.figures import (
    batch_padding,
    check_batch_size,
    distribution,
    fill_histogram,
    length_histogram,
    row_bounds,
)
from packcli.results import PolicyKept, RawLine, RawStats
from packcli.tokenize.encoders.tokenizer import DEFAULT_TOKENIZER


def parse_max_lens(value: str) -> list[int]:
    """Parse ``--max-len 2048,4096`` into distinct integers >= 2, in the order given."""
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise UsageError(
                f"takes integers separated by commas (e.g. 2048,4096), not '{value}'", option="max_len"
            ) from None
        if n < 2:
            raise UsageError(f"must be at least 2, not {n}", option="max_len")
        if n not in out:
            out.append(n)
    return out


def raw_stats(config: Any, max_lens: Sequence[int], batch_size: int = 8, progress: Any = None) -> RawStats:
    """Tokenize raw input as ``packcli pack`` would and return, per max length, packed versus unpacked.

    ``config`` is a PackConfig (inputs, tokenizer, template, format, label and cache options).
    Samples longer than a max length are counted as not fitting and left out of that line (what
    ``--overflow drop`` does).
    """
    check_batch_size(batch_size)
    if not max_lens:
        raise UsageError("a raw input needs ", Opt("max_len"), " (e.g. ", Opt("max_len"), " 2048,4096,8192)")
    inputs = config.inputs
    from packcli.io.sources import forget_streams
    from packcli.run.pipeline import tokenized_inputs

    forget_streams()  # stdin and FIFOs named by this run are read by this run

    with tokenized_inputs(config, progress) as tokenized:
        from dataclasses import replace

        config = replace(config, task=tokenized.task)  # preference data: pairs are planned whole
        store, cache_state = tokenized.store, tokenized.cache
        warnings: list[Message | str] = list(tokenized.warnings)
        lengths = store.lengths.astype(np.int64)  # ascending sample_index: input order
        trainable = int(store.trainable.astype(np.int64).sum())
        meta = store.meta
        if meta.empty_answers:
            from packcli.run.accounting import empty_answers_warning

            warnings = [*warnings, empty_answers_warning(meta.empty_answers)]
        if meta.leading_answers:
            from packcli.run.accounting import leading_answers_warning

            warnings = [*warnings, leading_answers_warning(meta.leading_answers)]
        if meta.tools_left_out:
            from packcli.run.accounting import tools_left_out_warning

            warnings = [*warnings, tools_left_out_warning(meta.tools_left_out)]
        if meta.reasoning and meta.reasoning.get("turns_left_out"):
            from packcli.run.accounting import reasoning_warning

            warnings = [*warnings, reasoning_warning(meta.reasoning)]
        tokenizer_name = config.tokenizer_name or DEFAULT_TOKENIZER
        lines = [
            _what_if(lengths, m, batch_size, _kept_by_policy(config, store, m, trainable, progress, tokenized.sources))
            for m in max_lens
        ]
    # Bins up to the 99th percentile (or the largest max length): one outlier does not widen them all.
    upper = max(int(np.percentile(lengths, 99)) if len(lengths) else 0, max(max_lens))
    return RawStats(
        mode="raw",
        inputs=list(inputs),
        tokenizer=tokenizer_name,
        cache=cache_state,
        records_read=meta.records_read,
        samples=len(lengths),
        dropped=dict(meta.dropped),
        turns_fixed=dict(meta.turns_fixed) if meta.turns_fixed is not None else None,
        empty_answers=meta.empty_answers or None,
        leading_answers=meta.leading_answers or None,
        tools_left_out=meta.tools_left_out or None,
        reasoning=dict(meta.reasoning) if meta.reasoning else None,
        tokens=int(lengths.sum()),
        trainable_tokens=trainable,
        sample_length=distribution(lengths),
        length_histogram=length_histogram(lengths, upper).bins(),
        batch_size=batch_size,
        max_lens=lines,
        warnings=warnings or None,
    )


# What each --overflow policy keeps; truncate-left is --overflow truncate --truncate-side left.
POLICIES = ("drop", "truncate", "truncate-left", "split")


def _kept_by_policy(
    config: Any, store: Any, max_len: int, trainable_total: int, progress: Any, sources: Any
) -> dict[str, PolicyKept]:
    """Return, per overflow policy, the records, samples, tokens and trainable tokens a pack would keep.

    drop and truncate are planned from the store at hand; split cuts the records longer than
    ``max_len`` as ``pack --overflow split`` does, which tokenizes the inputs again (into the cache,
    so a ``pack --overflow split`` at that length afterwards is a cache hit). Where nothing is too long
    all policies keep everything, and nothing is tokenized again.
    """
    from dataclasses import replace

    from packcli.errors import InputError
    from packcli.plan.planner import make_plan
    from packcli.run import accounting
    from packcli.run.options import plan_options
    from packcli.run.pipeline import tokenized_inputs

    def kept(cfg: Any, tokens: Any) -> PolicyKept:
        try:
            summary = accounting.summary(cfg, tokens, make_plan(plan_options(cfg), tokens), "")
            packed, samples, kept_tokens, trainable = (
                summary.packed,
                summary.samples,
                summary.tokens,
                summary.trainable_tokens,
            )
        except InputError:  # nothing left to pack
            packed = samples = kept_tokens = trainable = 0
        return PolicyKept(
            records=packed,
            samples=samples,
            tokens=kept_tokens,
            trainable_tokens=trainable,
            trainable_fraction=round(trainable / trainable_total, 6) if trainable_total else 0.0,
        )

    def under(**changes: Any) -> Any:
        """The run's options under another policy, or None where they refuse it (--expand-turns never
        splits a round, --prefix-tree never cuts a tree)."""
        try:
            return replace(base, **changes)
        except UsageError:
            return None

    base = replace(config, max_len=max_len, world_size=1, pad_to_max=False)
    drop = kept(replace(base, overflow="drop"), store)
    # The counts 0 (as ints) and ``applies`` false.
    inapplicable = PolicyKept(records=0, samples=0, tokens=0, trainable_tokens=0, trainable_fraction=0, applies=False)
    truncate, truncate_left = under(overflow="truncate"), under(overflow="truncate", truncate_side="left")
    out = {
        "drop": drop,
        "truncate": kept(truncate, store) if truncate is not None else inapplicable,
        "truncate-left": kept(truncate_left, store) if truncate_left is not None else inapplicable,
    }
    split = under(overflow="split")
    if config.task != "sft" or split is None:
        # A preference or KTO record is never split, nor an expanded round: the policy does not apply.
        out["split"] = inapplicable
    elif int(store.lengths.max(initial=0)) <= max_len:
        out["split"] = out["drop"]
    else:
        with tokenized_inputs(split, progress, sources=sources) as pieces:
            out["split"] = kept(split, pieces.store)
    return out


def _what_if(lengths: np.ndarray, max_len: int, batch_size: int, policies: dict[str, PolicyKept]) -> RawLine:
    fit = lengths[lengths <= max_len]
    tokens = int(fit.sum())
    if len(fit):
        bins = packing.plan_rows(fit, max_len, "ffd")
        row_tokens = np.bincount(bins, weights=fit).astype(np.int64)
    else:
        row_tokens = np.zeros(0, np.int64)
    rows = len(row_tokens)
    return RawLine(
        max_len=max_len,
        samples_fit=len(fit),
        samples_too_long=len(lengths) - len(fit),
        tokens=tokens,
        rows=rows,
        rows_without_packing=len(fit),
        padding_tokens=rows * max_len - tokens,
        padding_tokens_without_packing=len(fit) * max_len - tokens,
        padding_tokens_batch_padded=batch_padding(fit, batch_size),
        fill=round(tokens / (rows * max_len), 6) if rows else 0.0,
        **row_bounds(fit, max_len, rows),
        row_fill_histogram=fill_histogram(row_tokens, max_len).bins(),
        policies=policies,
    )
