"""What a run keeps and what it loses: the summary's counts, and the rule that makes loss loud.

Every record read is packed (at least one of its samples is in a row) or dropped with a reason:
``records_read == packed + sum(dropped)``. With ``--overflow split`` a record may become several
samples (pieces); ``split`` counts the records split, the pieces made, and the pieces left out by
reason, and ``samples`` counts every sample written. ``lost`` measures what did not reach the rows:
records dropped, and tokens (of tokenized samples) dropped or cut off by truncation, and the tokens of
pieces left out (``piece_too_short`` under ``--min-piece``, ``untrained_piece``). Token fractions are of
every token tokenized: the samples stored (all of them, whatever dedup, the eval split or a mix then
keep) and the pieces left out; record fractions are of every record read.

When more than ``LOUD_FRACTION`` of the records or of the tokens is lost, the summary carries one
warning naming the top reason and the option that would keep them; ``--max-drop-fraction F`` makes
losing more than F an error instead (nothing is written).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TypedDict

import numpy as np

from packcli.config import Hint, PackConfig, suggest
from packcli.errors import InputError, Message, Opt, Part
from packcli.plan import balance, packing
from packcli.plan.planner import Plan
from packcli.results import Lost, RunSummary, StepBalance, TokenizerIdentity
from packcli.run.options import plan_options
from packcli.store.tokens import TokenStore
from packcli.tokenize.templates.template_errors import stored_warning

LOUD_FRACTION = 0.05

# What keeps the records or tokens that a reason loses: alternatives, each the option setting it
# passes (left out when the run has it already: see config.suggest) or None for another step.
RAISE_MAX_LEN: tuple[Part, ...] = ("raise ", Opt("max_len"))
KEEP_THEM: dict[str, list[Hint]] = {
    "too_long": [
        (("overflow", "split"), ("pass ", Opt("overflow", "split"), " to keep them as whole pieces")),
        (("overflow", "truncate"), ("pass ", Opt("overflow", "truncate"))),
        (None, RAISE_MAX_LEN),
    ],
    "truncated": [
        (("overflow", "split"), ("pass ", Opt("overflow", "split"), " to keep the cut tokens as pieces")),
        (None, RAISE_MAX_LEN),
    ],
    "nothing_to_train_after_truncation": [
        (("overflow", "split"), ("pass ", Opt("overflow", "split"))),
        (("cut_side", "left"), ("pass ", Opt("truncate_side", "left"))),
        (None, RAISE_MAX_LEN),
    ],
    "world_size_remainder": [(("rank_remainder", "pad"), ("pass ", Opt("rank_remainder", "pad")))],
    "no_piece_left": [(None, ("lower ", Opt("min_piece"))), (None, ("check ", Opt("train_on")))],
    "piece_too_short": [(None, ("lower ", Opt("min_piece")))],
    "untrained_piece": [
        (
            ("train_on", "all"),
            ("these pieces train nothing under ", Opt("train_on"), ": pass ", Opt("train_on", "all")),
        ),
        (None, RAISE_MAX_LEN),
    ],
    "no_assistant_turn": [
        (("train_on", "all"), ("pass ", Opt("train_on", "all"), " to train on them")),
        (None, "fix the records"),
    ],
    "nothing_to_train": [(None, ("check ", Opt("train_on"), " and the records' roles"))],
    # records whose normalised content repeats an earlier one (--dedup exact)
    "duplicate": [(("dedup", "off"), ("they repeat earlier records; leave out ", Opt("dedup"), " to keep them"))],
}
# Preference and KTO records are never split: only their prompts are cut, from the left.
KEEP_THEM_PAIRS: dict[str, list[Hint]] = {
    "too_long": [
        (None, RAISE_MAX_LEN),
        (("overflow", "truncate"), ("pass ", Opt("overflow", "truncate"), " to cut the prompts from the left")),
    ],
    "truncated": [(None, (*RAISE_MAX_LEN, " (a record is cut only in its prompt, never split)"))],
}
BAD_DATA: list[Hint] = [(None, ("fix the records (list them with ", Opt("rejects"), " FILE)"))]
# Under --overflow split, what is still cut or dropped is an exchange that fits in no row on its own.
KEEP_THEM_SPLIT: dict[str, list[Hint]] = {
    "truncated": [(None, (*RAISE_MAX_LEN, ": these exchanges do not fit in one row on their own"))],
    "nothing_to_train_after_truncation": [
        (None, RAISE_MAX_LEN),
        (
            ("cut_side", "left"),
            (
                "leave out ",
                Opt("truncate_side", "right"),
                " (split cuts such an exchange from the left, keeping its answer)",
            ),
        ),
    ],
}


def summary(
    config: PackConfig, store: TokenStore, plan: Plan, cache_state: str, *, read_tokens: int | None = None
) -> RunSummary:
    """Return the summary of a run from its token store and plan (counts, fill, bounds, loss).

    ``store`` is what the plan packed (a view after dedup, the eval split and the mix); ``read_tokens``
    the tokens of every sample tokenized from the inputs (the whole store), of which lost tokens are a
    fraction (None: ``store``'s own).
    """
    meta = store.meta
    dropped = Counter(meta.dropped) + Counter(_records_lost(store, plan))
    records = int(meta.records_read)
    rows = len(plan.order.order)
    packed = records - sum(dropped.values())
    padded = int(sum(np.diff(plan.row_start)[plan.order.padded_rows])) if len(plan.order.padded_rows) else 0
    remainder = plan.drop_rows.get("world_size_remainder", np.zeros(0, np.int64))
    in_rows = _lengths_in_rows(store, plan)
    tokens = plan.tokens - int(in_rows[remainder].sum())
    row_tokens_padded = sum(
        int(plan.lengths[plan.row_start[r] : plan.row_start[r + 1]].sum()) for r in plan.order.padded_rows
    )
    written_tokens = tokens + row_tokens_padded
    capacity = rows * config.max_len
    samples = len(plan.store_rows) - len(remainder)
    split = None
    if meta.split is not None:
        # Exchanges too long for a row on their own, cut (from cut_side) and kept.
        split = dataclasses.replace(
            meta.split,
            exchanges_cut=plan.truncated,
            cut_side=config.cut_side,
            pieces_dropped_by_plan=_pieces_dropped(store, plan) if plan.drop_rows else None,
        )
    empty_answers = int(meta.empty_answers or 0)
    warnings = [stored_warning(w) for w in meta.tokenizer.get("warnings", [])]
    if empty_answers:
        warnings.append(empty_answers_warning(empty_answers))
    leading_answers = int(meta.leading_answers or 0)
    if leading_answers:
        warnings.append(leading_answers_warning(leading_answers))
    tools_left_out = int(meta.tools_left_out or 0)
    if tools_left_out:
        warnings.append(tools_left_out_warning(tools_left_out))
    if meta.reasoning and meta.reasoning.get("turns_left_out"):
        warnings.append(reasoning_warning(meta.reasoning))
    read = int(store.lengths.sum()) if read_tokens is None else read_tokens
    lost = _lost(store, plan, in_rows, dropped, records, read)
    warning = loss_warning(lost, config)
    if warning:
        warnings.append(warning)
    return RunSummary(
        **made_with(config, meta.tokenizer),
        records_read=records,
        limit=config.limit,
        packed=packed,
        samples=samples,
        dropped=dict(sorted(dropped.items())),
        truncated=plan.truncated,
        duplicated=padded,
        split=split,
        # --fix-turns: its changes by kind
        turns_fixed=dict(meta.turns_fixed) if meta.turns_fixed is not None else None,
        empty_answers=empty_answers,
        leading_answers=leading_answers,
        tools_left_out=tools_left_out,
        reasoning=dict(meta.reasoning) if meta.reasoning else None,
        expanded=dict(meta.expanded) if meta.expanded is not None else None,
        trees=dict(meta.trees) if meta.trees is not None else None,
        tokens=written_tokens,
        trainable_tokens=plan.trainable,
        rows=rows,
        max_len=config.max_len,
        fill=round(written_tokens / capacity, 6) if capacity else 0.0,
        lower_bound_l1=plan.bound_l1,
        lower_bound_l2=plan.bound_l2,
        rows_over_l2=plan.n_rows - plan.bound_l2,
        rows_over_l2_fraction=round(plan.n_rows / plan.bound_l2 - 1, 6) if plan.bound_l2 else 0.0,
        padding_tokens=capacity - written_tokens,
        alignment_padding_tokens=_alignment_padding(config, plan),
        rows_without_packing=samples,
        padding_tokens_without_packing=samples * config.max_len - tokens,
        algorithm=config.algorithm,
        world_size=config.world_size,
        rank_tokens=[int(x) for x in plan.order.rank_tokens],
        rank_token_spread=round(float(packing.rank_token_spread(plan.order.rank_tokens)), 6),
        step_balance=_step_balance(config, plan),
        cache=cache_state,
        output=None if config.dry_run else str(config.output),
        warnings=warnings,
        lost=lost,
        encoder=meta.encoder,
    )


def empty_answers_warning(n: int) -> Message:
    """The warning for trained answers that are empty or only whitespace (they teach an answer of nothing)."""
    answers = "answer is" if n == 1 else "answers are"
    return Message(
        f"{n} trained {answers} empty or only whitespace (zero-width characters included): they teach the "
        "model to answer with nothing; pass ",
        Opt("fix_turns"),
        ' to drop them, or mark them "train": false',
    )


def leading_answers_warning(n: int) -> Message:
    """The warning for conversations that open with a trained assistant turn (an answer to nothing)."""
    what = "conversation opens" if n == 1 else "conversations open"
    return Message(
        f"{n:,} {what} with an assistant turn that is trained as an answer to nothing (no user message before "
        "it); pass ",
        Opt("fix_turns"),
        " to drop such turns",
    )


def tools_left_out_warning(n: int) -> Message:
    """The warning for conversations whose tools list the chat template does not render."""
    what = "conversation carries" if n == 1 else "conversations carry"
    return Message(
        f"the chat template leaves the tools list out of the tokens: {n:,} {what} tools the model will not see, "
        "and their calls are trained without the functions' definitions; pass a template that renders tools (",
        Opt("chat_template"),
        ")",
    )


def reasoning_warning(reasoning: dict[str, int]) -> Message:
    """The warning for trained answers whose reasoning the chat template leaves out of the tokens."""
    left, turns, records = reasoning["turns_left_out"], reasoning["turns"], reasoning["records_left_out"]
    if left == turns:
        behaviour = "it renders no reasoning"
    elif reasoning.get("records_last_round_only") == records:
        behaviour = "it renders the reasoning of the last round only"
    else:
        behaviour = "it leaves out the reasoning of some rounds"
    return Message(
        f"the chat template leaves the reasoning of {left:,} of {turns:,} trained assistant turns with reasoning "
        f"(in {records:,} records) out of the tokens ({behaviour}): those answers are trained without it; pass ",
        Opt("expand_turns", "reasoning"),
        " to train each round as the last one, or a template that keeps it",
    )


class MadeWith(TypedDict):
    """The summary's keys of what the tokens were made with (``made_with``)."""

    tokenizer: str
    template: str
    template_source: str
    task: str


def made_with(config: PackConfig, identity: TokenizerIdentity) -> MadeWith:
    """Return what the tokens were made with: the tokenizer, the template and where it came from, the task.

    ``template_source`` is ``tokenizer`` (the tokenizer's own), ``file`` (a path), ``packcli`` (one of
    packcli's templates, named) or ``default`` (packcli's template for a tokenizer without one).
    """
    from packcli.tokenize.encoders.tokenizer import DEFAULT_TOKENIZER
    from packcli.tokenize.templates.choice import builtin_name

    if config.chat_template is not None:
        name = builtin_name(config.chat_template)
        template, source = (name, "packcli") if name is not None else (config.chat_template, "file")
    elif "chat_template" in identity:
        template, source = identity["chat_template"], identity["chat_template_source"]
    else:  # a cache entry made before the identity named its template (only ChatML was packcli's then)
        old = identity.get("chat_template_source", "tokenizer")
        template, source = ("tokenizer", "tokenizer") if old == "tokenizer" else ("chatml", "default")
    return {
        "tokenizer": config.tokenizer_name or DEFAULT_TOKENIZER,
        "template": template,
        "template_source": source,
        "task": config.task,
    }


def _alignment_padding(config: PackConfig, plan: Plan) -> int:
    """Return the padding tokens --pad-to-multiple-of adds to the samples of the rows written."""
    if config.pad_multiple <= 1:
        return 0
    extra = packing.pad_lengths(plan.lengths, config.pad_multiple, config.pad_offset) - plan.lengths
    per_row = np.add.reduceat(extra, plan.row_start[:-1]) if len(extra) else np.zeros(0, np.int64)
    per_row[np.diff(plan.row_start) == 0] = 0
    return int(per_row[plan.order.order].sum())


def _step_balance(config: PackConfig, plan: Plan) -> StepBalance | None:
    """Return the --world-size steps' predicted idle fraction, as written and made each way (None: one rank)."""
    padded = packing.pad_lengths(plan.lengths, config.pad_multiple, config.pad_offset)
    return balance.step_balance(plan_options(config), padded, plan.row_start, plan.order)


def _lengths_in_rows(store: TokenStore, plan: Plan) -> np.ndarray:
    """Return each store row's length as planned in its row (0 for samples in no row)."""
    eff = np.zeros(len(store.lengths), dtype=np.int64)
    eff[plan.store_rows] = plan.lengths
    return eff


def _records_lost(store: TokenStore, plan: Plan) -> dict[str, int]:
    """Return, by reason, the records whose every sample the plan leaves out."""
    if not plan.drop_rows:
        return {}
    kept = np.ones(len(store.lengths), dtype=bool)
    for rows in plan.drop_rows.values():
        kept[rows] = False
    index = store.sample_index  # record numbers, from 0: a flag a record, not np.unique (which sorts)
    records = int(index.max()) + 1 if len(index) else 0
    still_there = np.zeros(records, dtype=bool)
    still_there[index[kept]] = True
    out: dict[str, int] = {}
    for reason, rows in plan.drop_rows.items():
        gone = np.zeros(records, dtype=bool)
        gone[index[rows]] = True
        gone &= ~still_there
        # A record with samples dropped for two reasons counts under the first (in plan order).
        still_there |= gone
        if n := int(gone.sum()):
            out[reason] = n
    return out


def _pieces_dropped(store: TokenStore, plan: Plan) -> dict[str, int]:
    """Return, by reason, the samples of split records the plan leaves out."""
    split_records = np.unique(store.sample_index[store.piece_index > 0])
    out = {}
    for reason, rows in plan.drop_rows.items():
        n = int(np.isin(store.sample_index[rows], split_records).sum())
        if n:
            out[reason] = n
    return out


def _lost(
    store: TokenStore, plan: Plan, in_rows: np.ndarray, dropped: Counter[str], records: int, read_tokens: int
) -> Lost:
    """Return what did not reach the rows: records by reason, tokens by reason, and both fractions.

    ``in_rows`` is each store row's length as planned (``_lengths_in_rows``). Both fractions are of what
    was read: ``records`` (every record read) and ``read_tokens`` (every token tokenized) plus the tokens
    of pieces the split left out; a mix's left-out records and the eval split are neither lost nor
    outside the denominator.
    """
    tokens_by_reason: Counter[str] = Counter()
    for reason, rows in plan.drop_rows.items():
        # Samples in rows left out by --world-size lose what the rows held; the others all they had.
        lengths = in_rows if reason == "world_size_remainder" else store.lengths
        tokens_by_reason[reason] += int(lengths[rows].sum())
    cut = int(store.lengths[plan.store_rows].sum()) - int(plan.lengths.sum())
    if cut > 0:
        tokens_by_reason["truncated"] += cut
    # Pieces the split left out never reached the store: their tokens are counted where they were cut.
    split = store.meta.split
    left_out = Counter({k: int(v) for k, v in (split.tokens_left_out if split else {}).items()})
    tokens_by_reason.update(+left_out)
    total_tokens = read_tokens + sum(left_out.values())
    records_lost = sum(dropped.values())
    tokens_lost = sum(tokens_by_reason.values())
    return Lost(
        records=records_lost,
        records_fraction=round(records_lost / records, 6) if records else 0.0,
        tokens=tokens_lost,
        tokens_fraction=round(tokens_lost / total_tokens, 6) if total_tokens else 0.0,
        records_by_reason=dict(sorted(dropped.items())),
        tokens_by_reason=dict(sorted(tokens_by_reason.items())),
    )


def _worst(lost: Lost) -> tuple[str, str]:
    """Return the measure (records or tokens) with the larger loss, and its top reason."""
    by_records, by_tokens = lost.records_by_reason, lost.tokens_by_reason
    if lost.records_fraction >= lost.tokens_fraction and by_records:
        return "records", max(by_records, key=lambda r: (by_records[r], r))
    if by_tokens:
        return "tokens", max(by_tokens, key=lambda r: (by_tokens[r], r))
    return "records", max(by_records, key=lambda r: (by_records[r], r)) if by_records else ""


def loss_words(lost: Lost, config: PackConfig) -> tuple[Part, ...]:
    """Describe the loss in one clause: how much, the top reason, and what keeps it."""
    measure, reason = _worst(lost)
    by_records = measure == "records"
    fraction = lost.records_fraction if by_records else lost.tokens_fraction
    count = (lost.records_by_reason if by_records else lost.tokens_by_reason).get(reason, 0)
    what = "records" if measure == "records" else "tokens"
    hints = KEEP_THEM | (KEEP_THEM_SPLIT if config.overflow == "split" else {})
    if config.task in ("preference", "kto"):
        hints = hints | KEEP_THEM_PAIRS
    fix = suggest(config, hints.get(reason, BAD_DATA)) or RAISE_MAX_LEN
    named: tuple[Part, ...] = (reason,)
    if reason == "too_long":
        named = ("too_long, over ", Opt("max_len"), f" {config.max_len}")
    return (
        f"{fraction:.1%} of the {what} were lost ({lost.records:,} records dropped, {lost.tokens:,} tokens); "
        "top reason ",
        *named,
        f" ({count:,} {what}): ",
        *fix,
    )


def loss_warning(lost: Lost, config: PackConfig) -> Message | None:
    """Return the warning for a loss above LOUD_FRACTION of records or tokens, else None."""
    if max(lost.records_fraction, lost.tokens_fraction) <= LOUD_FRACTION:
        return None
    return Message(*loss_words(lost, config))


def check_loss(config: PackConfig, summary: RunSummary) -> None:
    """Raise InputError when the run loses more than --max-drop-fraction of its records or tokens."""
    limit = config.max_drop_fraction
    lost = summary.lost
    if limit is None or max(lost.records_fraction, lost.tokens_fraction) <= limit:
        return
    raise InputError(*loss_words(lost, config), "; that is more than ", Opt("max_drop_fraction"), f" {limit}")
