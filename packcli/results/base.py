"""What every record type of ``packcli.results`` shares: its JSON form (``record_dict``), read back
(``record_from_dict``, or ``DamagedResult``), and its keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, cast

from packcli.errors import Message, OutputError, Terms, python_term
from packcli.jsontypes import JSONObject

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


class DamagedResult(OutputError):
    """A summary, manifest, store metadata or rejects entry lacks a key it must have (or is no object)."""


def plain_json(value: Any, terms: Terms = python_term) -> Any:
    """A field's value as JSON data: nested records as dicts, containers copied, messages (warnings) as
    text that names options by ``terms``."""
    if isinstance(value, Message):
        return value.render(terms)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_dict(value, terms)
    if isinstance(value, dict):
        return {k: plain_json(v, terms) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v, terms) for v in value]
    return value


# A field's metadata key: the field is held in memory only, never written (nor read back).
IN_MEMORY = "in_memory"


def record_dict(record: DataclassInstance, terms: Terms = python_term) -> JSONObject:
    out: JSONObject = {}
    nulls: frozenset[str] = getattr(record, "NULLS", frozenset())
    for f in dataclasses.fields(record):
        if f.metadata.get(IN_MEMORY):
            continue
        value = getattr(record, f.name)
        if value is None and f.name not in nulls:
            continue
        out[f.name] = plain_json(value, terms)
    return out


def read_messages(value: Any) -> list[Message]:
    """Warnings read back from JSON (text, as it was written) as messages."""
    if not isinstance(value, list):
        raise DamagedResult("warnings is not a list")
    return [v if isinstance(v, Message) else Message(str(v)) for v in value]


def record_from_dict(
    cls: type[T], data: object, what: str, convert: Mapping[str, Callable[[Any], Any]] | None = None
) -> T:
    """Build ``cls`` from JSON data: its fields by name (unknown keys ignored), ``convert`` applied to the
    values it names; DamagedResult when ``data`` is no object or lacks a field without a default."""
    if not isinstance(data, Mapping):
        raise DamagedResult(f"{what} is not a JSON object")
    convert = convert or {}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get(IN_MEMORY):
            continue
        if f.name in data:
            value = data[f.name]
            kwargs[f.name] = convert[f.name](value) if f.name in convert and value is not None else value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DamagedResult(f"{what} lacks {f.name}")
    return cls(**kwargs)


def field_names(cls: type[DataclassInstance]) -> list[str]:
    """The JSON keys a record type can have, in the order it writes them."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get(IN_MEMORY)]


def required_fields(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """The JSON keys a record type must have (``from_dict`` refuses data without one), in order."""
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and not f.metadata.get(IN_MEMORY)
    )


class JSONRecord:
    """A record type whose JSON form is its fields (``record_dict``), read back by ``record_from_dict``;
    ``WHAT`` names it in a ``DamagedResult``'s message. A type whose JSON needs more overrides both."""

    WHAT: ClassVar[str]

    def to_dict(self) -> JSONObject:
        return record_dict(cast("DataclassInstance", self))

    @classmethod
    def from_dict(cls, data: object) -> Self:
        made: Self = record_from_dict(cast("type[DataclassInstance]", cls), data, cls.WHAT)  # type: ignore[assignment]
        return made
