"""The names records are read by: the record formats, the default field names (renamed with
``--field``), the chat roles and the speaker names mapped to them, and the template keyword arguments a
record or the run may not set. Re-exported by ``packcli.records.formats``.
"""

from __future__ import annotations

from packcli.errors import Opt, Text

FORMATS = ("messages", "conversations", "prompt_completion", "alpaca", "text", "tokenized", "preference", "kto")
# Record formats whose records are not one SFT sample each (see packcli.records.preference).
PREFERENCE_FORMATS = ("preference", "kto")

DEFAULT_FIELDS: dict[str, str] = {
    "messages": "messages",
    "conversations": "conversations",
    "role": "role",
    "content": "content",
    "from": "from",
    "value": "value",
    "prompt": "prompt",
    "completion": "completion",
    "instruction": "instruction",
    "input": "input",
    "output": "output",
    "system": "system",
    "text": "text",
    "input_ids": "input_ids",
    "labels": "labels",
    "tools": "tools",
    "chat_template_kwargs": "chat_template_kwargs",
    "chosen": "chosen",
    "rejected": "rejected",
    "label": "label",
}

ROLES = ("system", "user", "assistant", "tool")

# ShareGPT speaker names seen in real exports, mapped to chat roles.
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "prompter": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "ai": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "observation": "tool",
    "ipython": "tool",
}


# Template keyword arguments packcli passes itself, or that would leave samples incomplete.
RESERVED_TEMPLATE_KWARGS: dict[str, Text] = {
    "continue_final_message": "leaves the last message open (its end-of-turn marker is dropped), and a packed "
    "sample must be complete so that the model learns where an answer ends; leave it out",
    "add_generation_prompt": "is set by packcli (false: a packed sample ends with its last message); leave it out",
    "tools": "comes from each record's own tools field; leave it out",
    "conversations": "is the record's messages; leave it out",
    "chat_template": ("is the template itself; pass ", Opt("chat_template"), " FILE instead"),
    "return_assistant_tokens_mask": "is set by packcli to find what is trained; leave it out",
}


# Role names of other tools and exports that name one chat role unambiguously (``--fix-turns`` renames
# them in message lists; ShareGPT speakers are always mapped, by SHAREGPT_ROLES). Matched case-insensitively.
# Left out: speakers only ShareGPT exports use, and roles templates know by their own name (Llama 3's
# "ipython" is its tool role; "function_call" and "function_response" are parts of a turn elsewhere).
_NOT_ALIASES = ("bing", "bard", "function_call", "function_response", "ipython")
ROLE_ALIASES: dict[str, str] = {name: role for name, role in SHAREGPT_ROLES.items() if name not in _NOT_ALIASES}
# Per-message training marks: "train" (true/false), and axolotl's "weight" (1/0).
TRAIN_KEYS = ("train", "weight")
