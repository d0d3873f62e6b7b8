"""Mixtures (``--mix PATH=SHARE``, ``--mix PATH=Nx``): which tokenized records go into the output, how often.

The mix is chosen from the token store, after tokenization, so a new recipe re-packs from the cache.
Its unit is a whole record (all pieces of a record split by ``--overflow split`` go together), never a
cut. Each source is measured by ``--mix-by``: ``tokens`` (a record's tokens as it will be packed: at
most ``--max-len`` each sample), ``trainable`` (its trained tokens) or ``records`` (1 each). Records
that certainly cannot be packed (longer than ``--max-len`` under ``--overflow drop`` or ``error``) are
no part of any source's measure; they go to the plan once, which drops them (or stops) as without a
mix.

The size of the output: with shares only (they sum to 1), the largest output in which no share
source is repeated: ``X = min(available_i / share_i)``, so the scarcest source (for its share) is
used once, whole. An ``Nx`` source contributes N times its measure (``2x``: every record twice;
``0.5x``: half its measure, sampled); with Nx sources, the shares (summing to less than 1) are of the
whole output, ``X = sum(N_j * available_j) / (1 - sum(shares))``, and a share source whose target
exceeds what it has is repeated. Each source's target ``t`` is met by ``floor(t / available)`` full
passes over its records plus a seeded sample of whole records (a permutation by ``--seed`` and the
source's position; its shortest prefix closest to what is left), so a source's realised measure is
within half a record of its target, and the same seed and recipe choose the same records.

Repeats: a record's copies are adjacent in the plan's input; after the plan, a copy that shares a row
with another copy of its record is swapped with a sample of another row (one of the same padded length
first, so rows keep their lengths; else, unless --world-size leaves rows out, any that fits both rows,
and the rows' order is made again) that holds no copy of it;
copies that no such swap can part are counted (``repeats_in_same_row``).

This module chooses the mix (``choose``); its types are ``mix_types``', the parting of repeats
``repeats``', what the mix gave ``mix_accounting``', the store views it packs ``views``': all
re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from packcli.errors import InputError, Opt, UsageError
from packcli.io.sources import InputSource, input_identity, resolve_inputs
from packcli.plan.mix_accounting import accounting as accounting, sources_of as sources_of, warnings as warnings
from packcli.plan.mix_types import Mix as Mix, MixOptions as MixOptions
from packcli.plan.repeats import SEARCH as SEARCH, part_repeats as part_repeats, same_row_warning as same_row_warning
from packcli.plan.views import source_ids as source_ids, store_view as store_view
from packcli.store.tokens import TokenStore

TINY = 1e-9


def mix_of_inputs(names: list[str], split: str | None, sources: list[InputSource]) -> list[int]:
    """The mix source of each of the run's inputs (``sources``, resolved and sorted as the run reads them).

    A mix source (``names``: each source's path) that is a directory or a glob is several inputs; an input
    named by two sources (a file and its directory) is refused.
    """
    owner: dict[tuple[Any, ...], int] = {}
    for m, path in enumerate(names):
        for source in resolve_inputs([path], split):
            other = owner.setdefault(input_identity(source), m)
            if other != m:
                raise UsageError(
                    Opt("mix"),
                    f" {names[other]} and ",
                    Opt("mix"),
                    f" {path} both hold {source.display}; give each input to one source",
                )
    try:
        return [owner[input_identity(s)] for s in sources]
    except KeyError:
        raise InputError("the inputs changed while the mix was resolved (files came or went); run again") from None


def choose(options: MixOptions, store: TokenStore, of_inputs: list[int]) -> Mix:
    """Choose the records of each source by the recipe of ``options``; return the mix and its view."""
    if options.task in ("preference", "kto") or (store.sample_role is not None and store.sample_role.any()):
        raise UsageError("applies to SFT records; preference and KTO records are not mixed yet", option="mix")
    specs = options.specs
    n_src = len(specs)
    if len(of_inputs) != len(store.meta.source_starts):
        raise InputError("the inputs changed while the mix was resolved (files came or went); run again")
    of_input = np.asarray(of_inputs, dtype=np.int64)
    starts = np.asarray(store.meta.source_starts, dtype=np.int64)
    index = store.sample_index.astype(np.int64)
    # Units: records (sample_index), their rows contiguous in the store.
    new = np.ones(len(index), dtype=bool)
    new[1:] = index[1:] != index[:-1]
    first = np.flatnonzero(new)
    size = np.diff(np.append(first, len(index)))
    unit_of_row = np.cumsum(new) - 1
    unit_src = of_input[np.searchsorted(starts, index[first], side="right") - 1] if len(first) else first
    lengths = store.lengths.astype(np.int64)
    limit = options.plan.sample_limit
    too_long = lengths > limit
    per_unit = np.zeros((len(first), 3), dtype=np.int64)
    per_unit[:, 0] = 1
    per_unit[:, 1] = np.bincount(unit_of_row, weights=np.minimum(lengths, limit), minlength=len(first))
    per_unit[:, 2] = np.bincount(unit_of_row, weights=store.trainable, minlength=len(first))
    if options.plan.overflow in ("drop", "error"):
        eligible = np.bincount(unit_of_row, weights=too_long, minlength=len(first)) == 0
    else:
        eligible = np.ones(len(first), dtype=bool)
    col = {"records": 0, "tokens": 1, "trainable": 2}[options.by]
    measure = per_unit[:, col].astype(np.float64)
    available = np.zeros((n_src, 3), dtype=np.int64)
    for m in range(n_src):
        available[m] = per_unit[eligible & (unit_src == m)].sum(axis=0)
    have = available[:, col].astype(np.float64)
    for m, (path, _, _) in enumerate(specs):
        if have[m] <= 0:
            what = {"records": "record", "tokens": "token", "trainable": "trained token"}[options.by]
            raise InputError(
                f"{path}: the source has no {what} that can be packed (every record was dropped or is longer than ",
                Opt("max_len"),
                "); fix or leave out the source",
                option="mix",
            )
    target = np.zeros(n_src)
    epochs_total = sum(value * have[m] for m, (_, kind, value) in enumerate(specs) if kind == "epochs")
    shares = [(m, value) for m, (_, kind, value) in enumerate(specs) if kind == "share"]
    if not shares:
        total = epochs_total
    elif epochs_total == 0:
        total = min(have[m] / s for m, s in shares)
    else:
        total = epochs_total / (1 - sum(s for _, s in shares))
    for m, (_, kind, value) in enumerate(specs):
        target[m] = value * have[m] if kind == "epochs" else value * total
    _check_epochs(options, specs, target, have)
    copies = np.zeros(len(first), dtype=np.int64)
    copies[~eligible] = 1  # handed to the plan once: it drops them as without a mix
    for m in range(n_src):
        units = np.flatnonzero(eligible & (unit_src == m))
        passes = math.floor(target[m] / have[m] + TINY)
        rest = target[m] - passes * have[m]
        copies[units] = passes
        if rest > TINY * max(have[m], 1):
            rng = np.random.default_rng([options.plan.seed, m])
            order = units[rng.permutation(len(units))]
            running = np.concatenate([[0.0], np.cumsum(measure[order])])
            take = int(np.argmin(np.abs(running - rest)))  # the first of the closest prefixes
            copies[order[:take]] += 1
    unit_seq = np.repeat(np.arange(len(first)), copies)
    seq_size = size[unit_seq]
    rows = np.repeat(first[unit_seq], seq_size) + (
        np.arange(int(seq_size.sum()), dtype=np.int64) - np.repeat(np.cumsum(seq_size) - seq_size, seq_size)
    )
    view = store_view(store, rows)
    view.meta = dataclasses.replace(view.meta, mix_source_of_input=of_input.tolist())
    left = eligible & (copies == 0)
    left_out = np.zeros((n_src, 3), dtype=np.int64)
    for m in range(n_src):
        left_out[m] = per_unit[left & (unit_src == m)].sum(axis=0)
    ends = [*starts[1:].tolist(), store.meta.records_read]
    ranges = [[[int(starts[i]), int(ends[i])] for i in np.flatnonzero(of_input == m)] for m in range(n_src)]
    paths = [s.path for s in store.meta.sources]
    return Mix(
        view=view,
        names=[p for p, _, _ in specs],
        kinds=[k for _, k, _ in specs],
        values=[v for _, _, v in specs],
        inputs=[[paths[i] for i in np.flatnonzero(of_input == m)] for m in range(n_src)],
        ranges=ranges,
        available=available,
        target=target,
        left_out=left_out,
        measure=options.by,
        size=float(total),
    )


def _check_epochs(
    options: MixOptions, specs: list[tuple[str, str, float]], target: np.ndarray, have: np.ndarray
) -> None:
    """Refuse a share that repeats its source more than --mix-max-epochs times (an Nx source is as asked)."""
    for m, (path, kind, _) in enumerate(specs):
        epochs = float(target[m] / have[m])
        if kind == "share" and epochs > options.max_epochs + TINY:
            raise UsageError(
                Opt("mix"),
                f" {path}: the shares repeat this source {epochs:.1f} times ({epochs:.1f} epochs), more than ",
                Opt("mix_max_epochs"),
                f" {options.max_epochs:g}",
                hint=("lower its share, give it as Nx, or raise ", Opt("mix_max_epochs"), " to allow it"),
            )
