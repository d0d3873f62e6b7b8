"""The house rules of the package's imports: no circle, and no import from a lower layer to a higher one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "packcli"

# Layers from the top, one per subpackage or top module (docs/architecture.md): a module may import only
# from its own layer or lower ones, and within a layer no circle. Every module of the package is in one.
LAYERS = [
    {"packcli.cli", "packcli.__main__"},
    {"packcli.api", "packcli"},
    {"packcli.run", "packcli.report"},  # the run, and the read side (raw stats tokenize as pack does)
    {"packcli.engines"},
    {"packcli.output", "packcli.train", "packcli.collate", "packcli.dpo", "packcli.training", "packcli.packing"},
    {"packcli.plan"},
    {"packcli.tokenize"},
    {"packcli.vision"},  # what an image becomes in tokens, asked of the processor
    {"packcli.config"},
    {"packcli.store"},
    {"packcli.io"},
    {"packcli.records"},
    {"packcli.procs"},
    {"packcli.owned"},
    {"packcli.results"},  # the typed summary, manifest, store metadata and rejects entries
    {"packcli.contract", "packcli.errors", "packcli.version", "packcli.jsontypes"},
]


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module_name(path) for path in PACKAGE.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("packcli"):
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES
                deps.update(submodules)
                if len(submodules) < len(node.names):  # a name the module defines: the module itself
                    deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith("packcli"))
        modules[name] = deps
    # "from packcli import __version__" is an import of the package's face (layer 1), and counts
    return {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}


def _layer(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names if n != "packcli"):
            return i
    if module == "packcli":
        return 1  # the package's public face re-exports the library: nothing below imports it
    raise AssertionError(f"{module} is in no layer: add its subpackage to LAYERS (and to docs/architecture.md)")


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_imports_point_down() -> None:
    graph = _graph()
    for module, deps in graph.items():
        here = _layer(module)
        for dep in deps:
            assert _layer(dep) >= here, f"{module} imports {dep}, which is above it"


def test_the_training_side_and_the_packing_core_stand_alone() -> None:
    graph = _graph()
    contract = {"packcli.contract", "packcli.errors", "packcli.jsontypes"}
    assert not graph["packcli.train.collate"] - contract - {"packcli.train.checks"}
    assert not graph["packcli.train.checks"] - contract - {"packcli.output.formats"}
    assert not graph["packcli.plan.packing"], "the packing core imports nothing of packcli"


def test_every_subpackage_has_a_layer() -> None:
    packages = {p.parent for p in PACKAGE.rglob("__init__.py")} - {PACKAGE}
    for package in packages:
        name = ".".join(package.relative_to(PACKAGE.parent).parts)
        assert _layer(name) is not None


# Helpers and constants with one home: a second definition anywhere in the package is a copy that will
# drift (they did: four tests of what a URI is, with four rules).
ONE_HOME = {
    "is_uri": "packcli.io.uri",
    "open_uri": "packcli.io.uri",
    "file_sha256": "packcli.contract",
    "file_digest": None,  # the store's copy of file_sha256
    "MANIFEST": "packcli.contract",
    "SAMPLE_ROLES": "packcli.contract",
    "CHOSEN": "packcli.contract",
    "REJECTED": "packcli.contract",
    "DESIRABLE": "packcli.contract",
    "UNDESIRABLE": "packcli.contract",
    "first_line": "packcli.errors",
    "_first": None,  # a copy of first_line
    "where": "packcli.errors",
    "source_of": "packcli.store.tokens",
    "_source_of": None,
    # One JSON bracket scanner: the JSON array reader's and the cut-line check's
    "json_value_end": "packcli.records.checks",
    "_value_end": None,
    "_STRUCTURE": "packcli.records.checks",
    "_IN_STRING": "packcli.records.checks",
}


def _definitions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # The module's names and its classes' (not functions' local variables).
        nodes = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
        for node in nodes:
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    names += [e.id for e in elts if isinstance(e, ast.Name)]
            for name in names:
                found.setdefault(name, set()).add(module)
    return found


def test_shared_helpers_are_defined_once() -> None:
    found = _definitions()
    for name, home in ONE_HOME.items():
        assert found.get(name, set()) == ({home} if home else set()), f"{name} is defined in {sorted(found[name])}"


# Module-level state outside procs/ (which owns the process-wide state of a run: its pools, the worker
# context, the stop request): none but these, each with its reason.
ALLOWED_STATE = {
    ("packcli.output.formats", "FORMATS"): "the shard-format registry: formats plug in with register()",
    ("packcli.output.formats", "_BY_EXTENSION"): "the registry's index by file extension",
    ("packcli.io.sources", "_SPOOLED"): "a stream (stdin, a FIFO) is copied once per run, and read again",
}
MUTATORS = {"append", "extend", "update", "clear", "pop", "popitem", "setdefault", "add", "remove", "discard", "insert"}
MUTABLE_CALLS = {"dict", "list", "set", "Counter", "defaultdict", "OrderedDict", "deque", "Event", "Lock", "RLock"}


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in MUTABLE_CALLS
    return False


def _module_state(tree: ast.Module) -> set[str]:
    """The module-level names bound to a mutable container that a function of the module changes."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and _mutable(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    changed = set()
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for node in (n for f in functions for n in ast.walk(f)):
        call = node.func if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if call is not None and call.attr in MUTATORS and isinstance(call.value, ast.Name) and call.value.id in names:
            changed.add(call.value.id)
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        targets = [node.target] if isinstance(node, ast.AugAssign) else targets
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in names:
                changed.add(target.value.id)
    return changed


def test_no_global_statement_and_no_module_state_outside_procs() -> None:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], f"{module}: a global statement"
        if not module.startswith("packcli.procs."):
            found.update((module, name) for name in _module_state(tree))
    assert found == set(ALLOWED_STATE)


def test_the_module_state_check_finds_state() -> None:
    """The check above sees a module-level dict a function fills, and a list it appends to."""
    tree = ast.parse(
        "_SEEN = {}\nQUEUE: list[int] = []\nNAMES = {'a': 1}\ndef f(k):\n    _SEEN[k] = 1\n    QUEUE.append(k)\n"
    )
    assert _module_state(tree) == {"_SEEN", "QUEUE"}


# A function longer than this is steps that want names of their own (a screen is about 60 lines).
MAX_FUNCTION_LINES = 100


def _long_functions(tree: ast.Module) -> list[tuple[str, int]]:
    """The functions (methods and nested ones too) over MAX_FUNCTION_LINES lines, decorators left out, and theirs."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((node.name, lines))
    return found


def test_no_function_is_over_100_lines() -> None:
    found = [
        f"{_module_name(path)}.{name} ({lines} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, lines in _long_functions(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "over 100 lines (split them into named steps): " + ", ".join(found)


def test_the_function_length_check_finds_a_long_function() -> None:
    """The check above sees a function and a method of 101 lines, not one of 100 nor a decorator's line."""
    body = "".join(f"    x{i} = {i}\n" for i in range(99))
    tree = ast.parse(
        f"@decorated\ndef fits():\n{body}\n"
        f"def long():\n{body}    return x0\n\n"
        f"class C:\n    async def method(self):\n{body.replace('    ', '        ')}        return 0\n"
    )
    assert _long_functions(tree) == [("long", 101), ("method", 101)]


def test_stage_one_and_the_writers_know_no_pack_config() -> None:
    """Below run/, stage one, the store, the plan, the writers and the engines take their own options, never
    PackConfig (run/options.py builds them)."""
    for package in ("tokenize", "records", "store", "output", "engines", "io", "procs", "plan"):
        for path in (PACKAGE / package).rglob("*.py"):
            assert "PackConfig" not in path.read_text(encoding="utf-8"), f"{_module_name(path)} names PackConfig"


# Structured data between modules has a type (packcli.results, TypedDicts beside their code); what is
# left of ``dict[str, Any]`` is JSON whose keys are not packcli's (named in packcli.jsontypes) and a few
# local builders. A new seam gets a type rather than pushing the count back up.
MAX_ANY_DICTS = 62


def test_few_dict_str_any_left() -> None:
    counts = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        n = path.read_text(encoding="utf-8").count("dict[str, Any]")
        if n:
            counts[_module_name(path)] = n
    total = sum(counts.values())
    listed = "\n".join(f"{n:4d} {module}" for module, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    assert total <= MAX_ANY_DICTS, f"{total} dict[str, Any] in packcli/ (at most {MAX_ANY_DICTS}), by module:\n{listed}"


# Messages in the core name options as Opt parts, which each client renders its own way (``--max-len`` on
# the command line, ``max_len`` in Python): no string of the core (docstrings aside) spells a flag. None but
# these, each with its reason.
FLAG_TEXT = re.compile(r"(?<![\w-])(--[a-z]|-o\b)")
PACK_CONFIG = "packcli.config.pack_config"  # where PackConfig declares its options
ALLOWED_FLAG_TEXT = {
    (PACK_CONFIG, "--field"): "PackConfig: an option's declared flag, where it is not the option's name",
    (PACK_CONFIG, "--template-kwarg"): "PackConfig's declarations, as above",
    (PACK_CONFIG, "--no-cache"): "PackConfig's declarations, as above",
    (PACK_CONFIG, "--add-eos/--no-add-eos"): "PackConfig's declarations, as above",
    (PACK_CONFIG, "--no-overwrite"): "PackConfig's declarations: the off form of --overwrite, in --help only",
    (PACK_CONFIG, "-o"): "PackConfig's declarations: the short flag a message may name the output by",
    ("packcli.config.terms", "--no-"): "flag_term: how the command line spells an option turned off",
    ("packcli.config.presets", "; see packcli pack --help"): "presets are read by the command line only (--config)",
    ("packcli.report.plot", "Samples too long (dropped by --overflow drop) per max_len"): (
        "a label of the plot only packcli stats --plot writes"
    ),
}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and its functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _flag_text(tree: ast.Module) -> list[tuple[int, str]]:
    """The string constants (docstrings aside) that spell a flag, with their lines."""
    docstrings = _docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and FLAG_TEXT.search(node.value)
    )


def test_no_string_of_the_core_names_a_flag() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module == "packcli.cli" or module.startswith("packcli.cli."):
            continue  # the command line names its flags
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(module, line, text) for line, text in _flag_text(tree) if (module, text) not in ALLOWED_FLAG_TEXT]
    assert not found, "name options with Opt parts, not flags: " + "; ".join(f"{m}:{n}: {t!r}" for m, n, t in found)


def test_the_flag_text_check_finds_flags() -> None:
    """The check above sees a flag in a message, a hint and a short flag, and not in a docstring."""
    tree = ast.parse(
        'def f(n):\n    """Raise --max-len."""\n    raise UsageError(f"{n} tokens; raise --max-len")\n'
        'HINT = "pass --no-cache"\nFIX = "choose another -o"\nSAFE = "a long-lived run, max_len"\n'
    )
    assert [text for _, text in _flag_text(tree)] == [
        " tokens; raise --max-len",
        "pass --no-cache",
        "choose another -o",
    ]
