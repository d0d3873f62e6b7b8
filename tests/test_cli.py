"""The command line as a manual: stats takes what pack takes, help in panels, metavars, choices."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.main import get_command
from typer.testing import CliRunner

from packcli.cli import app, main
from packcli.config import CHOICES, OPTION_GROUPS
from packcli.version import __version__
from tests.conftest import make_conversations, write_jsonl

# A parameter of the command line -> the option of PackConfig it sets, where the names differ.
CONFIG_NAME = {"field": "fields", "template_kwarg": "template_kwargs"}


def _params(command: str) -> dict[str, Any]:
    return {p.name: p for p in get_command(app).commands[command].params}  # type: ignore[attr-defined]


def test_every_pack_option_that_decides_tokens_is_on_stats() -> None:
    """What decides a sample's tokens is the input and tokenization options (the cache key's), and the
    preset that can set them: each has the same flags, default and help on stats as on pack."""
    token_options = {*OPTION_GROUPS["input"], *OPTION_GROUPS["tokenization"]} - {"inputs"}
    pack, stats = _params("pack"), _params("stats")
    deciding = [n for n in pack if CONFIG_NAME.get(n, n) in token_options or n == "config"]
    assert {CONFIG_NAME.get(n, n) for n in deciding} == token_options | {"config"}
    for name in deciding:
        assert name in stats, f"pack --{name} decides tokens but stats has no such option"
        a, b = pack[name], stats[name]
        assert (a.opts, a.secondary_opts, a.default, a.help, a.metavar) == (
            b.opts,
            b.secondary_opts,
            b.default,
            b.help,
            b.metavar,
        ), name


def _chats(path: Path, n: int = 24, key: str = "messages") -> Path:
    return write_jsonl(path, [{key: m} for m in make_conversations(n, seed=5, max_turns=2, max_words=20)])


def _stats(*argv: str, cache_dir: Path) -> Any:
    result = CliRunner().invoke(app, ["stats", *argv, "--cache-dir", str(cache_dir), "--num-proc", "1", "--json"])
    return result


def test_stats_takes_field_format_and_config(tmp_path: Path, cache_dir: Path) -> None:
    plain = _chats(tmp_path / "plain.jsonl")
    renamed = _chats(tmp_path / "renamed.jsonl", key="dialog")
    reference = json.loads(_stats(str(plain), "--max-len", "512", cache_dir=cache_dir).stdout)

    # Without the rename, the format cannot be told: one line that names the fix.
    bare = _stats(str(renamed), "--max-len", "512", cache_dir=cache_dir)
    assert bare.exit_code == 1 and "pass --format, or --field" in bare.stderr
    for argv in (
        ["--field", "messages=dialog"],
        ["--field", "messages=dialog", "--format", "messages"],
    ):
        result = _stats(str(renamed), "--max-len", "512", *argv, cache_dir=cache_dir)
        assert result.exit_code == 0, result.output
        got = json.loads(result.stdout)
        assert (got["samples"], got["tokens"], got["trainable_tokens"]) == (
            reference["samples"],
            reference["tokens"],
            reference["trainable_tokens"],
        )

    # A preset names the inputs, the rename and the max length; a flag overrides its max length.
    (tmp_path / "p.yaml").write_text("inputs: [renamed.jsonl]\nmax_len: 300\nfields: {messages: dialog}\n")
    got = json.loads(_stats("--config", str(tmp_path / "p.yaml"), cache_dir=cache_dir).stdout)
    assert [line["max_len"] for line in got["max_lens"]] == [300]
    assert got["tokens"] == reference["tokens"]
    got = json.loads(_stats("--config", str(tmp_path / "p.yaml"), "--max-len", "256,512", cache_dir=cache_dir).stdout)
    assert [line["max_len"] for line in got["max_lens"]] == [256, 512]

    # --train-on and --limit change what stats counts, as they change what pack writes.
    got = json.loads(_stats(str(plain), "--max-len", "512", "--train-on", "all", cache_dir=cache_dir).stdout)
    # Every token but each sample's first (whose label is -100 by the contract) is trained.
    assert got["trainable_tokens"] == got["tokens"] - got["samples"] > reference["trainable_tokens"]
    got = json.loads(_stats(str(plain), "--max-len", "512", "--limit", "5", cache_dir=cache_dir).stdout)
    assert got["records_read"] == 5


def test_stats_refuses_token_options_on_a_packed_output(tmp_path: Path, cache_dir: Path, pack: Any) -> None:
    data = _chats(tmp_path / "d.jsonl", n=6)
    pack(data, "--max-len", "512", "-o", tmp_path / "out")
    for argv in (["--field", "messages=dialog"], ["--limit", "3"], ["--config", str(tmp_path / "x.toml")]):
        result = CliRunner().invoke(app, ["stats", str(tmp_path / "out"), *argv])
        assert result.exit_code == 2
        assert f"{argv[0]} applies to raw input only" in result.stderr


def _help(*argv: str) -> str:
    return CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "200", "TERM": "dumb"}).stdout


def test_pack_help_is_in_panels_with_metavars_and_choices() -> None:
    text = _help("pack")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Arguments", "Options", "Input", "Tokenizer & template", "Packing", "Output", "Run"]
    # Only --help is left in the generic panel: every option of pack is in a named one.
    generic = text.split("╭─ Options ─")[1].split("╰")[0]
    assert re.findall(r"--[a-z-]+", generic) == ["--help"]
    for option, metavar in (
        ("--max-len", "N"),
        ("--output", "DIR"),
        ("--config", "FILE"),
        ("--chat-template", "FILE|NAME"),
        ("--rejects", "FILE"),
        ("--num-proc", "N"),
        ("--cache-dir", "DIR"),
        ("--limit", "N"),
    ):
        assert re.search(rf"{option}\s.*?\s{re.escape(metavar)}\s", text), option
    for name in ("overflow", "on_error", "algorithm", "rank_remainder", "output_format", "engine", "truncate_side"):
        assert "[" + " | ".join(CHOICES[name]) + "]" in text, name
    assert "[default: 4096]" in text and "[default: (available cores)]" in text


def test_stats_help_is_in_panels_and_completion_installs() -> None:
    panels = re.findall(r"╭─ (.+?) ─", _help("stats"))
    assert panels[2:] == ["Input", "Tokenizer & template", "Packing", "Output", "Run"]
    assert "--install-completion" in _help()


def test_inspect_max_tokens_decodes_the_start_of_each_sample(tmp_path: Path, pack: Any) -> None:
    data = _chats(tmp_path / "d.jsonl", n=8)
    pack(data, "--max-len", "2048", "-o", tmp_path / "out")
    whole = json.loads(CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--json"]).stdout)
    cut = json.loads(CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--json", "--max-tokens", "5"]).stdout)
    for a, b in zip(whole["segments"], cut["segments"], strict=True):
        assert (b["length"], b["input_ids"], b["trained_tokens"]) == (a["length"], a["input_ids"], a["trained_tokens"])
        assert b["shown_tokens"] == min(5, a["length"]) and a["shown_tokens"] == a["length"]
        assert a["text"].startswith(b["text"]) and len(b["text"]) < len(a["text"])
    printed = CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--max-tokens", "5", "--no-pager"]).stdout
    more = whole["segments"][0]["length"] - 5
    assert f"... {more:,} more tokens (--max-tokens 5)" in printed
    refused = CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--max-tokens", "0"])
    assert refused.exit_code == 2 and "--max-tokens must be at least 1" in refused.stderr


def test_json_stays_alone_on_stdout_when_a_library_prints_there(tmp_path: Path, pack: Any, monkeypatch: Any) -> None:
    """--json writes one JSON document on stdout; a line a library prints during the run goes to stderr.

    Ray's driver, for one, prints a task's retry notice on stdout while the run goes on.
    """
    import packcli.api

    run = packcli.api.run

    def noisy_run(*args: Any, **kwargs: Any) -> Any:
        print("(raylet) Task failed. There are 2 retries remaining")
        return run(*args, **kwargs)

    monkeypatch.setattr(packcli.api, "run", noisy_run)
    result = pack(_chats(tmp_path / "chat.jsonl"), "--max-len", "256", "-o", tmp_path / "out", "--json")
    summary = json.loads(result.stdout)
    assert summary["records_read"] == 24
    assert "retries remaining" in result.stderr and "retries remaining" not in result.stdout
    verified = CliRunner().invoke(app, ["verify", str(tmp_path / "out"), "--json"])
    assert json.loads(verified.stdout)["ok"] is True


def test_help_shows_no_type_label_on_flags_and_arguments() -> None:
    """A flag takes no value (``<bool>`` invites ``--dry-run true``); an argument is named by its metavar."""
    for argv in ([], ["pack"], ["stats"], ["inspect"], ["verify"]):
        text = _help(*argv)
        assert "<bool>" not in text and "<list[str]>" not in text, argv
        assert not re.search(r"<[a-z]+(\[[a-z]+\])?>", text), argv
    assert re.search(r"│ --dry-run\s+Plan and print the summary", _help("pack"))
    assert re.search(r"│ +INPUTS\s+Files \(", _help("pack"))


def test_choice_lists_wrap_between_values_not_inside_one() -> None:
    narrow = CliRunner().invoke(app, ["pack", "--help"], env={"COLUMNS": "80", "TERM": "dumb"}).stdout
    metavars = " ".join(line.split("│")[1] for line in narrow.splitlines() if line.count("│") >= 2)
    for name, values in CHOICES.items():
        for value in values:
            assert re.search(rf"[\[| ]{value}[| \]]", metavars), (name, value)  # whole, on one line
    assert re.search(r"\[auto \| messages \|\s", narrow)  # wrapped where a space is


def test_completion_offers_the_values_of_choice_options() -> None:
    def complete(line: str) -> list[str]:
        env = {"_PACKCLI_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(line.split(" ")) - 1)}
        result = CliRunner().invoke(app, [], env=env, prog_name="packcli")
        assert result.exit_code == 0, result.output
        return result.stdout.split()

    assert complete("packcli pack --overflow ") == ["drop", "truncate", "split", "error"]
    assert complete("packcli pack --format p") == ["prompt_completion", "preference"]
    assert complete("packcli pack --truncate-side ") == ["auto", "right", "left"]
    assert complete("packcli stats --train-on last") == ["last_assistant"]
    assert complete("packcli stats --on-error ") == ["fail", "skip"]


def test_bare_packcli_prints_the_help_once() -> None:
    with CliRunner().isolation(env={"COLUMNS": "100", "TERM": "dumb"}) as (out, err, _):
        try:
            main([])
        except SystemExit as exc:
            code = exc.code
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    assert code == 2
    assert (stdout + stderr).count("Usage: packcli [OPTIONS] COMMAND [ARGS]...") == 1
    assert "╭─ Commands ─" in stdout and stderr.strip() == ""


# The entry point as the console script runs it: main() with the process's own arguments.
ENTRY = """
import atexit, sys, threading, time
from pathlib import Path
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
if sys.argv[1] == "--thread":  # a thread still at work when the command is over
    def late(path: Path) -> None:
        time.sleep(0.5)
        path.write_text("done")
    threading.Thread(target=late, args=(Path(sys.argv[2]),)).start()
    sys.argv[1:3] = []
sys.argv[0] = "packcli"
from packcli.cli import main
main()
print("never printed: main ends the process")
"""


def test_the_entry_point_ends_the_process_as_python_would(tmp_path: Path) -> None:
    """The console script's main() ends the process without tearing down every module, but as Python's
    exit would: its exit code, the exit handlers run, the streams flushed, threads at work waited for."""
    import subprocess
    import sys

    def entry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True, timeout=120)

    done = entry("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"packcli {__version__}\n", "exit handler ran\n")
    helped = entry("--help")
    assert helped.returncode == 0 and helped.stdout.rstrip().endswith("╯") and "never printed" not in helped.stdout
    refused = entry("pack", str(tmp_path / "none.jsonl"), "--max-len", "64", "-o", str(tmp_path / "o"))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"Error: {tmp_path / 'none.jsonl'}: no such file or directory; check the path",
        "exit handler ran",
    ]
    waited = entry("--thread", str(tmp_path / "late.txt"), "--version")
    assert waited.returncode == 0 and (tmp_path / "late.txt").read_text() == "done"


def test_a_line_off_a_terminal_is_what_rich_prints_without_importing_it() -> None:
    import io
    import os
    import subprocess
    import sys
    from contextlib import redirect_stderr

    from rich.console import Console
    from rich.markup import escape

    from packcli.cli import consoles

    for message in ["plain", "[bold]not markup[/] ]", "üñï 😀 :smile:", "bell\a back\b cr\r ff\f vt\v", "two\nlines  "]:
        mine = io.StringIO()
        with redirect_stderr(mine):
            consoles.warning(message)
        theirs = io.StringIO()
        line = f"[bold yellow]Warning:[/] {escape(message)}"
        Console(file=theirs, highlight=False).print(line, soft_wrap=True, markup=True, highlight=False, emoji=False)
        assert mine.getvalue() == theirs.getvalue()
    script = "import sys; from packcli.cli import consoles; consoles.error('x y'); print('rich' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert (run.stdout, run.stderr) == ("False\n", "Error: x y\n")


def test_numpy_is_imported_before_typing_extensions_replaces_typing_internals(tmp_path: Path) -> None:
    # numpy's typing module builds its Literal types with typing's own parameter collection, not with
    # typing_extensions' slower replacement (which typer's pydantic installs): 40-60 ms of a cache hit.
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "packcli", "cache", "ls", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    done = [line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    assert "numpy._typing._char_codes" in done and "typing_extensions" in done
    assert done.index("numpy._typing._char_codes") < done.index("typing_extensions")


def test_the_command_line_has_pyarrow_allocate_with_jemalloc_or_the_system_malloc_unless_told_otherwise() -> None:
    # mimalloc, pyarrow's default, made writing and reading shards slower (packcli.cli.arrow_allocator); the
    # variable is read once, as libarrow loads, so the command line sets it before anything loads pyarrow.
    import os
    import subprocess
    import sys

    import pyarrow as pa

    from packcli.cli import arrow_allocator

    try:
        pa.jemalloc_memory_pool()
        built = "jemalloc"
    except NotImplementedError:
        built = "system"
    assert arrow_allocator() == built  # read from the build's header without loading pyarrow
    script = (
        "from packcli.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "import pyarrow as pa\nprint(pa.default_memory_pool().backend_name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    for given, used in ((None, built), ("mimalloc", "mimalloc")):
        run = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "ARROW_DEFAULT_MEMORY_POOL": given} if given else env,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[-1] == used
