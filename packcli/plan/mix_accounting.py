"""What a mix gave: the summary's ``mix`` (``accounting``: per source, what was asked, what it had,
what the rows hold), its warnings, and the eval manifest's sources (``sources_of``).
"""

from __future__ import annotations

import numpy as np

from packcli.errors import Message, Opt
from packcli.plan.mix_types import Mix, MixOptions
from packcli.plan.planner import Plan, _trained_in_windows
from packcli.plan.views import source_ids
from packcli.results import MixSource, MixSummary


def warnings(mixing: MixSummary) -> list[Message]:
    """The warnings of a mix's accounting (``accounting``): a share that repeats its source (its epochs as the
    table shows them), and a share that leaves most of its source out."""
    measure = {"records": "records", "tokens": "tokens", "trainable": "trainable_tokens"}[mixing.by]
    out = []
    for s in mixing.sources:
        if s.requested is None or "share" not in s.requested:
            continue
        available, left_out = s.available or {}, s.left_out or {}
        name, epochs = s.name, float(s.epochs or 0.0)
        have = available[measure]
        left = left_out[measure] / have if have else 0.0
        if epochs > 1 + 1e-6:
            out.append(
                Message(
                    Opt("mix"),
                    f" {name}: the shares repeat this source {epochs:.2f} times ({epochs:.2f} epochs of its "
                    "tokens); give it as Nx to ask for the repeats, or lower its share",
                )
            )
        elif left > 0.5:
            out.append(
                Message(
                    Opt("mix"),
                    f" {name}: the shares leave out {left:.1%} of this source's {mixing.by} "
                    f"({left_out['records']:,} of {available['records']:,} records): shares alone size "
                    "the output by the scarcest source; give this source as Nx (1x keeps all of it) to size the "
                    "output by it",
                )
            )
    return out


def accounting(options: MixOptions, mix: Mix, plan: Plan) -> MixSummary:
    """The summary's ``mix``: per source, what was asked, what it had, what the rows hold, repeats, left out."""
    view = mix.view
    n_src = len(mix.names)
    written = np.ones(len(plan.store_rows), dtype=bool)
    for r in plan.order.dropped_rows.tolist():
        written[plan.row_start[r] : plan.row_start[r + 1]] = False
    rows = plan.store_rows[written]
    lengths = plan.lengths[written].astype(np.int64)
    trained = view.trainable[rows].astype(np.int64)
    cut = np.flatnonzero(lengths < view.lengths[rows])
    if len(cut):  # a cut sample trains what its window holds (as the plan counts it)
        trained[cut] = _trained_in_windows(view, rows[cut], options.plan.sample_limit, options.plan.cut_side)
    src = source_ids(view, rows).astype(np.int64)
    tokens = np.bincount(src, weights=lengths, minlength=n_src).astype(np.int64)
    trainable = np.bincount(src, weights=trained, minlength=n_src).astype(np.int64)
    samples = np.bincount(src, minlength=n_src)
    key = view.sample_index[rows].astype(np.int64) * (1 << 24) + view.piece_index[rows].astype(np.int64)
    distinct_keys, first_pos = np.unique(key, return_index=True)
    distinct = np.bincount(src[first_pos], minlength=n_src)
    records = np.bincount(src[first_pos[np.r_[True, np.diff(distinct_keys >> 24) != 0]]], minlength=n_src)
    totals = [max(int(records.sum()), 1), max(int(tokens.sum()), 1), max(int(trainable.sum()), 1)]
    target_total = float(mix.target.sum()) or 1.0
    sources = []
    for m in range(n_src):
        entry = MixSource(
            name=mix.names[m],
            inputs=mix.inputs[m],
            sample_index=mix.ranges[m],
            requested={mix.kinds[m]: mix.values[m]},
            requested_share=round(float(mix.target[m]) / target_total, 6),
            available=dict(zip(("records", "tokens", "trainable_tokens"), map(int, mix.available[m]), strict=True)),
            target=round(float(mix.target[m]), 3),
            realised={
                "records": int(records[m]),
                "samples": int(samples[m]),
                "tokens": int(tokens[m]),
                "trainable_tokens": int(trainable[m]),
            },
            realised_share={
                "records": round(int(records[m]) / totals[0], 6),
                "tokens": round(int(tokens[m]) / totals[1], 6),
                "trainable_tokens": round(int(trainable[m]) / totals[2], 6),
            },
            epochs=round(int(tokens[m]) / max(int(mix.available[m][1]), 1), 6),
            repeats=int(samples[m] - distinct[m]),
            left_out=dict(zip(("records", "tokens", "trainable_tokens"), map(int, mix.left_out[m]), strict=True)),
        )
        sources.append(entry)
    return MixSummary(
        by=mix.measure,
        seed=options.plan.seed,
        size=round(mix.size, 3),
        sources=sources,
        repeats=int(sum(s.repeats or 0 for s in sources)),
        repeats_in_same_row=mix.repeats_in_same_row,
        records_left_out=int(mix.left_out[:, 0].sum()),
    )


def sources_of(mixing: MixSummary | None) -> MixSummary | None:
    """The eval manifest's ``mix``: the sources the source column numbers (names, inputs, sample_index
    ranges), without the training rows' accounting; nothing of the eval rows is repeated or left out."""
    if mixing is None:
        return None
    sources = [MixSource(name=s.name, inputs=s.inputs, sample_index=s.sample_index) for s in mixing.sources]
    return MixSummary(by=mixing.by, seed=mixing.seed, sources=sources, repeats=0, repeats_in_same_row=0)
