"""The release's face: one version everywhere it is read, a changelog entry for it, the license file."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import packcli

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "packcli.version.__version__"}
    assert importlib.metadata.version("packcli") == packcli.__version__  # what pip installed says the same


def test_the_changelog_has_this_version() -> None:
    headings = [
        line for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines() if line.startswith("## ")
    ]
    assert headings[0] == f"## {packcli.__version__}"


def test_the_license_file_is_the_declared_license() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text


def test_the_test_extra_is_the_dev_extra_with_torch_pinned() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert extras["test"] == ["packcli[dev]", "torch==2.13.0"]  # one list of test tools, not two copies
    assert "packcli[docs]" in extras["dev"] and any(r.startswith("torch>=") for r in extras["dev"])


def test_the_packing_engine_keeps_its_public_name() -> None:
    """0.3.0 moved the engine to packcli.plan.packing; ``packcli.packing`` is its documented name."""
    import numpy as np

    import packcli.packing as public
    import packcli.plan.packing as engine

    assert sorted(public.__all__) == sorted(engine.__all__)
    assert all(getattr(public, name) is getattr(engine, name) for name in engine.__all__)
    assert public.plan_rows(np.array([3, 5, 2, 7]), 8).tolist() == [1, 1, 2, 0]
    assert "`packcli.packing." in (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
