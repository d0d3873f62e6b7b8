"""Plans a cache entry has made already: a re-pack with the same plan options loads its plan, not packs again.

A plan follows from the token store's per-sample arrays, the plan options and the packing of this version
of packcli: nothing else. A run whose token store is a cache entry, and whose plan packs the whole store
(no ``--dedup exact``, eval split or ``--mix`` view of it), keeps the plan under the entry
(``plans/KEY.npz``, KEY a hash of the options and the version), and a later run with the same options loads
it: the rows are the same, so are the shards (``packcli.output.reuse`` then takes those from the entry
too). An entry keeps its ``KEEP`` most recently used plans; they go with the entry when it is pruned.
Nothing here fails a run: a plan that cannot be kept, or read back whole and consistent, is made anew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from packcli.owned import write_whole
from packcli.plan.options import PlanOptions
from packcli.plan.packing import RowOrder
from packcli.plan.planner import Plan
from packcli.version import __version__

PLANS_DIR = "plans"
KEEP = 4
FORMAT = 1
_ARRAYS = ("store_rows", "lengths", "skips", "row_start")
_ORDER = ("order", "dropped_rows", "padded_rows", "rank_tokens")
_COUNTS = ("truncated", "tokens", "trainable", "n_rows", "bound_l1", "bound_l2", "alignment_padding")


def plan_key(options: PlanOptions) -> str:
    """The name a plan of ``options`` is kept under (with this version's packing)."""
    body = json.dumps([FORMAT, __version__, dataclasses.asdict(options)], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def load_plan(entry: Path, options: PlanOptions, samples: int, touch: bool = True) -> Plan | None:
    """The plan of ``options`` kept under ``entry`` (a store of ``samples`` samples), or None; ``touch``: mark
    it used (False: nothing is written there, as in a dry run)."""
    path = entry / PLANS_DIR / f"{plan_key(options)}.npz"
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:  # open here: closed on a bad zip
            arrays = {k: data[k] for k in _ARRAYS}
            order = RowOrder(**{k: data[f"order.{k}"] for k in _ORDER})
            reasons = [str(r) for r in data["drop_reasons"]]
            drop_rows = {r: data[f"drop.{r}"] for r in reasons}
            counts = {k: int(data[k]) for k in _COUNTS}
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None
    plan = Plan(
        store_rows=arrays["store_rows"],
        lengths=arrays["lengths"],
        skips=arrays["skips"],
        row_start=arrays["row_start"],
        order=order,
        drop_rows=drop_rows,
        truncated=counts["truncated"],
        tokens=counts["tokens"],
        trainable=counts["trainable"],
        n_rows=counts["n_rows"],
        bound_l1=counts["bound_l1"],
        bound_l2=counts["bound_l2"],
        alignment_padding=counts["alignment_padding"],
    )
    if not _consistent(plan, samples):
        return None
    if touch:
        with contextlib.suppress(OSError):
            os.utime(path)  # its last use, for keeping the most recent
    return plan


def keep_plan(entry: Path, options: PlanOptions, plan: Plan) -> None:
    """Keep ``plan`` (made with ``options``) under the cache ``entry``, and drop its least recently used
    plans beyond ``KEEP``; nothing is said when the entry cannot take it."""
    root = entry / PLANS_DIR
    arrays = {k: getattr(plan, k) for k in _ARRAYS}
    arrays.update({f"order.{k}": getattr(plan.order, k) for k in _ORDER})
    arrays["drop_reasons"] = np.array(list(plan.drop_rows), dtype=str)
    arrays.update({f"drop.{r}": rows for r, rows in plan.drop_rows.items()})
    arrays.update({k: np.int64(getattr(plan, k)) for k in _COUNTS})
    with contextlib.suppress(OSError):
        root.mkdir(exist_ok=True)
        write_whole(root / f"{plan_key(options)}.npz", lambda fh: np.savez(fh, **arrays))
        kept = sorted(
            (p for p in root.glob("*.npz") if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for old in kept[KEEP:]:
            old.unlink()


def _consistent(plan: Plan, samples: int) -> bool:
    """Whether a plan read back fits a store of ``samples`` samples (the rows cover the samples placed, each
    sample of the store once at most)."""
    rows, start = plan.store_rows, plan.row_start
    if len(start) != plan.n_rows + 1 or len(start) == 0 or start[0] != 0 or start[-1] != len(rows):
        return False
    if len(plan.lengths) != len(rows) or len(plan.skips) != len(rows):
        return False
    if len(rows) and (rows.min() < 0 or rows.max() >= samples):
        return False
    return bool(len(plan.order.order) == 0 or plan.order.order.max() < plan.n_rows)
