"""--engine ray on a simulated cluster of two Ray nodes (one CPU each) on this machine: the same store, rows,
shard bytes, rejects and errors as the default engine, while the driver receives a few bytes per sample."""

from __future__ import annotations

import gzip
import json
import os
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
from ray.cluster_utils import Cluster
from typer.testing import CliRunner

import packcli
from packcli.cli import app
from packcli.config import PackConfig
from packcli.contract import file_sha256
from packcli.errors import OutputError, UsageError
from packcli.plan import planner as plan_stage
from packcli.results import Manifest
from packcli.store.tokens import load_store
from packcli.tokenize.batches import ingest

from .conftest import make_conversations, write_jsonl

# Small raw batches and small parts: many parts, spread over the two nodes' tokenizer actors.
BATCH, PART_BYTES = 32, 6000
# What the driver may receive per kept sample (20 bytes of metadata, 24 with split pieces, and the
# pickling around them), per part (its counts, checksums and seconds) and per shard (its manifest entry).
BYTES_PER_SAMPLE, BYTES_PER_PART, BYTES_PER_SHARD = 24, 2048, 1024


@pytest.fixture(scope="module")
def cluster() -> Any:
    """Two Ray nodes with one CPU each (a head and a worker node, each its own raylet and object store)."""
    if ray.is_initialized():
        ray.shutdown()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 << 20})
    nodes.add_node(num_cpus=1, object_store_memory=100 << 20)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import packcli.engines.ray.parts as ray_parts

    monkeypatch.setattr(ingest, "BATCH_SIZE", BATCH)
    monkeypatch.setattr(ray_parts, "PART_BYTES", PART_BYTES)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat records in five inputs (JSON lines cut into byte ranges, Parquet in row groups, a JSON array and
    gzipped JSON lines read whole): a bad line, a blank line, a byte order mark, a too-long record, and a
    JSON array cut off in its last record."""
    directory = tmp_path_factory.mktemp("corpus")
    chats = [{"messages": m} for m in make_conversations(300, seed=11, max_turns=3, max_words=30)]
    lines = [json.dumps(r, ensure_ascii=False) for r in chats[:130]]
    lines.insert(57, '{"messages": [{"role": "user", "content": "cut off"}')  # invalid JSON: line 58
    lines.insert(90, "")  # a blank line is not a record
    (directory / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    long_answer = " ".join(["packing rows of tokens"] * 300)
    too_long = {"messages": [{"role": "user", "content": "long?"}, {"role": "assistant", "content": long_answer}]}
    write_jsonl(directory / "b.jsonl", [*chats[130:200], too_long, *chats[200:240]])
    (directory / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + (directory / "b.jsonl").read_bytes())
    pq.write_table(pa.Table.from_pylist(chats[240:]), directory / "c.parquet", row_group_size=15)
    whole = json.dumps(chats[:26], ensure_ascii=False)
    (directory / "d.json").write_text(whole[: whole.rindex('{"messages"') + 30], encoding="utf-8")  # cut off
    with gzip.open(directory / "e.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in chats[26:38])
    return directory


def run_pack(*args: Any, cache: Path | None = None, expect: int | None = 0) -> Any:
    # The cache directory comes from the environment, so that it is not an option in the manifest.
    argv = ["pack", *map(str, args), "--num-proc", "1", *([] if cache else ["--no-cache"])]
    result = CliRunner().invoke(app, argv, env={"PACKCLI_CACHE": str(cache or "")})
    if expect is not None:
        assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
    return result


def run_with(engine: Any, *inputs: Any, cache_env: Path | None = None, **options: Any) -> dict[str, Any]:
    """Run a pack through the library with the engine given, whose figures the test then reads."""
    from packcli.run.pipeline import run_pack as pack_run

    config = PackConfig(inputs=tuple(map(str, inputs)), engine="ray", num_proc=1, **options)
    with pytest.MonkeyPatch.context() as patch:
        if cache_env is not None:
            patch.setenv("PACKCLI_CACHE", str(cache_env))  # not an option in the manifest, as with run_pack
        return pack_run(config, engine=engine)


def store_in(cache: Path) -> Path:
    """The run's entry in the cache (a local run's cache parts, made beside it, are not it)."""
    metas = {p: p / "meta.json" for p in cache.iterdir() if (p / "meta.json").is_file()}
    [entry] = [p for p, meta in metas.items() if "part" not in json.loads(meta.read_text())]
    return entry


def a_token_file(entry: Path) -> str:
    """The input ids file of an entry's first segment, relative to the entry."""
    prefix = json.loads((entry / "meta.json").read_text())["segments"][0]["prefix"]
    return f"{prefix}input_ids.bin"


def assert_same_shards(a: Path, b: Path) -> list[str]:
    names = sorted(p.name for p in a.iterdir() if p.name.startswith("shard-"))
    assert names and names == sorted(p.name for p in b.iterdir() if p.name.startswith("shard-"))
    for name in names:
        assert file_sha256(a / name) == file_sha256(b / name), name
    return names


def test_ray_engine_writes_what_the_local_engine_writes(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    from packcli.engines.ray.engine import RayEngine
    from packcli.io import fingerprint, readers

    outputs, stores = {}, {}
    # The same output and rejects paths for both engines (they are options in the manifest), moved aside.
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    flags = ["--max-len", "512", "--rows-per-shard", "7", "--on-error", "skip", "--rejects", rejects, "--json", "-q"]
    ray_engine = RayEngine()  # made here to read its figures after the run
    for engine in ("local", "ray"):
        cache = tmp_path / f"cache-{engine}"
        with pytest.MonkeyPatch.context() as patch:
            if engine == "ray":  # the driver neither hashes nor counts the inputs: tasks do, where they are
                for module, name in (
                    (fingerprint, "file_blake2b"),
                    (readers, "count_records"),
                    (ingest, "count_records"),
                ):
                    patch.setattr(module, name, lambda *a: pytest.fail("the driver read a whole input"))
                options = {"max_len": 512, "rows_per_shard": 7, "on_error": "skip", "rejects": str(rejects)}
                summary = run_with(ray_engine, corpus, output=str(out), cache_env=cache, **options)
            else:
                summary = json.loads(run_pack(corpus, "-o", out, *flags, "--engine", engine, cache=cache).stdout)
        assert summary["cache"] == "miss"
        shutil.move(rejects, tmp_path / f"rejects-{engine}.jsonl")
        shutil.move(out, tmp_path / engine)
        outputs[engine], stores[engine] = (tmp_path / engine, summary), store_in(cache)

    (local, local_summary), (remote, remote_summary) = outputs["local"], outputs["ray"]
    assert local_summary["records_read"] == 340
    assert local_summary["dropped"] == {"invalid_json": 1, "too_long": 1, "truncated_file": 1}
    names = assert_same_shards(local, remote)
    assert len(names) > 3  # several writer tasks
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (local, remote)]
    assert manifests[1]["options"].pop("engine") == "ray" and manifests[0]["options"].pop("engine") == "local"
    assert manifests[0]["options"] == manifests[1]["options"]
    assert manifests[0] == manifests[1]
    rejected = (tmp_path / "rejects-local.jsonl").read_text()
    assert rejected == (tmp_path / "rejects-ray.jsonl").read_text()
    assert f'"source": "{corpus / "a.jsonl"}", "position": 58' in rejected  # a line number from a byte range
    for key in ("records_read", "packed", "dropped", "tokens", "trainable_tokens", "rows", "fill"):
        assert local_summary[key] == remote_summary[key]

    # The parts ran on both nodes, and the driver received metadata, not tokens.
    run = ray_engine.last_run
    assert len(run["nodes"]) == 2 and run["parts"] > 10
    samples, tokens = len(load_store(stores["ray"]).lengths), local_summary["tokens"]
    allowed = BYTES_PER_SAMPLE * samples + BYTES_PER_PART * run["parts"] + BYTES_PER_SHARD * len(names)
    allowed += len(rejected.encode())  # the records rejected by the workers come with their text
    assert ray_engine.received["bytes"] <= allowed
    assert ray_engine.received["bytes"] < tokens  # the old design received 8 bytes a token

    # The token stores: same arrays, tokens, rejects and metadata; Ray's tokens are one segment a part.
    a, b = load_store(stores["local"]), load_store(stores["ray"])
    for name in ("sample_index", "piece_index", "lengths", "trainable", "first_trained", "positions"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert getattr(a, name).dtype == getattr(b, name).dtype
    # the local store: a segment per cache part (packcli.store.parts), linked from the parts
    assert all(seg["prefix"].startswith("segments/part") for seg in a.meta.segments)
    assert len(b.meta.segments) > 10
    segments = ("segments", "files", "meta_sha256", "made")  # made: when, by which packcli
    assert {k: v for k, v in a.meta.to_dict().items() if k not in segments} == {
        k: v for k, v in b.meta.to_dict().items() if k not in segments
    }
    assert a.meta.source_starts == [0, 131, 242, 302, 328]
    with a.open_tokens() as ra, b.open_tokens() as rb:
        for got, expected in zip(ra.gather(a.starts, a.lengths), rb.gather(b.starts, b.lengths), strict=True):
            assert np.array_equal(got, expected)
    assert (stores["local"] / "rejects.jsonl").read_bytes() == (stores["ray"] / "rejects.jsonl").read_bytes()

    # Either engine uses the other's cache entry.
    again = run_pack(corpus, "-o", tmp_path / "local-again", *flags, cache=tmp_path / "cache-ray")
    assert json.loads(again.stdout)["cache"] == "hit"
    assert_same_shards(local, tmp_path / "local-again")


def test_ray_parts_are_cache_parts(cluster: Any, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Ray part is a cache part: a run stopped after two parts resumes from them, an added input is
    the only one tokenized, and the shards and rejects are those of a run without the cache."""
    from packcli.engines.ray import cached

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("a.jsonl", "c.parquet", "b.jsonl"):
        shutil.copy(corpus / name, inputs / name)
    a, b, c = (inputs / n for n in ("a.jsonl", "b.jsonl", "c.parquet"))
    cache = tmp_path / "cache"
    flags = ["--max-len", "512", "--on-error", "skip", "--json", "-q", "--engine", "ray"]

    def pack(out: str, *data: Path, use: Path | None = cache, expect: int | None = 0) -> Any:
        rejects = ["--rejects", tmp_path / f"{out}.rejects"]
        return run_pack(*data, "-o", tmp_path / out, *flags, *rejects, cache=use, expect=expect)

    # Stopped as the third part is committed: two are kept (a.jsonl's first two byte ranges).
    finish, commits = cached.StoreBuilder.finish, []

    def stop_at_third(self: Any, *args: Any, **kwargs: Any) -> Any:
        commits.append(1)
        if len(commits) == 3:
            raise KeyboardInterrupt
        return finish(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cached.StoreBuilder, "finish", stop_at_third)
        stopped = pack("stopped", a, c, expect=None)
    assert stopped.exit_code != 0 and len(commits) == 3
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]  # the parts in flight left nothing
    resumed = json.loads(pack("resumed", a, c).stdout)
    cold = json.loads(pack("cold", a, c, use=None).stdout)
    assert resumed["cache_parts"]["parts_reused"] == 2 and resumed["cache_parts"]["parts_made"] > 5
    total = resumed["cache_parts"]["records_reused"] + resumed["cache_parts"]["records_tokenized"]
    assert total == cold["records_read"] == 191 and resumed["dropped"] == cold["dropped"] == {"invalid_json": 1}
    assert_same_shards(tmp_path / "cold", tmp_path / "resumed")
    # line 58 of a.jsonl, in a part made by the second run after two found: its line numbers follow theirs
    assert (tmp_path / "resumed.rejects").read_text() == (tmp_path / "cold.rejects").read_text()
    assert '"position": 58' in (tmp_path / "cold.rejects").read_text()

    # b.jsonl added between the two: only it is tokenized.
    added = json.loads(pack("added", a, b, c).stdout)
    reused = resumed["cache_parts"]["parts_reused"] + resumed["cache_parts"]["parts_made"]
    assert added["cache_parts"]["parts_reused"] == reused
    assert added["cache_parts"]["records_tokenized"] == 111  # b.jsonl's records
    pack("added-cold", a, b, c, use=None)
    assert_same_shards(tmp_path / "added-cold", tmp_path / "added")
    assert (tmp_path / "added.rejects").read_text() == (tmp_path / "added-cold.rejects").read_text()


def test_split_pieces_are_cut_on_ray_as_locally(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    """--overflow split: the tokenizer actors cut the same pieces as the local workers."""
    flags = ["--max-len", "128", "--overflow", "split", "--on-error", "skip", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags).stdout)
    remote = json.loads(run_pack(corpus, "-o", tmp_path / "ray", *flags, "--engine", "ray").stdout)
    assert local["split"]["records_split"] > 10 and local["split"] == remote["split"]
    assert_same_shards(tmp_path / "local", tmp_path / "ray")


def test_ray_writer_tasks_on_a_cached_store(cluster: Any, corpus: Path, tmp_path: Path) -> None:
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

    # The entry's token files are hashed by tasks on a hit: a changed byte is found, as locally, and rebuilt.
    entry = store_in(cache)
    token_file = a_token_file(entry)  # the local run's entry: its first part's tokens, linked
    with open(entry / token_file, "r+b") as fh:
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 1]))
    result = run_pack(corpus, "-o", tmp_path / "again", *flags, "--engine", "ray", cache=cache)
    assert result.stderr == (
        f"Warning: the cache entry is damaged ({entry}/{token_file}: sha256 differs from meta.json (changed "
        "bytes)); it is rebuilt\n"
    )
    assert json.loads(result.stdout)["cache"] == "rebuilt"
    assert_same_shards(tmp_path / "local", tmp_path / "again")


def test_bad_record_fails_with_the_same_message(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    results = [
        run_pack(corpus, "-o", tmp_path / engine, "--max-len", "512", "--engine", engine, "-q", expect=None)
        for engine in ("local", "ray")
    ]
    assert [r.exit_code for r in results] == [1, 1]
    assert results[0].stderr == results[1].stderr
    assert results[0].stderr.startswith(f"Error: {corpus / 'a.jsonl'} line 58: invalid JSON")
    assert results[1].stdout == ""  # the actors stopped without Ray announcing retries there
    assert not (tmp_path / "ray").exists() and not list(tmp_path.glob(".ray.partial-*"))
    # Nothing is left running: the tokenizer actors stop (asynchronously) and give both CPUs back.
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2


def test_shards_to_a_filesystem_uri(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    from packcli.engines import LocalEngine, WriteJob
    from packcli.engines.ray.engine import RayEngine
    from packcli.io.uri import check_uri_output, write_manifest_uri
    from packcli.run.options import plan_options, row_layout

    def quiet(*args: Any) -> None:
        return None

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
    plan = plan_stage.make_plan(plan_options(config), store)
    ray_engine = RayEngine()
    check_uri_output(uri, overwrite=False)
    job = WriteJob(layout=row_layout(config, 0), store=store, plan=plan, directory=tmp_path / "unused", progress=quiet)
    entries = ray_engine.write(job)
    local_manifest = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert [e.to_dict() for e in entries] == local_manifest["shards"]
    assert not (tmp_path / "remote" / "manifest.json").exists()  # the caller writes it last
    write_manifest_uri(uri, Manifest(max_len=512, shards=entries))
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    written = json.loads((tmp_path / "remote" / "manifest.json").read_text())
    assert written == {"max_len": 512, "shards": local_manifest["shards"]}
    with pytest.raises(UsageError, match="not empty"):
        check_uri_output(uri, overwrite=False)
    check_uri_output(uri, overwrite=True)  # an overwrite first removes the completeness marker
    assert not (tmp_path / "remote" / "manifest.json").exists()

    # A shard that cannot be written: the default engine's error message.
    config = PackConfig(inputs=(str(corpus),), output=str(tmp_path / "out"), max_len=512, on_error="skip")
    errors = []
    for engine in (LocalEngine(), RayEngine()):
        with pytest.raises(OutputError) as caught:
            engine.write(
                WriteJob(
                    layout=row_layout(config, 0), store=store, plan=plan, directory=tmp_path / "missing", progress=quiet
                )
            )
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "cannot write a shard" in errors[0]


def test_cli_output_to_a_filesystem_uri(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    """With an output URI the tokens go to the output's file system too: no node needs the driver's disk."""
    flags = ["--max-len", "512", "--rows-per-shard", "9", "--on-error", "skip", "-q"]
    run_pack(corpus, "-o", tmp_path / "local", *flags)
    uri = (tmp_path / "remote").as_uri()
    cache = tmp_path / "cache"
    run_pack(corpus, "-o", uri, *flags, "--engine", "ray", cache=cache)
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    manifests = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("local", "remote")]
    assert manifests[0]["shards"] == manifests[1]["shards"]
    # The cache entry (on the driver) holds the per-sample arrays; its segments are under the output URI.
    store = load_store(store_in(cache))
    assert store.meta.segment_root == f"{uri}/.packcli-tokens/{store.path.name}"
    assert not list(store.path.glob("segments/*")) and len(store.meta.segments) > 10
    assert len(list((tmp_path / "remote" / ".packcli-tokens" / store.path.name / "segments").iterdir())) == 2 * len(
        store.meta.segments
    )
    # The local engine reads that entry (its tokens from the URI): a cache hit, the same shards.
    again = run_pack(corpus, "-o", tmp_path / "again", *flags, "--json", cache=cache)
    assert json.loads(again.stdout)["cache"] == "hit"
    assert_same_shards(tmp_path / "local", tmp_path / "again")
    # Without the cache, the segments are scratch: removed after the run.
    run_pack(corpus, "-o", uri + "2", *flags, "--engine", "ray")
    assert_same_shards(tmp_path / "local", tmp_path / "remote2")
    assert not (tmp_path / "remote2" / ".packcli-tokens").exists() or not any(
        (tmp_path / "remote2" / ".packcli-tokens").iterdir()
    )
    result = run_pack(corpus, "-o", uri, *flags, expect=2)
    assert result.stderr.startswith(f"Error: -o {uri}: a filesystem URI output needs --engine ray")


def test_inputs_at_a_filesystem_uri(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    """Inputs named by a URI prefix (as s3://bucket/data/ would be): tasks read them through pyarrow.fs."""
    flags = ["--max-len", "512", "--on-error", "skip", "--rejects", tmp_path / "rejects.jsonl", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags).stdout)
    remote = json.loads(run_pack(corpus.as_uri(), "-o", tmp_path / "ray", *flags, "--engine", "ray").stdout)
    assert local["records_read"] == remote["records_read"] == 340 and local["dropped"] == remote["dropped"]
    assert_same_shards(tmp_path / "local", tmp_path / "ray")
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == [(corpus / n).as_uri() for n in sorted(os.listdir(corpus))]
    rejected = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert {(r["source"], r["position"]) for r in rejected} >= {((corpus / "a.jsonl").as_uri(), 58)}


def test_preference_pairs_on_ray_as_locally(cluster: Any, tmp_path: Path) -> None:
    """Preference and KTO data: each sample's role travels with its metadata (one byte) into the store."""
    from .test_preference import kto_records, preference_records

    write_jsonl(tmp_path / "pairs.jsonl", preference_records(120, seed=4))
    write_jsonl(tmp_path / "kto.jsonl", kto_records(60, seed=5))
    for name in ("pairs", "kto"):
        flags = ["--max-len", "256", "--json", "-q"]
        data = tmp_path / f"{name}.jsonl"
        local = json.loads(run_pack(data, "-o", tmp_path / f"local-{name}", *flags).stdout)
        remote = json.loads(run_pack(data, "-o", tmp_path / f"ray-{name}", *flags, "--engine", "ray").stdout)
        assert local["samples"] == remote["samples"] > 0 and local["rows"] == remote["rows"]
        assert_same_shards(tmp_path / f"local-{name}", tmp_path / f"ray-{name}")
        table = pq.read_table(next((tmp_path / f"ray-{name}").glob("shard-*")))
        assert "sample_role" in table.column_names


def test_fix_turns_on_ray_as_locally(cluster: Any, tmp_path: Path) -> None:
    """--fix-turns runs in the actors: the same counts, shards and per-record log as the local engine."""
    from .test_turns import MESSAGES

    data = write_jsonl(tmp_path / "turns.jsonl", [{"messages": m} for m, _ in MESSAGES] * 30)
    summaries = {}
    for engine in ("local", "ray"):
        log = tmp_path / f"fixes-{engine}.jsonl"
        flags = ["--max-len", "256", "--fix-turns", "--fix-turns-log", log, "--json", "-q", "--engine", engine]
        summaries[engine] = json.loads(run_pack(data, "-o", tmp_path / engine, *flags).stdout)
    assert summaries["local"]["turns_fixed"] == summaries["ray"]["turns_fixed"]
    assert summaries["ray"]["turns_fixed"]["merged"] == 30
    assert summaries["ray"]["dropped"] == {"no_answer_after_fix": 30}
    assert_same_shards(tmp_path / "local", tmp_path / "ray")
    assert (tmp_path / "fixes-local.jsonl").read_text() == (tmp_path / "fixes-ray.jsonl").read_text()


def test_the_nodes_run_this_packcli(cluster: Any) -> None:
    """The tasks import the packcli under test (the driver's sys.path goes to the workers), on both nodes."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    def where() -> tuple[str, str]:
        import packcli as imported

        return imported.__file__, ray.get_runtime_context().get_node_id()

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    found = ray.get(
        [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
    )
    assert len(nodes) == 2 and found == [(packcli.__file__, n) for n in nodes]


def test_limit_reads_the_same_first_records(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    """--limit: a first pass counts each part's records; the parts after the limit are not read."""
    from packcli.engines.ray.engine import RayEngine

    flags = ["--max-len", "512", "--limit", "150", "--on-error", "skip", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags).stdout)
    ray_engine = RayEngine()
    options = {"max_len": 512, "limit": 150, "on_error": "skip", "cache": False}
    remote = run_with(ray_engine, corpus, output=str(tmp_path / "ray"), **options)
    assert local["records_read"] == remote["records_read"] == 150
    assert local["dropped"] == remote["dropped"] and local["samples"] == remote["samples"]
    assert_same_shards(tmp_path / "local", tmp_path / "ray")
    assert ray_engine.last_run["parts"] < len(list((corpus).iterdir())) * 3  # not every part of the inputs


def test_an_empty_input_fails_as_locally(cluster: Any, corpus: Path, tmp_path: Path) -> None:
    """A JSON lines file of blank lines, cut into parts: the local reader's error, after the file before it."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(corpus / "b.jsonl", data / "a.jsonl")
    (data / "b.jsonl").write_text("\n" * 20_000)  # several parts, no record
    flags = ["--max-len", "512", "--format", "messages", "-q"]  # no format detection, which would read the file
    results = [run_pack(data, "-o", tmp_path / e, *flags, "--engine", e, expect=None) for e in ("local", "ray")]
    assert [r.exit_code for r in results] == [1, 1]
    assert (
        results[0].stderr
        == results[1].stderr
        == f"Error: {data / 'b.jsonl'}: the file is empty; remove it from the inputs\n"
    )


def test_a_killed_actor_is_restarted_and_its_parts_run_again(
    cluster: Any, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's own retries: an actor that dies mid-run is restarted, its parts run again, the output is the same."""
    from packcli.engines.ray import tokenizing

    killed = []
    numbered = tokenizing.ClusterTokenizing.numbered

    def kill_once(self: Any, *args: Any) -> Any:
        if not killed:
            ray.kill(self.actors[0], no_restart=False)  # as a crashed process or a lost node would
            killed.append(True)
        return numbered(self, *args)

    monkeypatch.setattr(tokenizing.ClusterTokenizing, "numbered", kill_once)
    flags = ["--max-len", "512", "--on-error", "skip", "--json", "-q"]
    local = json.loads(run_pack(corpus, "-o", tmp_path / "local", *flags).stdout)
    out = run_pack(corpus, "-o", tmp_path / "ray", *flags, "--engine", "ray").stdout
    # Ray's driver prints the retry ("Task Tokenizer.run failed. There are 2 retries remaining") on stdout.
    remote = json.loads(out[out.index("{\n") :])
    assert killed and local["records_read"] == remote["records_read"]
    assert_same_shards(tmp_path / "local", tmp_path / "ray")


def test_without_ray_the_engine_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, corpus: Path, tmp_path: Path
) -> None:
    import packcli.engines

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    for name in [m for m in sys.modules if m.startswith("packcli.engines.ray")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(packcli.engines, "ray", raising=False)
    result = run_pack(corpus, "-o", tmp_path / "out", "--engine", "ray", "--on-error", "skip", expect=2)
    assert "pip install 'packcli[ray]'" in result.stderr
