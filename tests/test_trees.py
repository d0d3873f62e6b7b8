"""Prefix trees: the builder's properties against the expanded samples, and the attention rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import (
    IGNORE_INDEX,
    PREFIX_TREES,
    SHARD_SCHEMA,
    TREE_COLUMNS,
    file_sha256,
    shard_schema,
    tree_attention,
)
from packcli.errors import RecordError
from packcli.report.row_checks import Expected, ShardTotals, check_batch
from packcli.report.stats import output_stats
from packcli.tokenize.trees import build_tree, tree_paths

Sample = tuple[np.ndarray, np.ndarray]


def _sample(ids: list[int], mask: list[bool]) -> Sample:
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)


@st.composite
def free_samples(draw: st.DrawFn) -> list[Sample]:
    """Samples over a tiny vocabulary, so that they share prefixes often; any first token untrained."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 10))
        ids = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        mask = [False, *draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))]
        out.append(_sample(ids, mask))
    return out


@st.composite
def expansions(draw: st.DrawFn) -> list[Sample]:
    """What a per-round expansion makes: round j's sample is the shared prefix, the earlier rounds as
    history (untrained; a round's history may drop its reasoning) and round j's answer (trained)."""
    prefix = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
    rounds = draw(st.integers(1, 5))
    history: list[int] = []
    out = []
    for _ in range(rounds):
        question = draw(st.lists(st.integers(0, 50), min_size=0, max_size=4))
        answer = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
        reasoning = draw(st.lists(st.integers(0, 50), min_size=0, max_size=3))
        ids = [*prefix, *history, *question, *reasoning, *answer]
        mask = [False] * (len(prefix) + len(history) + len(question)) + [True] * (len(reasoning) + len(answer))
        out.append(_sample(ids, mask))
        history += [*question, *(answer if draw(st.booleans()) else reasoning + answer)]
    return out


def _check_tree(samples: list[Sample]) -> None:
    tree = build_tree(samples)
    paths = tree_paths(tree)
    # Every sample is one path, ids and mask alike, and every leaf is one sample's.
    assert len(paths) == len(samples)
    for (ids, mask), (path_ids, path_mask) in zip(samples, paths, strict=True):
        assert path_ids.tolist() == ids.tolist()
        assert path_mask.tolist() == mask.tolist()
    parents = tree.node_parents
    has_child = set(parents.tolist())
    assert sorted(tree.leaves.tolist()) == [n for n in range(len(parents)) if n not in has_child]
    assert len(set(tree.leaves.tolist())) == len(samples)
    # Each trained token once: the tree trains as many tokens as the samples together.
    assert int(tree.trained.sum()) == sum(int(m.sum()) for _, m in samples)
    assert len(tree) <= sum(len(i) for i, _ in samples)
    assert int(tree.node_lengths.sum()) == len(tree)
    starts = np.concatenate([[0], np.cumsum(tree.node_lengths)[:-1]])
    for node, (start, length, parent) in enumerate(zip(starts, tree.node_lengths, parents, strict=True)):
        assert -1 <= parent < node  # parents before children
        first = 0 if parent == -1 else int(tree.positions[starts[parent] + tree.node_lengths[parent] - 1]) + 1
        assert tree.positions[start : start + length].tolist() == list(range(first, first + length))
        if parent != -1:
            assert not tree.trained[start]
    # Depth first: a node's subtree is contiguous, so a node's parent is the nearest earlier node on its path.
    for node in range(1, len(parents)):
        p = int(parents[node])
        if p == -1:
            continue
        between = range(p + 1, node)
        assert all(_is_descendant(parents, m, p) for m in between)


def _is_descendant(parents: np.ndarray, node: int, ancestor: int) -> bool:
    while node != -1:
        if node == ancestor:
            return True
        node = int(parents[node])
    return False


@settings(max_examples=200, deadline=None)
@given(free_samples())
def test_any_samples_become_a_tree_whose_paths_are_the_samples(samples: list[Sample]) -> None:
    _check_tree(samples)


@settings(max_examples=200, deadline=None)
@given(expansions())
def test_per_round_expansions_become_a_tree_whose_paths_are_the_samples(samples: list[Sample]) -> None:
    _check_tree(samples)


def test_a_shared_history_is_stored_once() -> None:
    prefix, q1, a1, q2, a2 = [1, 2, 3], [4], [5, 6], [7], [8, 9]
    first = _sample(prefix + q1 + a1, [False] * 4 + [True] * 2)
    second = _sample(prefix + q1 + a1 + q2 + a2, [False] * 7 + [True] * 2)
    tree = build_tree([first, second])
    # The first round's answer is trained in the first sample and history in the second: not shared,
    # and both branches start with a copy of the question's last token (4), untrained.
    assert tree.ids.tolist() == [1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9]
    assert tree.trained.tolist() == [False] * 4 + [True] * 2 + [False] * 4 + [True] * 2
    assert tree.node_lengths.tolist() == [3, 3, 6]
    assert tree.node_parents.tolist() == [-1, 0, 0]
    assert tree.positions.tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]
    assert tree.leaves.tolist() == [1, 2]


def test_a_later_rounds_history_runs_on_through_the_earlier_rounds_branch() -> None:
    """Three rounds: round 3's path shares round 2's history branch, not only the prefix, so each round's
    history is stored once (the copy made for round 2 is what round 3 walks into)."""
    prefix, q, r, a = [1, 2, 3], ([10, 11], [20, 21], [30, 31]), ([12], [22], [32]), ([13, 14], [23, 24], [33, 34])
    samples = []
    history: list[int] = []
    for j in range(3):
        ids = prefix + history + q[j] + r[j] + a[j]
        samples.append(_sample(ids, [False] * (len(ids) - 3) + [True] * 3))
        history += q[j] + a[j]
    tree = build_tree(samples)
    assert [(ids.tolist(), m.tolist()) for ids, m in tree_paths(tree)] == [(i.tolist(), m.tolist()) for i, m in samples]
    # The prefix and the questions once, each round's trained part once, each history answer once, and one
    # copied token for each of the two branches that start where a trained token would.
    assert len(tree) == 3 + 6 + 9 + 2 * (1 + 2)
    chains = []
    for leaf in tree.leaves.tolist():
        depth, node = 0, leaf
        while node != -1:
            depth, node = depth + 1, int(tree.node_parents[node])
        chains.append(depth)
    assert chains == [2, 3, 3]  # round 3 hangs below round 2's history, not beside it under the prefix


def test_a_trained_token_is_never_shared_and_a_branch_starts_untrained() -> None:
    same = _sample([1, 2, 3], [False, True, True])
    tree = build_tree([same, same])
    assert tree.ids.tolist() == [1, 2, 3, 1, 2, 3]  # two roots: nothing untrained to share but the first token
    assert tree.node_parents.tolist() == [-1, -1]
    assert int(tree.trained.sum()) == 4


def test_a_sample_that_trains_its_first_token_is_refused() -> None:
    with pytest.raises(RecordError, match="trains its first token"):
        build_tree([_sample([1, 2], [False, True]), _sample([1, 2], [True, True])])
    with pytest.raises(RecordError, match="no samples"):
        build_tree([])


def _rule(node_lengths: list[int], node_parents: list[int]) -> np.ndarray:
    """The attention rule token by token, as the contract states it."""
    node_of = np.repeat(np.arange(len(node_lengths)), node_lengths)
    n = len(node_of)
    allowed = np.zeros((n, n), dtype=bool)
    for t in range(n):
        path = set()
        node = int(node_of[t])
        while node != -1:
            path.add(node)
            node = node_parents[node]
        for s in range(t + 1):
            allowed[t, s] = int(node_of[s]) in path
    return allowed


@settings(max_examples=100, deadline=None)
@given(st.lists(free_samples(), min_size=1, max_size=3))
def test_the_attention_rule_of_a_row_of_tree_samples(row: list[list[Sample]]) -> None:
    lengths: list[int] = []
    parents: list[int] = []
    sample_of: list[int] = []
    for k, samples in enumerate(row):
        tree = build_tree(samples)
        offset = len(lengths)
        lengths += tree.node_lengths.tolist()
        parents += [p + offset if p >= 0 else -1 for p in tree.node_parents.tolist()]
        sample_of += [k] * len(tree)
    allowed = tree_attention(lengths, parents)
    assert allowed.tolist() == _rule(lengths, parents).tolist()
    # Never across samples; always itself.
    same = np.equal.outer(sample_of, sample_of)
    assert not (allowed & ~same).any()
    assert allowed.diagonal().all()


def test_a_plain_sample_is_causal_and_bad_columns_are_refused() -> None:
    assert tree_attention([3], [-1]).tolist() == np.tri(3, dtype=bool).tolist()
    with pytest.raises(ValueError, match="earlier parent"):
        tree_attention([1, 1], [-1, 1])
    with pytest.raises(ValueError, match="positive length"):
        tree_attention([1, 0], [-1, 0])


def _tree_batch(rows: list[list[list[Sample]]]) -> pa.RecordBatch:
    """Shard rows of tree samples (each row a list of records' expansions), with the tree columns."""
    columns: dict[str, list[list[int]]] = {name: [] for name in (*SHARD_SCHEMA.names, *TREE_COLUMNS)}
    for r, records in enumerate(rows):
        row: dict[str, list[int]] = {name: [] for name in columns}
        for k, samples in enumerate(records):
            tree = build_tree(samples)
            offset = len(row["tree_node_lengths"])
            row["input_ids"] += tree.ids.tolist()
            row["labels"] += np.where(tree.trained, tree.ids, IGNORE_INDEX).tolist()
            row["position_ids"] += tree.positions.tolist()
            row["seq_lengths"].append(len(tree))
            row["sample_index"].append(10 * r + k)
            row["piece_index"].append(0)
            row["tree_node_lengths"] += tree.node_lengths.tolist()
            row["tree_node_parents"] += [p + offset if p >= 0 else -1 for p in tree.node_parents.tolist()]
        for name, values in row.items():
            columns[name].append(values)
    return pa.record_batch(list(columns.values()), schema=shard_schema(TREE_COLUMNS))


def _failures(batch: pa.RecordBatch) -> dict[str, list[int]]:
    totals = ShardTotals()
    check_batch(
        batch, 0, Expected(max_len=10_000, pad_to_max=False, vocab_size=None, columns=tuple(batch.schema.names)), totals
    )
    return totals.failures


def _with(batch: pa.RecordBatch, row: int, column: str, values: list[int]) -> pa.RecordBatch:
    data = batch.column(column).to_pylist()
    data[row] = values
    i = batch.schema.get_field_index(column)
    return batch.set_column(i, batch.schema.field(i), pa.array(data, type=batch.schema.field(i).type))


def test_verify_checks_that_tree_rows_follow_their_tree() -> None:
    prefix = [7, 8, 9]
    rounds = [
        _sample([*prefix, 1, 2, 3], [False] * 4 + [True] * 2),
        _sample([*prefix, 1, 3, 4, 5], [False] * 5 + [True] * 2),
    ]
    single = [_sample([4, 5, 6], [False, True, True])]
    batch = _tree_batch([[rounds, single], [single, rounds, rounds]])
    assert _failures(batch) == {}
    row = batch.to_pylist()[0]
    plain = list(range(row["seq_lengths"][0])) + list(range(row["seq_lengths"][1]))
    assert set(_failures(_with(batch, 0, "position_ids", plain))) == {"tree_positions"}
    lengths, parents = row["tree_node_lengths"], row["tree_node_parents"]
    # node 2 under node 1: a tree, but not the one the positions follow
    assert set(_failures(_with(batch, 0, "tree_node_parents", [-1, 0, 1, -1]))) == {"tree_positions"}
    assert set(_failures(_with(batch, 0, "tree_node_parents", [-1, 0, 2, -1]))) == {"tree_nodes"}  # not earlier
    assert set(_failures(_with(batch, 0, "tree_node_parents", [-1, 0, 0, 0]))) == {
        "tree_nodes"
    }  # another sample's node
    across = [*lengths[:2], lengths[2] + 1, lengths[3] - 1]  # a node across two samples
    assert set(_failures(_with(batch, 0, "tree_node_lengths", across))) == {"tree_nodes"}
    assert parents == [-1, 0, 0, -1]
    branch_start = lengths[0]
    labels = list(row["labels"])
    labels[branch_start] = row["input_ids"][branch_start]
    assert set(_failures(_with(batch, 0, "labels", labels))) == {"tree_first_label"}


def _write_output(directory: Path, batch: pa.RecordBatch, trees: bool = True) -> int:
    """Write the batch as a packed output (one shard, the manifest keys verify and stats read); return its tokens."""
    directory.mkdir(exist_ok=True)
    shard = directory / "shard-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_batches([batch]), shard)
    tokens = sum(len(ids) for ids in batch.column("input_ids").to_pylist())
    entry = {"file": shard.name, "rows": batch.num_rows, "tokens": tokens, "sha256": file_sha256(shard)}
    manifest = {"max_len": 128, "shards": [entry], "columns": batch.schema.names}
    (directory / "manifest.json").write_text(json.dumps({**manifest, PREFIX_TREES: trees}), encoding="utf-8")
    return tokens


def test_verify_reads_a_tree_output_and_the_manifest_key_with_it(tmp_path: Path) -> None:
    rounds = [_sample([7, 8, 9, 1, 2, 3], [False] * 4 + [True] * 2), _sample([7, 8, 9, 1, 3, 4], [False] * 5 + [True])]
    batch = _tree_batch([[rounds], [rounds, rounds]])
    _write_output(tmp_path / "good", batch)
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "good")])
    assert result.exit_code == 0 and "the row contract hold" in result.output, result.output
    _write_output(tmp_path / "unsaid", batch, trees=False)
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "unsaid")])
    assert result.exit_code == 1
    assert "has tree columns, but manifest.json does not say prefix_trees" in result.output
    plain = [list(range(n)) for n in batch.column("seq_lengths").to_pylist()[0]]
    _write_output(tmp_path / "flat", _with(batch, 0, "position_ids", [p for part in plain for p in part]))
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "flat")])
    assert result.exit_code == 1 and "position_ids that do not follow the tree" in result.output, result.output


def test_stats_report_the_tokens_a_tree_output_saves_against_the_expansion(tmp_path: Path) -> None:
    prefix = list(range(10, 30))
    rounds = [
        _sample([*prefix, 1, 2, 3], [False] * 21 + [True] * 2),
        _sample([*prefix, 1, 3, 4, 5, 6], [False] * 23 + [True] * 2),
        _sample([*prefix, 1, 3, 5, 6, 7, 8], [False] * 25 + [True] * 1),
    ]
    single = [_sample([4, 5, 6], [False, True, True])]
    batch = _tree_batch([[rounds, single], [rounds]])
    tokens = _write_output(tmp_path, batch)
    trees = output_stats(tmp_path)["prefix_trees"]
    expanded = 2 * sum(len(ids) for ids, _ in rounds) + 3
    assert trees == {
        "tokens": tokens,
        "expanded_tokens": expanded,
        "tokens_saved": expanded - tokens,
        "tokens_ratio": round(tokens / expanded, 6),
    }
    assert tokens < expanded
    result = CliRunner().invoke(app, ["stats", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"{tokens:,} tokens for {expanded:,} expanded" in result.output


def test_inspect_shows_each_branch_of_a_tree_sample(tmp_path: Path) -> None:
    rounds = [_sample([7, 8, 9, 1, 2, 3], [False] * 4 + [True] * 2), _sample([7, 8, 9, 1, 3, 4], [False] * 5 + [True])]
    _write_output(tmp_path, _tree_batch([[rounds, [_sample([4, 5], [False, True])]]]))
    result = CliRunner().invoke(app, ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    tree, plain = json.loads(result.stdout)["segments"]
    assert tree["nodes"] == [
        {"parent": -1, "start": 0, "length": 3, "position": 0},
        {"parent": 0, "start": 3, "length": 3, "position": 3},
        {"parent": 0, "start": 6, "length": 3, "position": 3},
    ]
    assert plain["nodes"] == [{"parent": -1, "start": 0, "length": 2, "position": 0}]
    assert [p["tokens"] for p in tree["pieces"]] == [3, 1, 2, 2, 1]  # no piece spans two nodes
    table = CliRunner().invoke(app, ["inspect", str(tmp_path)]).output
    assert "node 2 (branch of node 0): 3 tokens, positions 3..5" in table
