"""An MCP tool's result as the model reads it: text blocks as text, images attached, embedded text
resources as their text, what cannot be shown named in a line. Capped: a server may answer with
megabytes, and what is kept is stored with the session. Pure (images are checked by their header)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from palimpsest.shared.image_tokens import image_size

# Kept of a result's text: the Compressor cuts what the model sees to its view budget anyway, and the
# stored result should stay a fraction of a message's size cap.
MAX_TEXT_CHARS = 100_000
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # all of one result's images together


@dataclass
class Converted:
    text: str
    images: list[bytes] = field(default_factory=list)
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


def convert(result: Any) -> Converted:
    """A CallToolResult's content blocks as one text and the images to attach."""
    parts: list[str] = []
    images: list[bytes] = []
    image_bytes = 0
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            data = _decoded(block.data)
            size = image_size(data) if data else None
            if size is None:
                parts.append(f"[an image ({block.mime_type}) that could not be read was left out]")
            elif len(images) >= MAX_IMAGES or image_bytes + len(data) > MAX_IMAGE_BYTES:
                parts.append(
                    f"[an image left out: at most {MAX_IMAGES} images and "
                    f"{MAX_IMAGE_BYTES // (1024 * 1024)} MB per result]"
                )
            else:
                images.append(data)
                image_bytes += len(data)
                parts.append(f"[image {len(images)} attached: {size[0]}×{size[1]} {block.mime_type}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(f"[resource {resource.uri}]\n{text}")
            else:
                parts.append(f"[resource {resource.uri} ({resource.mime_type or 'binary'}) is binary: left out]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        elif kind == "audio":
            parts.append(f"[audio ({block.mime_type}) left out: the model cannot hear]")
        else:
            parts.append(f"[a {kind or 'content'} block left out]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    metadata: dict[str, Any] = {}
    if len(text) > MAX_TEXT_CHARS:
        metadata["cut_from_chars"] = len(text)
        text = text[:MAX_TEXT_CHARS] + f"\n[… cut: the result had {len(text):,} characters]"
    return Converted(text=text, images=images, is_error=bool(getattr(result, "is_error", False)), metadata=metadata)


def _decoded(data: Any) -> bytes:
    if not isinstance(data, str):
        return b""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return b""
