"""The engine seam: a run makes one engine (or takes the one given) and calls only the Engine protocol."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from packcli.config import PackConfig
from packcli.engines import Engine, HashJob, LocalEngine, load_engine
from packcli.output.layout import RowLayout
from packcli.run import options, pipeline, tokenized
from packcli.store.tokens import TokenStore

from .conftest import bare_meta, make_conversations, write_jsonl

PROTOCOL = {
    name
    for name, member in inspect.getmembers(Engine)
    if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
}


class Recording(LocalEngine):
    """The local engine, noting every attribute the run reads from it."""

    def __init__(self) -> None:
        super().__init__(num_proc=1)
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_") and name not in ("calls", "num_proc"):
            object.__getattribute__(self, "calls").append(name)
        return super().__getattribute__(name)


@pytest.mark.parametrize("cache", [True, False])
def test_a_run_uses_the_engine_given_and_only_its_protocol(
    cache: bool, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", [{"messages": m} for m in make_conversations(20, seed=3)])
    for module in (pipeline, tokenized):  # no engine is made: the one given serves the whole run
        monkeypatch.setattr(module, "load_engine", lambda *args: pytest.fail("a second engine was made"))
    engine = Recording()
    config = PackConfig(inputs=(str(data),), output=str(tmp_path / "out"), max_len=512, cache=cache, num_proc=1)
    monkeypatch.setenv("PACKCLI_CACHE", str(cache_dir))
    summary = pipeline.run_pack(config, engine=engine)
    assert summary["cache"] == ("miss" if cache else "off") and summary["rows"] > 0
    assert set(engine.calls) <= PROTOCOL
    # hashing: who hashes the inputs and a found entry's token files (the run asks once), who hashes the
    # inputs not hashed as they are read (before), and the inputs again once read (from within tokenize,
    # did an input change?); the local engine has none: the run hashes them itself.
    expected = ["hashing", "hashing", "tokenize", "hashing", "write", "close"]
    if cache:  # the local engine tokenizes into cache parts (packcli.store.parts), the run assembles them
        expected.insert(2, "cache_part_cuts")
    assert engine.calls == expected


def test_the_protocol_is_what_both_engines_have() -> None:
    """Every member the run uses is in Engine, and both engines have every one of them."""
    from packcli.engines.ray.engine import RayEngine

    assert {"hashing", "uri_output", "cache_part_cuts", "tokenize", "write", "close"} == PROTOCOL
    local = load_engine("local", num_proc=3)
    assert isinstance(local, LocalEngine) and local.num_proc == 3
    assert local.hashing is None and local.uri_output is False
    assert not Engine.__annotations__  # nothing but methods and read-only properties
    ray_engine = RayEngine()  # no Ray instance is started until one is needed
    for name in PROTOCOL:
        assert hasattr(local, name) and hasattr(ray_engine, name), name
        if isinstance(getattr(Engine, name), property):
            continue
        theirs = inspect.signature(getattr(Engine, name))
        for engine in (LocalEngine, RayEngine):
            ours = inspect.signature(getattr(engine, name))
            assert list(ours.parameters) == list(theirs.parameters), (engine, name)
    assert ray_engine.uri_output is True and ray_engine.hashing is not None
    assert {"hash_files", "check_digests"} <= set(dir(ray_engine.hashing))
    ray_engine.close()


def test_jobs_are_frozen(tmp_path: Path) -> None:
    job = HashJob(["a"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.again = True  # type: ignore[misc]
    assert HashJob([]).again is False


def test_a_scratch_store_discards_only_its_segments_elsewhere(tmp_path: Path) -> None:
    """A store that is not kept: its segments under a URI go with it (what the Ray engine writes there)."""
    elsewhere = tmp_path / "segments"
    (elsewhere / "x").mkdir(parents=True)

    TokenStore.discard_elsewhere(SimpleNamespace(meta=bare_meta(segment_root=elsewhere.as_uri())))  # type: ignore[arg-type]
    assert not elsewhere.exists() and tmp_path.exists()
    TokenStore.discard_elsewhere(SimpleNamespace(meta=bare_meta()))  # type: ignore[arg-type]  # all in its directory


def test_stage_options_are_built_from_the_config() -> None:
    config = PackConfig(
        inputs=("x",),
        max_len=100,
        pad_to_multiple_of=8,
        overflow="split",
        output_format="arrow",
        loss_weighting="sqrt",
        task="kto",
        rows_per_shard=5,
    )
    plan = options.plan_options(config)
    assert (plan.max_len, plan.sample_limit, plan.pad_multiple, plan.cut_side) == (100, 96, 8, "left")
    layout = options.row_layout(config, pad_id=7)
    assert layout == RowLayout(
        max_len=100,
        pad_id=7,
        pad_multiple=8,
        loss_weighting="sqrt",
        sample_roles=True,
        output_format="arrow",
        rows_per_shard=5,
        output="packed",
    )
    assert layout.pad_to is None and layout.schema().names[-3:] == [
        "seq_lengths_unpadded",
        "loss_weights",
        "sample_role",
    ]
