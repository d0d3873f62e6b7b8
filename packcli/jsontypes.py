"""Names for the JSON packcli does not give a shape to.

packcli's own structured data (the summary, the manifest, the store's metadata, the shard entries, the
report results) is typed in ``packcli.results`` and beside the code that makes it. What is left is JSON
whose keys belong to someone else: the user's records, the chat messages and tool definitions a chat
template reads, the kwargs it takes, the files of other tools. Each name below says which, so that a
signature reads as what it carries; each is ``dict[str, Any]`` because any key may be there.
"""

from __future__ import annotations

from typing import Any, TypeAlias

# A JSON object as read from or written to a file: any keys, any JSON values. Used for data checked
# key by key where it is read (a manifest verify must not trust, a foreign tool's file) and for the
# JSON form of the typed results (their ``to_dict()``).
JSONObject: TypeAlias = dict[str, Any]

# One training record as the input file holds it: its keys are the user's (messages, prompt, chosen,
# text, images, and whatever else the dataset carries).
Record: TypeAlias = dict[str, Any]

# One chat message as a chat template reads it: role and content, and whatever else the dataset or the
# template uses (tool_calls, reasoning_content, name, train marks...).
ChatMessage: TypeAlias = dict[str, Any]

# Keyword arguments handed to a chat template or a model's processor: names only they know.
TemplateKwargs: TypeAlias = dict[str, Any]

# One part of a message's content list ({"type": "text", "text": ...}, {"type": "image", ...}): the
# dataset's and the chat template's keys, as a ChatMessage's are.
ContentPart: TypeAlias = dict[str, Any]
