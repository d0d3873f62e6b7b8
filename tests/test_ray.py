"""--engine ray on a local Ray instance (2 CPUs): the same store, rows, shard bytes and errors as the default engine."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from typer.testing import CliRunner

from packcli import ingest, write
from packcli import plan as plan_stage
from packcli.cache import load_store
from packcli.cli import app
from packcli.config import PackConfig
from packcli.errors import OutputError, UsageError
from packcli.shards import file_sha256

from .conftest import make_conversations, write_jsonl

# Small raw batches, cut smaller still for the actors: many batches, spread over both tokenizer actors.
BATCH, RAY_BATCH = 32, 10


@pytest.fixture(scope="module")
def local_ray() -> Any:
    if ray.is_initialized():
        ray.shutdown()
    ray.init("local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from packcli.engines import ray_engine

    monkeypatch.setattr(ingest, "BATCH_SIZE", BATCH)
    monkeypatch.setattr(ray_engine, "RAY_BATCH_RECORDS", RAY_BATCH)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat records in four inputs (JSON lines, Parquet, a JSON array): a bad line, a blank line, a too-long
    record, and a JSON array cut off in its last record."""
    directory = tmp_path_factory.mktemp("corpus")
    chats = [{"messages": m} for m in make_conversations(300, seed=11, max_turns=3, max_words=30)]
    lines = [json.dumps(r, ensure_ascii=False) for r in chats[:130]]
    lines.insert(57, '{"messages": [{"role": "user", "content": "cut off"}')  # invalid JSON: line 58
    lines.insert(90, "")  # a blank line is not a record
    (directory / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    long_answer = " ".join(["packing rows of tokens"] * 300)
    too_long = {"messages": [{"role": "user", "content": "long?"}, {"role": "assistant", "content": long_answer}]}
    write_jsonl(directory / "b.jsonl", [*chats[130:200], too_long, *chats[200:240]])
    pq.write_table(pa.Table.from_pylist(chats[240:]), directory / "c.parquet")
    whole = json.dumps(chats[:26], ensure_ascii=False)
    (directory / "d.json").write_text(whole[: whole.rindex('{"messages"') + 30], encoding="utf-8")  # cut off
    return directory


def run_pack(*args: Any, cache: Path | None = None, expect: int | None = 0) -> Any:
    # The cache directory comes from the environment, so that it is not an option in the manifest.
    argv = ["pack", *map(str, args), "--num-proc", "1", *([] if cache else ["--no-cache"])]
    result = CliRunner().invoke(app, argv, env={"PACKCLI_CACHE": str(cache or "")})
    if expect is not None:
        assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
    return result


def store_in(cache: Path) -> Path:
    [entry] = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    return entry


def assert_same_shards(a: Path, b: Path) -> list[str]:
    names = sorted(p.name for p in a.iterdir() if p.name.startswith("shard-"))
    assert names and names == sorted(p.name for p in b.iterdir() if p.name.startswith("shard-"))
    for name in names:
        assert file_sha256(a / name) == file_sha256(b / name), name
    return names


def test_ray_engine_writes_what_the_local_engine_writes(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    outputs, stores = {}, {}
    # The same output and rejects paths for both engines (they are options in the manifest), moved aside.
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    flags = ["--max-len", "512", "--rows-per-shard", "7", "--on-error", "skip", "--rejects", rejects, "--json", "-q"]
    for engine in ("local", "ray"):
        cache = tmp_path / f"cache-{engine}"
        summary = json.loads(run_pack(corpus, "-o", out, *flags, "--engine", engine, cache=cache).stdout)
        assert summary["cache"] == "miss"
        shutil.move(rejects, tmp_path / f"rejects-{engine}.jsonl")
        shutil.move(out, tmp_path / engine)
        outputs[engine], stores[engine] = (tmp_path / engine, summary), store_in(cache)

    (local, local_summary), (remote, remote_summary) = outputs["local"], outputs["ray"]
    assert local_summary["records_read"] == 328
    assert local_summary["dropped"] == {"invalid_json": 1, "too_long": 1, "truncated_file": 1}
    names = assert_same_shards(local, remote)
    assert len(names) > 3  # several writer tasks
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (local, remote)]
    assert manifests[1]["options"].pop("engine") == "ray" and manifests[0]["options"].pop("engine") == "local"
    assert manifests[0]["options"] == manifests[1]["options"]
    assert manifests[0] == manifests[1]
    assert (tmp_path / "rejects-local.jsonl").read_text() == (tmp_path / "rejects-ray.jsonl").read_text()
    for key in ("records_read", "packed", "dropped", "tokens", "trainable_tokens", "rows", "fill"):
        assert local_summary[key] == remote_summary[key]

    # The token stores: same arrays, token files, rejects and metadata.
    a, b = load_store(stores["local"]), load_store(stores["ray"])
    for name in ("sample_index", "lengths", "trainable", "first_trained", "positions"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert getattr(a, name).dtype == getattr(b, name).dtype
    assert a.meta == b.meta
    assert a.meta["source_starts"] == [0, 131, 242, 302]
    for name in ("input_ids.bin", "labels.bin", "rejects.jsonl"):
        assert (stores["local"] / name).read_bytes() == (stores["ray"] / name).read_bytes(), name


def test_split_pieces_are_cut_on_ray_as_locally(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    """--overflow split: the tokenizer actors cut the same pieces as the local workers."""
    flags = ["--max-len", "128", "--overflow", "split", "--on-error", "skip", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags).stdout)
    remote = json.loads(run_pack(corpus, "-o", tmp_path / "ray", *flags, "--engine", "ray").stdout)
    assert local["split"]["records_split"] > 10 and local["split"] == remote["split"]
    assert_same_shards(tmp_path / "local", tmp_path / "ray")


def test_ray_writer_tasks_on_a_cached_store(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    """Arrow shards, padding, truncation and rank padding: only the writing runs on Ray (cache hit)."""
    cache = tmp_path / "cache"
    flags = ["--max-len", "256", "--overflow", "truncate", "--pad-to-max", "--output-format", "arrow"]
    flags += ["--world-size", "3", "--rank-remainder", "pad", "--seed", "5", "--rows-per-shard", "40", "--on-error"]
    flags += ["skip", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags, cache=cache).stdout)
    remote = json.loads(run_pack(corpus, "-o", tmp_path / "ray", *flags, "--engine", "ray", cache=cache).stdout)
    assert (local["cache"], remote["cache"]) == ("miss", "hit")
    assert local["truncated"] > 0 and local["duplicated"] > 0
    assert_same_shards(tmp_path / "local", tmp_path / "ray")


def test_bad_record_fails_with_the_same_message(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    results = [
        run_pack(corpus, "-o", tmp_path / engine, "--max-len", "512", "--engine", engine, "-q", expect=None)
        for engine in ("local", "ray")
    ]
    assert [r.exit_code for r in results] == [1, 1]
    assert results[0].stderr == results[1].stderr
    assert results[0].stderr.startswith(f"Error: {corpus / 'a.jsonl'} line 58: invalid JSON")
    assert not (tmp_path / "ray").exists() and not list(tmp_path.glob(".ray.partial-*"))
    # Nothing is left running: the tokenizer actors stop (asynchronously) and give both CPUs back.
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2


def test_shards_to_a_filesystem_uri(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    from packcli.engines import ray_engine

    cache = tmp_path / "cache"
    run_pack(
        corpus,
        "-o",
        tmp_path / "local",
        "--max-len",
        "512",
        "--rows-per-shard",
        "9",
        "--on-error",
        "skip",
        "-q",
        cache=cache,
    )
    store = load_store(store_in(cache))
    uri = (tmp_path / "remote").as_uri()  # file://...: the pyarrow filesystem path, as for s3:// or gs://
    config = PackConfig(inputs=(str(corpus),), output=uri, max_len=512, rows_per_shard=9, on_error="skip", engine="ray")
    plan = plan_stage.make_plan(config, store)
    ray_engine.check_uri_output(uri, overwrite=False)
    entries = ray_engine.write_output(config, store, plan, tmp_path / "unused", lambda *a: None, 0)
    local_manifest = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert entries == local_manifest["shards"]
    assert not (tmp_path / "remote" / "manifest.json").exists()  # the caller writes it last
    ray_engine.write_manifest_uri(uri, {"shards": entries})
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    assert json.loads((tmp_path / "remote" / "manifest.json").read_text()) == {"shards": entries}
    with pytest.raises(UsageError, match="not empty"):
        ray_engine.check_uri_output(uri, overwrite=False)
    ray_engine.check_uri_output(uri, overwrite=True)  # an overwrite first removes the completeness marker
    assert not (tmp_path / "remote" / "manifest.json").exists()

    # A shard that cannot be written: the default engine's error message.
    config = PackConfig(inputs=(str(corpus),), output=str(tmp_path / "out"), max_len=512, on_error="skip")
    errors = []
    for engine in (write, ray_engine):
        with pytest.raises(OutputError) as caught:
            engine.write_output(config, store, plan, tmp_path / "missing", lambda *a: None, 0)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "cannot write a shard" in errors[0]


def test_cli_output_to_a_filesystem_uri(local_ray: Any, corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    flags = ["--max-len", "512", "--rows-per-shard", "9", "--on-error", "skip", "-q"]
    run_pack(corpus, "-o", tmp_path / "local", *flags, cache=cache)
    uri = (tmp_path / "remote").as_uri()
    run_pack(corpus, "-o", uri, *flags, "--engine", "ray", cache=cache)
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    manifests = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("local", "remote")]
    assert manifests[0]["shards"] == manifests[1]["shards"]
    result = run_pack(corpus, "-o", uri, *flags, cache=cache, expect=2)
    assert result.stderr.startswith(f"Error: -o {uri}: a filesystem URI output needs --engine ray")


def test_without_ray_the_engine_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, corpus: Path, tmp_path: Path
) -> None:
    import packcli.engines

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.delitem(sys.modules, "packcli.engines.ray_engine", raising=False)
    monkeypatch.delattr(packcli.engines, "ray_engine", raising=False)
    result = run_pack(corpus, "-o", tmp_path / "out", "--engine", "ray", "--on-error", "skip", expect=2)
    assert "pip install 'packcli[ray]'" in result.stderr
