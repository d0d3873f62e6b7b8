"""The run's eval split (``--eval-fraction``, ``--eval-records``): hold out, plan and account the eval records.

The records are chosen by ``packcli.plan.holdout``; here they are planned with the run's plan options
and counted: the eval output has its own summary (in its own manifest, ``OUT/eval/manifest.json``),
and the run's summary an ``eval`` section. Held-out records are neither packed into the training rows
nor dropped: ``records_read == packed + sum(dropped) (+ mix.records_left_out) + eval.records``.
"""

from __future__ import annotations

import dataclasses

from packcli.config import PackConfig, parse_mix
from packcli.errors import Message, Opt, PackcliError
from packcli.plan import holdout
from packcli.plan.planner import Plan, make_plan
from packcli.results import EvalSummary, RunSummary
from packcli.run import accounting
from packcli.run.options import holdout_options, plan_options
from packcli.store.tokens import TokenStore


def wanted(config: PackConfig) -> bool:
    """Whether the run holds out an eval split."""
    return config.eval_fraction is not None or config.eval_records is not None


def split(config: PackConfig, store: TokenStore, of_mix: list[int] | None = None) -> holdout.Holdout:
    """Hold out the eval records of ``store`` per source: each --mix source (``of_mix``: the mix source of
    each input, ``plan.mix.mix_of_inputs``), else each input."""
    if of_mix is not None:
        of_inputs = of_mix
        names = [parse_mix(v)[0] for v in config.mix]
    else:
        of_inputs = list(range(len(store.meta.source_starts)))
        names = [s.path for s in store.meta.sources]
    return holdout.hold_out(holdout_options(config), store, of_inputs, names)


def plan(config: PackConfig, held: holdout.Holdout, cache_state: str) -> tuple[Plan, RunSummary]:
    """Plan the eval records as the training records are planned; return the plan and the eval summary."""
    try:
        eval_plan = make_plan(plan_options(config), held.eval)
        eval_summary = accounting.summary(config, held.eval, eval_plan, cache_state)
        accounting.check_loss(config, eval_summary)
    except PackcliError as exc:  # say which output it is about
        if exc.option is not None:
            raise
        n = sum(held.records)
        what = f"the eval split ({n} record{'s' if n != 1 else ''}): "
        raise type(exc)(what, *exc.message, hint=exc.hint) from exc
    return eval_plan, eval_summary


def account(summary: RunSummary, held: holdout.Holdout, eval_summary: RunSummary) -> RunSummary:
    """The run's summary with its ``eval`` section; the held-out records are not counted as packed."""
    section = EvalSummary(
        path=holdout.PATH,
        records=sum(held.records),
        packed=eval_summary.packed,
        dropped=eval_summary.dropped,
        samples=eval_summary.samples,
        tokens=eval_summary.tokens,
        trainable_tokens=eval_summary.trainable_tokens,
        rows=eval_summary.rows,
        by_source=held.by_source(),
    )
    warnings = [*summary.warnings, *(w.prefixed("eval: ") for w in eval_summary.warnings if w not in summary.warnings)]
    if eval_summary.tokens > summary.tokens:
        warnings.append(
            Message(
                f"the eval split holds more tokens ({eval_summary.tokens:,}) than the training rows "
                f"({summary.tokens:,}); lower ",
                Opt("eval_fraction"),
                " or pass ",
                Opt("eval_records"),
                " N",
            )
        )
    return dataclasses.replace(summary, packed=summary.packed - sum(held.records), eval=section, warnings=warnings)
