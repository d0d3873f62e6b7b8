"""The engine seam: a run makes one engine (or takes the one given) and calls only the Engine protocol."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from packcli.config import PackConfig
from packcli.engines import Engine, LocalEngine, load_engine
from packcli.output.layout import RowLayout
from packcli.run import options, pipeline, tokenized

from .conftest import make_conversations, write_jsonl

PROTOCOL = {name for name, _ in inspect.getmembers(Engine, inspect.isfunction) if not name.startswith("_")}


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
    # rehash_files: from within tokenize_to_store, once every record is read (did an input change?)
    expected = ["hash_files", "digest_checker", "tokenize_to_store", "rehash_files", "write_output", "close"]
    if cache:  # the local engine tokenizes into cache parts (packcli.store.parts), the run assembles them
        expected[2:3] = ["cache_part_cuts", "tokenize_to_parts"]
    else:
        expected.insert(4, "discard_store")  # a scratch store: the engine removes what it kept elsewhere
    assert engine.calls == expected


def test_the_protocol_is_what_both_engines_have() -> None:
    """Every method the run calls is in Engine, and the local engine has every one of them."""
    assert {
        "hash_files",
        "rehash_files",
        "digest_checker",
        "tokenize_to_store",
        "tokenize_to_parts",
        "cache_part_cuts",
        "discard_store",
        "write_output",
        "check_uri_output",
        "write_manifest_uri",
        "close",
    } == PROTOCOL
    local = load_engine("local", num_proc=3)
    assert isinstance(local, LocalEngine) and local.num_proc == 3
    assert not Engine.__annotations__  # nothing but methods
    for name in PROTOCOL:
        ours, theirs = inspect.signature(getattr(LocalEngine, name)), inspect.signature(getattr(Engine, name))
        assert list(ours.parameters) == list(theirs.parameters), name


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
