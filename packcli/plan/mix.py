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
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packcli.errors import InputError, Message, Opt, UsageError
from packcli.io.sources import InputSource, input_identity, resolve_inputs
from packcli.plan import packing
from packcli.plan.options import PlanOptions
from packcli.plan.planner import Plan, _trained_in_windows
from packcli.results import MixSource, MixSummary
from packcli.store.tokens import TokenStore

SOURCE_KEY = "mix_source_of_input"  # view meta: the mix source of each input source
TINY = 1e-9
SEARCH = 4096  # most samples looked at to part one repeated copy from its twin


@dataclass(frozen=True)
class MixOptions:
    """The options of a mix: its sources' recipes, the measure they are given in, and the plan it feeds."""

    specs: list[tuple[str, str, float]]  # per source: its path, share or epochs, the value
    plan: PlanOptions  # the plan the mix feeds: the sample limit, overflow, padding, seed and ranks
    by: str = "tokens"  # records, tokens or trainable: what a share is a share of
    max_epochs: float = 1.0  # the most times a share may repeat its source
    task: str = "sft"

    @property
    def names(self) -> list[str]:
        """Each source's path as given."""
        return [path for path, _, _ in self.specs]


@dataclass
class Mix:
    """The chosen mix: the view of the store the plan packs, and what each source has and gives."""

    view: TokenStore  # the store's samples as mixed: chosen records, a repeated record's copies adjacent
    names: list[str]
    kinds: list[str]  # share | epochs
    values: list[float]
    inputs: list[list[str]]  # the input files each source resolved to
    ranges: list[list[list[int]]]  # per source, the [first, end) sample_index of each of its inputs
    available: np.ndarray  # per source: [records, tokens, trainable] that can be packed
    target: np.ndarray  # per source: the measure aimed at
    left_out: np.ndarray  # per source: [records, tokens, trainable] the mix leaves out
    repeats_in_same_row: int = 0
    measure: str = "tokens"
    size: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


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
    if len(of_inputs) != len(store.meta["source_starts"]):
        raise InputError("the inputs changed while the mix was resolved (files came or went); run again")
    of_input = np.asarray(of_inputs, dtype=np.int64)
    starts = np.asarray(store.meta["source_starts"], dtype=np.int64)
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
    view.meta[SOURCE_KEY] = of_input.tolist()
    left = eligible & (copies == 0)
    left_out = np.zeros((n_src, 3), dtype=np.int64)
    for m in range(n_src):
        left_out[m] = per_unit[left & (unit_src == m)].sum(axis=0)
    ends = [*starts[1:].tolist(), int(store.meta["records_read"])]
    ranges = [[[int(starts[i]), int(ends[i])] for i in np.flatnonzero(of_input == m)] for m in range(n_src)]
    paths = [s["path"] for s in store.meta["sources"]]
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


def store_view(store: TokenStore, rows: np.ndarray) -> TokenStore:
    """The store's rows ``rows`` (repeats allowed) as a store: the same token files, read at their offsets."""
    view = TokenStore(
        path=store.path,
        sample_index=store.sample_index[rows],
        piece_index=store.piece_index[rows],
        lengths=store.lengths[rows],
        trainable=store.trainable[rows],
        first_trained=store.first_trained[rows],
        positions=store.positions[rows],
        meta=dict(store.meta),
        sample_role=None if store.sample_role is None else store.sample_role[rows],
        seconds=store.seconds,
        content_key=None if store.content_key is None else store.content_key[rows],
        tree_nodes=None if store.tree_nodes is None else store.tree_nodes.select(rows),
    )
    view.__dict__["starts"] = store.starts[rows]  # the cached property, set: offsets in the token files
    return view


def source_ids(store: TokenStore, rows: np.ndarray) -> np.ndarray:
    """The mix source (int16) of each of the store's rows ``rows``: the ``source`` column."""
    of_input = np.asarray(store.meta[SOURCE_KEY], dtype=np.int16)
    starts = np.asarray(store.meta["source_starts"], dtype=np.int64)
    return of_input[np.searchsorted(starts, store.sample_index[rows], side="right") - 1]


def part_repeats(options: PlanOptions, mix: Mix, plan: Plan) -> None:
    """Part copies of a record that share a row (see the module docstring); count those that stay."""
    view = mix.view
    keys = view.sample_index.astype(np.int64) * (1 << 24) + view.piece_index.astype(np.int64)
    pos_key = keys[plan.store_rows]
    counts = np.diff(plan.row_start)
    row_of = np.repeat(np.arange(len(counts)), counts)
    # Is any key twice in one row? (rows hold ascending view rows, so twins are neighbours)
    twin = np.zeros(len(pos_key), dtype=bool)
    twin[1:] = (pos_key[1:] == pos_key[:-1]) & (row_of[1:] == row_of[:-1])
    conflicts = np.flatnonzero(twin)
    if not len(conflicts):
        return
    padded = packing.pad_lengths(plan.lengths.astype(np.int64), options.pad_multiple, options.pad_offset)
    row_tokens = np.bincount(row_of, weights=padded, minlength=len(counts)).astype(np.int64)
    fixed = set(plan.order.dropped_rows.tolist())
    movable = np.flatnonzero(~np.isin(row_of, list(fixed))) if fixed else np.arange(len(pos_key))
    by_length: dict[int, list[int]] = {}
    for p in movable.tolist():
        by_length.setdefault(int(padded[p]), []).append(p)
    lengths_known = np.array(sorted(by_length), dtype=np.int64)
    row_keys: dict[int, dict[int, int]] = {}

    def keys_of(r: int) -> dict[int, int]:
        if r not in row_keys:
            found: dict[int, int] = {}
            for k in pos_key[plan.row_start[r] : plan.row_start[r + 1]].tolist():
                found[k] = found.get(k, 0) + 1
            row_keys[r] = found
        return row_keys[r]

    touched: set[int] = set()
    stuck = 0
    # Rows may change lengths when the row order can be made again without changing what is written: one
    # rank, or no rows left out by --world-size (then the order is made again from the new row lengths).
    free = options.world_size == 1 or not len(plan.order.dropped_rows)
    resized = False
    for p in conflicts.tolist():
        a = int(row_of[p])
        if a in fixed:  # a row --world-size leaves out: not written
            continue
        kp, lp = int(pos_key[p]), int(padded[p])
        if keys_of(a).get(kp, 0) < 2:  # parted already (this position took another sample in a swap)
            continue
        room_a = options.max_len - int(row_tokens[a])
        # Same padded length first, then (one rank only) the nearest lengths that fit row a.
        tries = _lengths_to_try(lp, room_a, lengths_known if free else None)
        done = False
        looked = 0
        for length in tries:
            for q in by_length.get(length, []):
                looked += 1
                if looked > SEARCH:
                    break
                b = int(row_of[q])
                kq = int(pos_key[q])
                if b == a or kp in keys_of(b) or kq in keys_of(a):
                    continue
                if options.max_len - int(row_tokens[b]) < lp - length:
                    continue
                _swap(plan, p, q)
                pos_key[p], pos_key[q] = kq, kp
                padded[p], padded[q] = length, lp
                row_of_keys_a, row_of_keys_b = keys_of(a), keys_of(b)
                row_of_keys_a[kp] -= 1
                row_of_keys_a[kq] = row_of_keys_a.get(kq, 0) + 1
                row_of_keys_b[kq] -= 1
                if not row_of_keys_b[kq]:
                    del row_of_keys_b[kq]
                row_of_keys_b[kp] = 1
                row_tokens[a] += length - lp
                row_tokens[b] += lp - length
                resized = resized or length != lp
                by_length[length].remove(q)
                by_length[length].append(p)
                by_length[lp].remove(p)
                by_length[lp].append(q)
                touched.update((a, b))
                done = True
                break
            if done or looked > SEARCH:
                break
        if not done:
            stuck += 1
    for r in sorted(touched):  # a row's samples ascend (by view row: sample_index, then piece)
        lo, hi = int(plan.row_start[r]), int(plan.row_start[r + 1])
        order = np.argsort(plan.store_rows[lo:hi], kind="stable") + lo
        plan.store_rows[lo:hi] = plan.store_rows[order]
        plan.lengths[lo:hi] = plan.lengths[order]
        plan.skips[lo:hi] = plan.skips[order]
    if resized and options.world_size > 1:  # the ranks' balance, from the rows' new lengths
        plan.order = packing.order_rows(row_tokens, options.seed, options.world_size, options.rank_remainder)
    mix.repeats_in_same_row = stuck


def _lengths_to_try(length: int, room: int, known: np.ndarray | None) -> Iterator[int]:
    """The padded lengths to look for a swap partner in: ``length``, then the nearest others that fit."""
    yield length
    if known is None:
        return
    near = np.argsort(np.abs(known - length), kind="stable")
    for i in near.tolist():
        other = int(known[i])
        if other != length and other - length <= room:
            yield other


def _swap(plan: Plan, p: int, q: int) -> None:
    for arr in (plan.store_rows, plan.lengths, plan.skips):
        arr[p], arr[q] = arr[q], arr[p]


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


def same_row_warning(n: int) -> Message:
    """The warning for repeated copies that share a row with their twin (no swap could part them)."""
    copies = "copy of a repeated record shares" if n == 1 else "copies of repeated records share"
    return Message(
        f"{n} {copies} a row with another copy (no sample of another row could take its place); "
        "lower the repeats or raise ",
        Opt("max_len"),
    )
