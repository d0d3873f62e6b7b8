"""Compute-balanced steps (``--balance compute``): a row's cost, the steps' idle fraction, and what the
option changes (the order of whole rows only) and what it leaves (rows, fill, the plain run's bytes)."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import packcli
from packcli.cli import app
from packcli.config.shapes import MODEL_SHAPES, model_shape
from packcli.plan import balance, packing

from .conftest import one_error_line, write_jsonl

WORLD = 4
MAX_LEN = 1024
# A small model makes attention weigh at this row length as it does for a 7B model at 32k: K = 781.25.
MODEL = "2,64,1e5"
K = 1e5 / (2 * 64)


# -- the cost and the idle fraction --------------------------------------------------------------------


def test_k_is_params_over_layers_times_width() -> None:
    assert model_shape("7b").k == pytest.approx(53_406, abs=1)  # 7e9 / (32 x 4096): "about 53,400"
    assert model_shape("32,4096,7e9") == model_shape(" 32, 4096, 7B ") == MODEL_SHAPES["7b"]
    assert model_shape("70B").k == pytest.approx(70e9 / (80 * 8192))
    assert model_shape("24,1024,350m").k == pytest.approx(350e6 / (24 * 1024))
    for bad in ("7x", "32,4096", "0,4096,7e9", "32,4096,-1", "32,4096,nan", "a,b,c"):
        with pytest.raises(packcli.UsageError, match=r"^balance_model takes a size"):
            model_shape(bad)


def test_row_loads_sum_each_rows_lengths_and_squares_exactly() -> None:
    lengths = np.array([3, 4, 5, 1 << 29, 1 << 29, 7])
    row_start = np.array([0, 2, 2, 5, 5, 6])  # rows: [3, 4], [], [5, 2^29, 2^29], [], [7]
    tokens, squares = balance.row_loads(lengths, row_start)
    assert tokens.tolist() == [7, 0, 5 + (1 << 30), 0, 7]
    assert squares.tolist() == [25, 0, 25 + (1 << 59), 0, 49]  # past float64's exact integers


def test_idle_fraction_by_hand() -> None:
    # Steps (10, 8) and (5, 5): GPU time 20 + 10, useful 18 + 10.
    assert balance.idle_fraction(np.array([10.0, 8.0, 5.0, 5.0]), 2) == pytest.approx(2 / 30)
    # The order of steps and of rows in a step does not change it, to the last bit.
    assert balance.idle_fraction(np.array([5.0, 5.0, 8.0, 10.0]), 2) == balance.idle_fraction(
        np.array([10.0, 8.0, 5.0, 5.0]), 2
    )
    assert balance.steps_by_cost_idle(np.array([10.0, 5.0, 8.0, 5.0]), 2) == pytest.approx(2 / 30)
    assert balance.idle_fraction(np.zeros(0), 4) == 0.0
    with pytest.raises(ValueError, match="not whole steps"):
        balance.idle_fraction(np.ones(6), 4)


def _every_grouping(items: list[int], world: int) -> Any:
    """Every way to cut ``items`` into groups of ``world`` (as lists of groups)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, world - 1):
        left = [i for i in rest if i not in others]
        for tail in _every_grouping(left, world):
            yield [(first, *others), *tail]


@pytest.mark.parametrize("seed", range(5))
def test_steps_by_cost_leave_the_least_idle_of_every_grouping(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = rng.uniform(100, 200, size=8).round(1)
    tokens = rng.integers(90, 100, size=8)
    order = packing.order_rows(tokens, seed, 2, row_costs=costs)
    best = min(
        balance.idle_fraction(costs[[i for step in g for i in step]], 2) for g in _every_grouping(list(range(8)), 2)
    )
    assert balance.idle_fraction(costs[order.order], 2) == pytest.approx(best)
    plain = packing.order_rows(tokens, seed, 2)
    assert balance.idle_fraction(costs[order.order], 2) <= balance.idle_fraction(costs[plain.order], 2)


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_by_cost_the_same_rows_are_left_out_or_repeated_and_each_step_is_neighbours(remainder: str) -> None:
    rng = np.random.default_rng(7)
    tokens = rng.integers(800, 1024, size=203)
    costs = tokens + rng.integers(0, 2000, size=203) / 7.0
    plain = packing.order_rows(tokens, 3, 8, remainder)
    by_cost = packing.order_rows(tokens, 3, 8, remainder, costs)
    assert by_cost.dropped_rows.tolist() == plain.dropped_rows.tolist()
    assert by_cost.padded_rows.tolist() == plain.padded_rows.tolist()
    assert sorted(by_cost.order.tolist()) == sorted(plain.order.tolist())
    _assert_steps_are_neighbours_in_cost(costs[by_cost.order], 8)
    assert by_cost.rank_tokens.sum() == plain.rank_tokens.sum()
    assert packing.rank_token_spread(by_cost.rank_tokens) < 0.01  # ranks' tokens stay balanced
    with pytest.raises(ValueError, match="one number per row"):
        packing.order_rows(tokens, 3, 8, remainder, costs[:-1])
    with pytest.raises(ValueError, match="finite"):
        packing.order_rows(tokens, 3, 8, remainder, np.full(203, np.nan))


def _by_costliest(steps: np.ndarray) -> np.ndarray:
    """The steps (one a line) by their largest value, then their least, largest first."""
    return steps[np.lexsort((-steps.min(axis=1), -steps.max(axis=1)))]


def _assert_steps_are_neighbours_in_cost(costs: np.ndarray, world: int) -> None:
    """The promise of --balance compute: each step holds neighbours in cost order (no row of another step
    costs between a step's cheapest and costliest row), so the steps' spreads (costliest - cheapest) sum
    to at most the rows' whole spread, and the idle fraction is at most (N - 1) x that spread over the
    rows' summed cost."""
    steps = _by_costliest(costs.reshape(-1, world))
    assert (steps.min(axis=1)[:-1] >= steps.max(axis=1)[1:]).all()
    spread = steps.max(axis=1) - steps.min(axis=1)
    assert spread.sum() <= costs.max() - costs.min() + 1e-9
    bound = (world - 1) * (costs.max() - costs.min()) / costs.sum()
    assert balance.idle_fraction(costs, world) <= bound + 1e-12


# -- a pack without and with the option -------------------------------------------------------------


def _long_tailed(n: int, seed: int) -> list[dict[str, str]]:
    """Text records of lognormal length (median about 90 tokens, a few near MAX_LEN)."""
    rng = random.Random(seed)
    words = ["packing", "rows", "attention", "café", "数据", "steps", "ranks", "wait", "3.14", "x = 1"]
    sizes = [min(900, int(rng.lognormvariate(0, 1.0) * 80) + 1) for _ in range(n)]
    return [{"text": " ".join(rng.choice(words) for _ in range(size))} for size in sizes]


@dataclass
class Packed:
    out: Path
    summary: dict[str, Any]
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]


def _pack(argv: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["pack", *argv, "--json", "-q", "--num-proc", "1"])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Packed]:
    """The same long-tailed records packed over WORLD ranks: by tokens (no option, and --balance tokens)
    and by cost; the tokenizing once, from the cache."""
    tmp = tmp_path_factory.mktemp("balance")
    data = write_jsonl(tmp / "long.jsonl", _long_tailed(480, seed=5))
    common = [str(data), "--max-len", str(MAX_LEN), "--world-size", str(WORLD), "--balance-model", MODEL]
    common += ["--cache-dir", str(tmp / "cache")]
    made = {}
    for name, extra in (("plain", []), ("tokens", ["--balance", "tokens"]), ("compute", ["--balance", "compute"])):
        out = tmp / name
        summary = _pack([*common, *extra, "-o", str(out)])
        manifest = json.loads((out / "manifest.json").read_text())
        rows = [r for s in manifest["shards"] for r in pq.read_table(out / s["file"]).to_pylist()]
        made[name] = Packed(out, summary, manifest, rows)
    return made


def _costs(rows: list[dict[str, Any]], k: float = K) -> np.ndarray:
    """Each row's cost, recomputed here from the rows' seq_lengths: tokens + sum(L^2) / k."""
    return np.array([sum(r["seq_lengths"]) + sum(n * n for n in r["seq_lengths"]) / k for r in rows])


def _idle(costs: np.ndarray) -> float:
    steps = costs.reshape(-1, WORLD)
    gpu = WORLD * steps.max(axis=1)
    return float((gpu - steps.sum(axis=1)).sum() / gpu.sum())


def test_the_plain_run_is_unchanged_and_balance_tokens_is_it(runs: dict[str, Packed]) -> None:
    plain, tokens = runs["plain"], runs["tokens"]
    digests = [[s["sha256"] for s in run.manifest["shards"]] for run in (plain, tokens)]
    assert digests[0] == digests[1]
    sha = [hashlib.sha256((plain.out / s["file"]).read_bytes()).hexdigest() for s in plain.manifest["shards"]]
    assert sha == digests[0]
    steps = plain.summary["step_balance"]
    assert steps["balance"] == "tokens" and steps["idle"] == steps["idle_tokens"] > 0.01
    assert steps["model"] == MODEL and steps["k"] == pytest.approx(K)
    # The plain order: steps cut from the rows sorted by tokens.
    step_tokens = _by_costliest(np.array([len(r["input_ids"]) for r in plain.rows]).reshape(-1, WORLD))
    assert (step_tokens.min(axis=1)[:-1] >= step_tokens.max(axis=1)[1:]).all()


def test_the_summarys_idle_is_the_one_recomputed_from_the_shards(runs: dict[str, Packed]) -> None:
    for name in ("plain", "compute"):
        run = runs[name]
        steps = run.summary["step_balance"]
        assert steps["idle"] == pytest.approx(_idle(_costs(run.rows)), abs=5e-7)  # rounded to 6 digits
        assert run.manifest["step_balance"] == steps
        assert packcli.stats(run.out).to_dict()["step_balance"] == steps
    # Each run also says what the other way of making the steps would give.
    assert runs["plain"].summary["step_balance"]["idle_compute"] == runs["compute"].summary["step_balance"]["idle"]
    assert runs["compute"].summary["step_balance"]["idle_tokens"] == runs["plain"].summary["step_balance"]["idle"]


def test_by_cost_the_rows_of_a_step_cost_about_the_same(runs: dict[str, Packed]) -> None:
    plain, compute = runs["plain"], runs["compute"]
    costs = _costs(compute.rows)
    _assert_steps_are_neighbours_in_cost(costs, WORLD)
    steps = compute.summary["step_balance"]
    assert steps["balance"] == "compute" and steps["idle"] == steps["idle_compute"]
    assert steps["idle"] * 5 < steps["idle_tokens"]
    # The same rows (whole: no sample split or moved), in another order; the same fill, within --max-len.
    as_sets = [sorted(tuple(r["sample_index"]) for r in run.rows) for run in (plain, compute)]
    assert as_sets[0] == as_sets[1]
    index = [i for r in compute.rows for i in r["sample_index"]]
    assert len(index) == len(set(index)) and {p for r in compute.rows for p in r["piece_index"]} == {0}
    assert max(len(r["input_ids"]) for r in compute.rows) <= MAX_LEN
    for key in ("rows", "fill", "tokens", "packed", "dropped"):
        assert compute.summary[key] == plain.summary[key]
    # Rank r reads rows r, r + N, ...: its tokens are the summary's, balanced.
    rank_tokens = [sum(len(r["input_ids"]) for r in compute.rows[k::WORLD]) for k in range(WORLD)]
    assert rank_tokens == compute.summary["rank_tokens"] and compute.summary["rank_token_spread"] < 0.02


def test_stats_of_an_output_without_the_section_weighs_for_the_default_model(
    runs: dict[str, Packed], tmp_path: Path
) -> None:
    manifest = dict(runs["plain"].manifest)
    del manifest["step_balance"]  # as written before it was recorded
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    for shard in manifest["shards"]:
        (tmp_path / shard["file"]).write_bytes((runs["plain"].out / shard["file"]).read_bytes())
    steps = packcli.stats(tmp_path).to_dict()["step_balance"]
    assert steps["model"] == "7b" and steps["k"] == model_shape("7b").k and steps["balance"] == "tokens"
    assert (
        steps["idle"]
        == steps["idle_tokens"]
        == pytest.approx(_idle(_costs(runs["plain"].rows, model_shape("7b").k)), abs=5e-7)
    )
    assert steps["idle_compute"] <= steps["idle"]
    shown = CliRunner().invoke(app, ["stats", str(tmp_path)]).stdout
    assert "idle at steps (tokens)" in shown and "model 7b" in shown


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--balance", "compute"],
            "Error: --balance weighs the steps of --world-size, which one rank does not have; "
            "pass --world-size N (the data-parallel ranks)",
        ),
        (
            ["--balance-model", "70b"],
            "Error: --balance-model weighs the steps of --world-size, which one rank does not have; "
            "pass --world-size N (the data-parallel ranks)",
        ),
        (
            ["--world-size", "2", "--balance-model", "7"],
            "Error: --balance-model takes a size (1b, 3b, 7b, 8b, 13b, 32b, 70b) or LAYERS,D_MODEL,PARAMS "
            "(e.g. 32,4096,7e9), not '7'",
        ),
    ],
    ids=["compute-one-rank", "model-one-rank", "model-unknown"],
)
def test_the_options_are_refused_before_any_work(argv: list[str], message: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b c"}])
    result = CliRunner().invoke(app, ["pack", str(data), "-o", str(tmp_path / "out"), "--no-cache", *argv])
    assert result.exit_code == 2
    assert one_error_line(result) == message
    assert not (tmp_path / "out").exists()
