"""The model shapes ``--balance-model`` names, and the attention constant K a row's cost is weighed with.

A training step costs about 6 x params FLOPs per token (forward and backward), and causal attention
about 6 x layers x d_model x L^2 more per sample of L tokens (its two L x L products, halved by the
causal mask, forward and backward). In tokens' worth, a row then costs its tokens plus, for each of its
samples, L^2 / K, with K = params / (layers x d_model): 7e9 / (32 x 4096), about 53,400, for a 7B-class
model. ``--balance-model`` is one of ``MODEL_SHAPES`` or ``LAYERS,D_MODEL,PARAMS`` (``32,4096,7e9``;
PARAMS may end in ``B`` or ``M``). ``check_balance`` refuses ``--balance compute`` or a model without
``--world-size`` above 1, whose steps they weigh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from packcli.errors import Opt, UsageError


@dataclass(frozen=True)
class ModelShape:
    """A model's layers, width and parameters: what a row's cost is weighed with."""

    layers: int
    d_model: int
    params: float

    @property
    def k(self) -> float:
        """K of a row's cost, tokens + sum(L^2) / K: params / (layers x d_model)."""
        return self.params / (self.layers * self.d_model)


DEFAULT_MODEL = "7b"
# Common sizes by name: the shapes of well-known models of each class (dense; for a mixture of experts,
# give its active parameters as PARAMS).
MODEL_SHAPES: dict[str, ModelShape] = {
    "1b": ModelShape(16, 2048, 1.2e9),
    "3b": ModelShape(28, 3072, 3.2e9),
    "7b": ModelShape(32, 4096, 7e9),
    "8b": ModelShape(32, 4096, 8e9),
    "13b": ModelShape(40, 5120, 13e9),
    "32b": ModelShape(64, 5120, 32e9),
    "70b": ModelShape(80, 8192, 70e9),
}
_SUFFIX = {"b": 1e9, "m": 1e6}


def model_shape(value: str) -> ModelShape:
    """Return the shape ``--balance-model`` names: a size of ``MODEL_SHAPES`` or ``LAYERS,D_MODEL,PARAMS``."""
    named = MODEL_SHAPES.get(value.strip().lower())
    if named is not None:
        return named
    parts = [p.strip() for p in value.split(",")]
    shape = None
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
        raw = parts[2].lower()
        scale = _SUFFIX.get(raw[-1:], 1.0)
        try:
            params = float(raw[:-1] if raw[-1:] in _SUFFIX else raw) * scale
        except ValueError:
            params = math.nan
        if int(parts[0]) >= 1 and int(parts[1]) >= 1 and math.isfinite(params) and params >= 1:
            shape = ModelShape(int(parts[0]), int(parts[1]), params)
    if shape is None:
        raise UsageError(
            f"takes a size ({', '.join(MODEL_SHAPES)}) or LAYERS,D_MODEL,PARAMS (e.g. 32,4096,7e9), not '{value}'",
            option="balance_model",
        )
    return shape


class Balanced(Protocol):
    """The options ``check_balance`` reads."""

    @property
    def world_size(self) -> int: ...
    @property
    def balance(self) -> str: ...
    @property
    def balance_model(self) -> str: ...


def check_balance(config: Balanced) -> None:
    """Refuse a model shape that names nothing, and --balance compute or a model without ranks to balance."""
    model_shape(config.balance_model)
    if config.world_size > 1:
        return
    for name, given in (
        ("balance", config.balance != "tokens"),
        ("balance_model", config.balance_model != DEFAULT_MODEL),
    ):
        if given:
            raise UsageError(
                "weighs the steps of ",
                Opt("world_size"),
                ", which one rank does not have",
                option=name,
                hint=("pass ", Opt("world_size"), " N (the data-parallel ranks)"),
            )
