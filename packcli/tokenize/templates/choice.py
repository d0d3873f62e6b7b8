"""Which chat template a run renders with: one of packcli's, a file, or the tokenizer's own.

packcli ships its templates as ``packcli/templates/<name>.jinja`` (``chatml``, ``deepseek``; the names are
``config.BUILTIN_TEMPLATES``). ``--chat-template`` names one of them or a file; without it the tokenizer's
own template is used, and a tokenizer without one gets packcli's ``deepseek`` template when it has that
format's markers as added tokens, ``chatml`` otherwise. Rendering a template and finding its spans is
``packcli.tokenize.templates.chat_template``.
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli.config import BUILTIN_TEMPLATES
from packcli.errors import Opt, TokenizerError

# The markers of the default tokenizer's own format: a tokenizer without a chat template that has them
# as added tokens gets the "deepseek" template; one with ChatML's the "chatml" one. Any other has no
# template packcli could choose (chat records need --chat-template).
DEEPSEEK_MARKERS = ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")


def builtin_name(chat_template: str | None) -> str | None:
    """Return the packcli template ``--chat-template`` names (``chatml``), or None for a file's path.

    A file of that name in the current directory is the file: the name only stands for packcli's own
    template where no such file exists.
    """
    if chat_template in BUILTIN_TEMPLATES and not os.path.exists(chat_template):
        return chat_template
    return None


def builtin_template(name: str) -> str:
    """Return the text of one of packcli's templates (``chatml``, ``deepseek``)."""
    return importlib.resources.files("packcli").joinpath(f"templates/{name}.jinja").read_text(encoding="utf-8")


def read_chat_template(path: str) -> str:
    """Return the text of a chat template file; one that cannot be read, or is empty, is an error."""
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read the chat template ({exc})") from exc
    if not template.strip():
        raise TokenizerError(
            f"{path}: the chat template file is empty",
            hint=("give a Jinja chat template, or leave ", Opt("chat_template"), " out"),
        )
    return template


@dataclass(frozen=True)
class GivenTemplate:
    """``--chat-template`` as a run names it, read once before any input is read (``given_template``)."""

    given: str | None  # as given: one of packcli's templates by name, a file's path, or None
    builtin: str | None  # the packcli template it names, or None
    text: str | None  # the named template's text, or the file's; None when none is given

    @property
    def shown(self) -> tuple[str, str] | None:
        """How the manifest names it (``chat_template``, ``chat_template_source``), or None when none is given."""
        if self.builtin is not None:
            return self.builtin, "packcli"
        return (str(self.given), "file") if self.given is not None else None


def given_template(chat_template: str | None) -> GivenTemplate:
    """``--chat-template``, read: one of packcli's templates, or a file (one that cannot be read, or is empty,
    is an error), or None."""
    builtin = builtin_name(chat_template)
    if builtin is not None:
        return GivenTemplate(chat_template, builtin, builtin_template(builtin))
    return GivenTemplate(chat_template, None, read_chat_template(chat_template) if chat_template is not None else None)


@dataclass(frozen=True)
class TemplateChoice:
    """The template a run renders with, and where it comes from."""

    text: str
    name: str  # the manifest's chat_template: a packcli template's name, the file's path, or "tokenizer"
    # "file" (a path), "packcli" (one of packcli's, named), "tokenizer" (the tokenizer's own) or
    # "default" (packcli's for a tokenizer without one).
    origin: str
    source: str  # how errors name the template
    # A tokenizer without a template of its own nor the markers of one of packcli's: the ChatML it gets
    # would write role markers that are not its tokens, so rendering a chat is refused (``no_template``).
    guessed: bool = False


def choose_template(chat_template_file: str | None, own: Any, added_tokens: Collection[str]) -> TemplateChoice:
    """Return the template for ``--chat-template`` (None: not given), given the tokenizer's own template
    (``tokenizer.chat_template``: a string, a dict of named templates, or None) and its added tokens."""
    name = builtin_name(chat_template_file)
    if name is not None:
        return TemplateChoice(builtin_template(name), name, "packcli", f"packcli template '{name}'")
    if chat_template_file is not None:
        path = str(chat_template_file)
        return TemplateChoice(read_chat_template(chat_template_file), path, "file", path)
    if isinstance(own, dict):
        own = own.get("default")
    if own:
        return TemplateChoice(own, "tokenizer", "tokenizer", "tokenizer")
    # The default tokenizer has no template of its own: its own markers' format, never ChatML's, whose
    # markers it would encode as several ordinary tokens each.
    name = "deepseek" if all(m in added_tokens for m in DEEPSEEK_MARKERS) else "chatml"
    source = f"packcli template '{name}' (the default for a tokenizer without one)"
    guessed = name == "chatml" and not all(m in added_tokens for m in CHATML_MARKERS)
    return TemplateChoice(builtin_template(name), name, "default", source, guessed)


def no_template(tokenizer_name: str) -> TokenizerError:
    """Return the error for rendering a chat with a tokenizer that has no chat template packcli can choose."""
    return TokenizerError(
        f"tokenizer '{tokenizer_name}' has no chat template, and ChatML's role markers (<|im_start|>, "
        "<|im_end|>) are not tokens of it: chats rendered so would be in a format the model was never "
        "trained on",
        hint=("pass the model's chat template as ", Opt("chat_template"), " FILE.jinja"),
    )
