"""pack --expand-turns --prefix-tree: a record's rounds as one tree sample, end to end.

Every root-to-leaf path of the written trees is, token for token and label for label, the sample the
plain expansion writes for that round; the rows carry the tree columns, the manifest says so, verify
and verify --reencode hold, and what cannot keep a tree whole is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import IGNORE_INDEX, tree_attention
from packcli.store.nodes import TreeNodes

from .conftest import one_error_line, read_rows, trl_templates, write_jsonl

SYSTEM = "You are a careful assistant with a tide table tool. " * 6


def _trace(k: int, rounds: int = 3) -> list[dict[str, Any]]:
    """A conversation of ``rounds`` rounds, the first a tool call and its result, each with reasoning."""
    call = {"type": "function", "function": {"name": "search_notes", "arguments": {"query": f"tides {k}"}}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Use search_notes to find the tides ({k})."},
        {"role": "assistant", "content": "", "reasoning_content": "I need the tide table.", "tool_calls": [call]},
        {"role": "tool", "content": f"TOOL OUTPUT: high tide at {k % 12}."},
        {"role": "assistant", "content": f"High tide is at {k % 12}.", "reasoning_content": "The tool says so."},
    ]
    for r in range(1, rounds):
        messages += [
            {"role": "user", "content": f"And round {r}, please ({k})?"},
            {"role": "assistant", "content": f"Answer {r} for {k}.", "reasoning_content": f"Thinking {r} of {k}."},
        ]
    return messages


def _samples(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Each sample of an output's rows by (sample_index, piece_index): its ids, labels, positions and nodes."""
    found = {}
    for row in read_rows(out):
        start, node = 0, 0
        lengths = row.get("tree_node_lengths")
        for length, index, piece in zip(row["seq_lengths"], row["sample_index"], row["piece_index"], strict=True):
            sample = {k: row[k][start : start + length] for k in ("input_ids", "labels", "position_ids")}
            if lengths is not None:
                first, covered = node, 0
                while covered < length:
                    covered += lengths[node]
                    node += 1
                assert covered == length  # the nodes tile the sample
                parents = row["tree_node_parents"][first:node]
                sample["nodes"] = (lengths[first:node], [p - first if p >= 0 else -1 for p in parents])
            found[(index, piece)] = sample
            start += length
    return found


def _paths(sample: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """The ids and labels along each root-to-leaf path of a tree sample, leaves in row order."""
    lengths, parents = sample["nodes"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    children = {p for p in parents if p >= 0}
    paths = []
    for leaf in (n for n in range(len(lengths)) if n not in children):
        chain, node = [], leaf
        while node != -1:
            chain.append(node)
            node = parents[node]
        index = [i for n in reversed(chain) for i in range(starts[n], starts[n + 1])]
        paths.append(([sample["input_ids"][i] for i in index], [sample["labels"][i] for i in index]))
    return paths


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Five-round and two-round traces with Qwen3's template, packed as trees and as the plain expansion."""
    base = tmp_path_factory.mktemp("trees")
    data = write_jsonl(base / "trace.jsonl", [{"messages": _trace(k, rounds=2 + k % 4)} for k in range(12)])
    argv = ["pack", str(data), "--max-len", "4096", "--chat-template", str(trl_templates() / "qwen3.jinja")]
    argv += ["--expand-turns", "reasoning", "--json", "-q", "--num-proc", "1", "--cache-dir", str(base / "cache")]
    made: dict[str, Any] = {"data": data, "argv": argv}
    for name, extra in (("plain", []), ("trees", ["--prefix-tree"])):
        result = CliRunner().invoke(app, [*argv, "-o", str(base / name), *extra])
        assert result.exit_code == 0, (result.stdout, result.stderr)
        made[name] = base / name
        made[name + "_summary"] = json.loads(result.stdout)
    return made


def test_every_path_of_a_tree_is_its_rounds_sample(outputs: dict[str, Any]) -> None:
    plain, trees = _samples(outputs["plain"]), _samples(outputs["trees"])
    assert sorted({index for index, _ in plain}) == sorted(index for index, _ in trees) == list(range(12))
    assert all(piece == 0 for _, piece in trees)  # each record one tree: it fits --max-len
    for (index, _), sample in trees.items():
        rounds = [plain[(index, r)] for r in range(2 + index % 4)]
        paths = _paths(sample)
        assert paths == [(r["input_ids"], r["labels"]) for r in rounds]
        # Positions: each token's depth, so a path's positions are its round sample's 0..n-1.
        lengths, parents = sample["nodes"]
        depth = np.asarray(sample["position_ids"])
        starts = np.concatenate([[0], np.cumsum(lengths)])
        for node, parent in enumerate(parents):
            want = 0 if parent < 0 else depth[starts[parent + 1] - 1] + 1
            assert depth[starts[node]] == want
            assert sample["labels"][starts[node]] == IGNORE_INDEX  # a node never trains its first token
        # Each trained token is trained once: the tree trains what the rounds train, summed.
        trained = sum(t != IGNORE_INDEX for t in sample["labels"])
        assert trained == sum(t != IGNORE_INDEX for r in rounds for t in r["labels"])
        assert len(sample["input_ids"]) < sum(len(r["input_ids"]) for r in rounds)


def test_the_summary_counts_the_trees_and_the_manifest_says_trees(outputs: dict[str, Any]) -> None:
    plain, trees = outputs["plain_summary"], outputs["trees_summary"]
    rounds = sum(2 + k % 4 for k in range(12))
    assert plain["samples"] == rounds and plain.get("trees") is None
    assert trees["trees"] == {
        "records": 12,
        "trees": 12,
        "samples": rounds,
        "tokens": trees["tokens"],
        "expansion_tokens": plain["tokens"],
    }
    assert trees["samples"] == 12 and trees["trainable_tokens"] == plain["trainable_tokens"]
    assert trees["tokens"] < 0.75 * plain["tokens"]
    manifest = json.loads((outputs["trees"] / "manifest.json").read_text())
    assert manifest["prefix_trees"] is True and manifest["trees"] == trees["trees"]
    assert manifest["columns"][-2:] == ["tree_node_lengths", "tree_node_parents"]
    assert "prefix_trees" not in json.loads((outputs["plain"] / "manifest.json").read_text())


def test_verify_and_reencode_hold_and_stats_counts_the_saving(outputs: dict[str, Any]) -> None:
    runner = CliRunner()
    for name in ("trees", "plain"):  # the plain expansion re-encoded by round too
        result = runner.invoke(app, ["verify", str(outputs[name]), "--reencode", "100"])
        assert result.exit_code == 0, result.stdout
        assert "the same" in result.stdout
    stats = json.loads(runner.invoke(app, ["stats", str(outputs["trees"]), "--json"]).stdout)
    assert stats["prefix_trees"]["expanded_tokens"] == outputs["plain_summary"]["tokens"]
    assert stats["prefix_trees"]["tokens"] == outputs["trees_summary"]["tokens"]


def test_a_record_whose_tree_is_too_long_grows_several(tmp_path: Path, pack: Any, outputs: dict[str, Any]) -> None:
    """At a --max-len below a whole tree, a record's rounds grow trees in order, each within --max-len."""
    plain = _samples(outputs["plain"])
    record = 3  # five rounds
    lengths = [len(plain[(record, r)]["input_ids"]) for r in range(5)]
    max_len = max(lengths) + 40
    data = write_jsonl(tmp_path / "one.jsonl", [{"messages": _trace(record, rounds=5)}])
    argv = ["--chat-template", trl_templates() / "qwen3.jinja", "--expand-turns", "reasoning", "--prefix-tree"]
    summary = json.loads(pack(data, "--max-len", max_len, *argv, "-o", tmp_path / "out", "--json", "-q").stdout)
    trees = _samples(tmp_path / "out")
    assert 1 < len(trees) == summary["trees"]["trees"] and summary["dropped"] == {}
    assert sorted(trees) == [(0, p) for p in range(len(trees))]
    paths = [path for p in range(len(trees)) for path in _paths(trees[(0, p)])]
    assert paths == [(plain[(record, r)]["input_ids"], plain[(record, r)]["labels"]) for r in range(5)]
    assert all(len(t["input_ids"]) <= max_len for t in trees.values())


def test_with_pad_to_max_the_padding_is_a_root_node(tmp_path: Path, pack: Any, outputs: dict[str, Any]) -> None:
    argv = ["--chat-template", trl_templates() / "qwen3.jinja", "--expand-turns", "reasoning", "--prefix-tree"]
    pack(outputs["data"], "--max-len", 4096, *argv, "--pad-to-max", "-o", tmp_path / "out", "-q")
    for row in read_rows(tmp_path / "out"):
        assert len(row["input_ids"]) == 4096 and row["sample_index"][-1] == -1
        assert row["tree_node_lengths"][-1] == row["seq_lengths"][-1] and row["tree_node_parents"][-1] == -1
        assert sum(row["tree_node_lengths"]) == 4096
        allowed = tree_attention(np.asarray(row["tree_node_lengths"]), np.asarray(row["tree_node_parents"]))
        assert not allowed[-1, : 4096 - row["seq_lengths"][-1]].any()  # padding sees no sample
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "out")]).exit_code == 0


def test_what_cannot_keep_a_tree_whole_is_refused(tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "t.jsonl", [{"messages": _trace(0)}])
    out = ["-o", tmp_path / "o"]
    line = one_error_line(pack(data, "--prefix-tree", *out, expect=2))
    assert line == (
        "Error: --prefix-tree needs --expand-turns (the tree's branches are a record's rounds); "
        "pass --expand-turns reasoning or all"
    )
    tree = ["--expand-turns", "all", "--prefix-tree"]
    for flags, words in (
        (["--pad-to-multiple-of", "8"], "--pad-to-multiple-of above 1 (a tree's padding would be no node of it)"),
        (["--loss-weighting", "sample"], "--loss-weighting sample (a tree holds several samples' trained tokens)"),
        (["--output-format", "megatron"], "--output-format megatron (its rows carry no tree columns)"),
        (["--overflow", "truncate"], "--overflow truncate (a tree is never cut)"),
    ):
        line = one_error_line(pack(data, *tree, *flags, *out, expect=2))
        assert line == f"Error: --prefix-tree cannot be used with {words}"


def test_the_cache_keeps_trees_apart_from_plain_rounds_and_by_max_len(tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "t.jsonl", [{"messages": _trace(k, rounds=4)} for k in range(3)])
    argv = [data, "--chat-template", trl_templates() / "qwen3.jinja", "--expand-turns", "reasoning", "--json", "-q"]
    first = json.loads(pack(*argv, "--max-len", 4096, "--prefix-tree", "-o", tmp_path / "a").stdout)
    plain = json.loads(pack(*argv, "--max-len", 4096, "-o", tmp_path / "b").stdout)
    again = json.loads(pack(*argv, "--max-len", 4096, "--prefix-tree", "-o", tmp_path / "c").stdout)
    assert (first["cache"], plain["cache"], again["cache"]) == ("miss", "miss", "hit")
    assert first["samples"] == 3 and plain["samples"] == 12
    # A --max-len that every round fits but no whole tree does: each record grows several trees.
    longest_round = max(max(row["seq_lengths"]) for row in read_rows(tmp_path / "b"))
    assert longest_round < first["tokens"] // 3
    shorter = json.loads(pack(*argv, "--max-len", longest_round, "--prefix-tree", "-o", tmp_path / "d").stdout)
    assert shorter["cache"] == "miss" and shorter["trees"]["trees"] > 3


def test_library_pack_writes_the_same_trees(tmp_path: Path, outputs: dict[str, Any]) -> None:
    import packcli

    summary = packcli.pack(
        outputs["data"],
        max_len=4096,
        chat_template=trl_templates() / "qwen3.jinja",
        expand_turns="reasoning",
        prefix_tree=True,
        output=tmp_path / "out",
        num_proc=1,
        cache=False,
    )
    assert summary.summary.trees == outputs["trees_summary"]["trees"]
    assert _samples(tmp_path / "out") == _samples(outputs["trees"])


def test_tree_nodes_positions_and_row_parents() -> None:
    # Two samples: a tree (root 3 tokens, branches of 2 and 4 tokens), then a plain sample of 5.
    nodes = TreeNodes.of([(np.array([3, 2, 4]), np.array([-1, 0, 0])), None], np.array([9, 5]))
    assert nodes.counts.tolist() == [3, 1] and nodes.lengths.tolist() == [3, 2, 4, 5]
    assert nodes.positions().tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    assert nodes.row_parents(np.array([2])).tolist() == [-1, 0, 0, -1]
    flipped = nodes.select(np.array([1, 0]))
    assert flipped.lengths.tolist() == [5, 3, 2, 4]
    assert flipped.row_parents(np.array([2])).tolist() == [-1, -1, 1, 1]
    assert flipped.row_parents(np.array([1, 1])).tolist() == [-1, -1, 0, 0]


def test_trees_survive_the_eval_split_dedup_and_a_mix(tmp_path: Path, pack: Any, outputs: dict[str, Any]) -> None:
    """The eval split, --dedup exact and --mix pick samples through views of the store: each keeps its nodes."""
    records = [{"messages": _trace(k, rounds=2 + k % 4)} for k in range(12)]
    data = write_jsonl(tmp_path / "t.jsonl", records + records[:3])  # three repeats for --dedup exact
    other = write_jsonl(tmp_path / "o.jsonl", [{"messages": _trace(k, rounds=3)} for k in range(20, 26)])
    tree = ["--chat-template", trl_templates() / "qwen3.jinja", "--expand-turns", "reasoning", "--prefix-tree"]
    split = ["--dedup", "exact", "--eval-fraction", 0.25]
    summary = json.loads(pack(data, "--max-len", 4096, *tree, *split, "-o", tmp_path / "a", "--json").stdout)
    assert summary["dropped"] == {"duplicate": 3}
    whole = _samples(outputs["trees"])
    train, held = _samples(tmp_path / "a"), _samples(tmp_path / "a" / "eval")
    assert held and sorted([*train, *held]) == sorted(whole)
    for key, sample in [*train.items(), *held.items()]:
        assert sample == whole[key]  # ids, labels, positions and nodes, in the eval rows too
    mixed = ["--mix", f"{data}=0.5", "--mix", f"{other}=0.5", "--mix-by", "records"]
    pack(*mixed, "--max-len", 4096, *tree, "-o", tmp_path / "m", "-q")
    runner = CliRunner()
    for out in (tmp_path / "a", tmp_path / "a" / "eval", tmp_path / "m"):
        assert runner.invoke(app, ["verify", str(out)]).exit_code == 0, out
    assert all(len(s["nodes"][0]) > 1 for s in _samples(tmp_path / "m").values())
