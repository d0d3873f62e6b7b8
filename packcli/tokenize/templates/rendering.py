"""Rendering a chat template as ``apply_chat_template`` renders it, without importing transformers.

The environment is transformers' (5.x) as it renders chat templates: a sandbox that refuses to change
its arguments, ``trim_blocks`` and ``lstrip_blocks``, the loop controls, ``{% generation %}`` blocks
whose character spans are recorded, a ``tojson`` filter that keeps non-ASCII text and takes
``indent``/``separators``/``sort_keys``, and the globals ``raise_exception``, ``strftime_now``, a
``dict`` that only builds dicts and a ``namespace`` that takes no underscore-prefixed name. What the
template sees is made of plain data first (other objects become ``"<TypeName>"``), and a message's
reasoning is passed under all three of its names (``thinking``, ``reasoning_content`` and the one it
came with), as transformers does. ``tests/test_rendering.py`` holds it to transformers' own renderer on
every template of the suite; importing this module costs what importing jinja2 costs (transformers
takes over a second).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The names a message's reasoning may come under; templates read the first (gpt-oss's read ``thinking``).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_REASONING = frozenset(REASONING_FIELDS)

# (the text rendered so far, in pieces; the generation blocks' spans; how many of the pieces were counted
# at the last block, and their characters) of the rendering being tracked.
_Tracked = tuple[list[str], list[tuple[int, int]], list[int]]


class GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body, and records where it lands in the output."""

    tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        self.tracking: ContextVar[_Tracked | None] = ContextVar("generation_blocks", default=None)
        environment.extend(generation_blocks=self)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_block"), [], [], body).set_lineno(lineno)

    def _block(self, caller: Any) -> str:
        text = str(caller())
        tracked = self.tracking.get()
        if tracked is not None:
            # The block's output is the next piece the template yields: it starts where the output so far ends.
            pieces, spans, counted = tracked
            start = counted[1] + sum(map(len, pieces[counted[0] :]))
            counted[:] = len(pieces), start
            spans.append((start, start + len(text)))
        return text

    @contextlib.contextmanager
    def track(self, pieces: list[str], spans: list[tuple[int, int]]) -> Iterator[None]:
        token = self.tracking.set((pieces, spans, [0, 0]))
        try:
            yield
        finally:
            self.tracking.reset(token)


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _DictMaker:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template: dicts, and no way to the class itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace``, refusing names that start with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


@functools.lru_cache(maxsize=64)
def compile_template(template: str) -> jinja2.Template:
    """Return the template compiled in the chat-template environment (raises what Jinja raises on bad syntax)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlocks, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictMaker()
    env.globals["namespace"] = _Namespace
    compiled = env.from_string(template)
    # Jinja copies a template's globals into each render's context through a ChainMap of the template's and
    # the environment's (5.7 of a short chat's 21.4 us); neither changes after this, so one dict serves.
    compiled.globals = dict(compiled.globals)
    return compiled


def render(
    template: str,
    messages: list[Any],
    *,
    tools: list[Any] | None = None,
    documents: list[Any] | None = None,
    add_generation_prompt: bool = False,
    spans: bool = False,
    **kwargs: Any,
) -> tuple[str, list[tuple[int, int]]]:
    """Return the rendered conversation and, with ``spans``, the character spans of its generation blocks."""
    compiled = compile_template(template)
    chat = [_with_reasoning_names(m) for m in plain(messages)]
    context = {
        "messages": chat,
        "tools": plain(tools),
        "documents": plain(documents),
        "add_generation_prompt": add_generation_prompt,
        **plain(kwargs),
    }
    if not spans:
        return compiled.render(**context), []
    pieces: list[str] = []
    found: list[tuple[int, int]] = []
    blocks: GenerationBlocks = compiled.environment.generation_blocks  # type: ignore[attr-defined]
    with blocks.track(pieces, found):
        for piece in compiled.generate(**context):
            pieces.append(piece)
    return "".join(pieces), found


def _with_reasoning_names(message: Any) -> Any:
    """A message with its reasoning under ``thinking`` and ``reasoning_content`` too, as transformers passes it."""
    if not isinstance(message, dict) or _REASONING.isdisjoint(message):
        return message
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


# The types a template sees as they are: what a JSON decoder makes of a record's scalars.
_AS_IS = frozenset({str, int, float, bool, type(None)})


def plain(value: Any) -> Any:
    """Return ``value`` rebuilt of plain JSON types, as the template may see it: other objects become
    ``"<TypeName>"`` (a template only tests whether such a key is there), subclasses their base type."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    # What JSON decoding makes, the common case: a record's dicts and lists, their scalars taken as they are.
    if kind is dict:
        return {
            key if type(key) is str else plain(key): item if type(item) in _AS_IS else plain(item)
            for key, item in value.items()
        }
    if kind is list:
        return [item if type(item) in _AS_IS else plain(item) for item in value]
    return _plain_other(value)


def _plain_other(value: Any) -> Any:
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":  # a numpy scalar: its Python value
        return plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain(value.model_dump())
    return f"<{type(value).__name__}>"
