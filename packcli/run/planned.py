"""A run's plan and its summary: the store as the plan sees it (``--dedup exact``, the eval split, ``--mix``).

``pipeline`` tokenizes before and writes after; here the token store is narrowed to what the plan
packs, planned, and counted: the summary with its dedup, mix and eval sections, and the eval split's own
plan and summary (written into ``eval/`` by ``pipeline``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from packcli.config import PackConfig
from packcli.plan import dedup, holdout, mix
from packcli.plan.kept import keep_plan, load_plan
from packcli.plan.options import PlanOptions
from packcli.plan.planner import Plan, make_plan
from packcli.results import CacheParts, RunSummary
from packcli.run import accounting, evalsplit
from packcli.run.entries import cache_entry
from packcli.run.options import mix_options
from packcli.run.tokenized import TokenizedInputs
from packcli.store.tokens import TokenStore


@dataclass
class PlannedRun:
    """The store the plan packs (the view left by --dedup exact, the eval split and --mix), and the plan."""

    store: TokenStore
    plan: Plan
    mixing_options: mix.MixOptions  # the mix's options (with the run's plan options), used or not
    deduped: dedup.Dedup | None  # --dedup exact: what it left out
    held: holdout.Holdout | None  # the eval split: the records held out, and the rest
    mixed: mix.Mix | None  # --mix: the records chosen


@dataclass
class EvalSplit:
    """The eval split's records, their plan and their own summary."""

    held: holdout.Holdout
    plan: Plan
    summary: RunSummary


def plan_run(config: PackConfig, found: PackConfig, inputs: TokenizedInputs) -> PlannedRun:
    """Leave out duplicates, hold out the eval records, choose the mix, and plan the rows of what is left.

    ``found`` is ``config`` with the task found in the records.
    """
    store = inputs.store
    mixing_options = mix_options(found)  # its plan options are the run's
    # --dedup exact, then --mix: the plan packs their view of the store (packcli.plan.dedup, .mix)
    deduped = dedup.drop_duplicates(store) if config.dedup == "exact" else None
    store = deduped.view if deduped is not None else store
    of_inputs = mix.mix_of_inputs(mixing_options.names, config.split, inputs.sources) if config.mix else None
    held = evalsplit.split(config, store, of_inputs) if evalsplit.wanted(config) else None  # before the mix
    store = held.train if held is not None else store
    mixed = mix.choose(mixing_options, store, of_inputs) if of_inputs is not None else None
    store = mixed.view if mixed is not None else store
    plan = _plan(config, mixing_options.plan, store, whole=store is inputs.store)
    if mixed is not None:
        mix.part_repeats(mixing_options.plan, mixed, plan)
    return PlannedRun(store, plan, mixing_options, deduped, held, mixed)


def _plan(config: PackConfig, options: PlanOptions, store: TokenStore, whole: bool) -> Plan:
    """The plan of ``store``: kept by an earlier run of the same cache entry and options, or made (and kept,
    where ``store`` is a cache entry seen ``whole``, not a view of it; ``packcli.plan.kept``)."""
    entry = cache_entry(config, store) if whole else None
    if entry is not None and (plan := load_plan(entry, options, len(store.lengths), not config.dry_run)) is not None:
        return plan
    plan = make_plan(options, store)
    if entry is not None and not config.dry_run:
        keep_plan(entry, options, plan)
    return plan


def run_summary(
    found: PackConfig, inputs: TokenizedInputs, planned: PlannedRun, read_tokens: int
) -> tuple[RunSummary, EvalSplit | None]:
    """Return the run's summary (with its dedup, mix and eval sections), and its eval split planned, if any.

    ``found`` is the run's config with the task found in the records; ``read_tokens`` every token tokenized.
    """
    store, plan, deduped, held, mixed = planned.store, planned.plan, planned.deduped, planned.held, planned.mixed
    summary = accounting.summary(found, store, plan, inputs.cache, read_tokens=read_tokens)
    if deduped is not None:
        summary = dataclasses.replace(summary, dedup=dedup.summary(deduped))
    if mixed is not None:  # records left out by the mix are neither packed nor dropped
        mixing = mix.accounting(planned.mixing_options, mixed, plan)
        warnings = [*summary.warnings, *mix.warnings(mixing)]
        if mixed.repeats_in_same_row:
            warnings = [*warnings, mix.same_row_warning(mixed.repeats_in_same_row)]
        packed = summary.packed - (mixing.records_left_out or 0)
        summary = dataclasses.replace(summary, mix=mixing, packed=packed, warnings=warnings)
    accounting.check_loss(found, summary)
    eval_split = None
    if held is not None:
        eval_plan, eval_summary = evalsplit.plan(found, held, inputs.cache)
        if mixed is not None:  # the eval rows carry the source column too, numbered as the training's
            of_input = mixed.view.meta.mix_source_of_input
            held.eval.meta = dataclasses.replace(held.eval.meta, mix_source_of_input=of_input)
            eval_summary = dataclasses.replace(eval_summary, mix=mix.sources_of(summary.mix))
        summary = evalsplit.account(summary, held, eval_summary)
        eval_split = EvalSplit(held, eval_plan, eval_summary)
    summary = dataclasses.replace(summary, warnings=[*inputs.warnings, *summary.warnings])
    if inputs.reuse is not None:
        summary = dataclasses.replace(summary, cache_parts=CacheParts(**inputs.reuse))
    return summary, eval_split
