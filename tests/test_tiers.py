"""The test tiers of tests/conftest.py: a SLOW_TESTS entry must name a test that exists."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest


def _item(path: Path, name: str) -> Any:
    return SimpleNamespace(nodeid=f"tests/{path.name}::{name}", name=name, originalname=name.split("[")[0], path=path)


@pytest.fixture
def collected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(conftest, "SLOW_TESTS", {"test_x": {"test_a", "test_b[one]", "test_renamed"}})
    path = tmp_path / "tests" / "test_x.py"
    return [_item(path, "test_a"), _item(path, "test_b[one]"), _item(path, "test_b[two]"), _item(path, "test_c")]


def _config(tmp_path: Path, *args: str) -> Any:
    return SimpleNamespace(args=list(args), invocation_params=SimpleNamespace(dir=tmp_path))


@pytest.mark.parametrize("given", ["tests", "tests/test_x.py"])
def test_an_entry_naming_no_test_of_a_module_collected_in_full_fails_collection(
    given: str, collected: list[Any], tmp_path: Path
) -> None:
    config = _config(tmp_path, given)
    assert conftest.slow_tests_missing(config, collected) == ["test_x::test_renamed"]
    with pytest.raises(pytest.UsageError, match=r"SLOW_TESTS names 1 test\(s\) not collected: test_x::test_renamed;"):
        conftest.pytest_collection_modifyitems(config, collected)


def test_a_module_collected_in_part_or_not_at_all_is_not_checked(collected: list[Any], tmp_path: Path) -> None:
    assert conftest.slow_tests_missing(_config(tmp_path, "tests/test_x.py::test_a"), collected[:1]) == []
    assert conftest.slow_tests_missing(_config(tmp_path, "tests/test_y.py"), collected) == []
