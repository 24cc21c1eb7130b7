"""What an image costs in prompt tokens, read from its header alone.

Measured against qwen3.6: the vision encoder downscales an image to fit within 2048x2048 and
spends one token per 32x32 patch plus two delimiter tokens, never fewer than 256 nor more
than 4096. Pricing every image by its own pixels (instead of a flat constant) is what lets the
window accounting see a session full of screenshots.

Only the header is read (``Image.open`` is lazy; ``.load()`` is never called), so pricing a
large image costs no decoding.
"""

from __future__ import annotations

import io
import math
import warnings

from PIL import Image

MAX_SIDE = 2048
PATCH = 32
DELIMITER_TOKENS = 2
MIN_TOKENS = 256
MAX_TOKENS = 4096
DEFAULT_FALLBACK_TOKENS = 1024


class _TooLarge(Exception):
    """The header is readable but declares more pixels than Pillow agrees to open."""


def _open_header(data: bytes) -> Image.Image | None:
    """Open lazily; None when the bytes are not an image Pillow can identify."""
    try:
        with warnings.catch_warnings():
            # The bomb *warning* is about decoding, which we never do.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise _TooLarge from exc
    except Exception:  # noqa: BLE001 - plugins raise OSError, SyntaxError, struct.error, ...
        return None


def _header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header; raises _TooLarge for decompression bombs."""
    image = _open_header(data)
    if image is None:
        return None
    with image:
        width, height = image.size
    if width <= 0 or height <= 0:
        return None
    return width, height


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header, or None when it cannot be read."""
    try:
        return _header_size(data)
    except _TooLarge:
        return None


def _fit_within(width: int, height: int, limit: int = MAX_SIDE) -> tuple[int, int]:
    """Downscale (never upscale) to fit a limit x limit box, keeping the aspect ratio."""
    if width <= limit and height <= limit:
        return width, height
    scale = min(limit / width, limit / height)
    # min(limit, ...) guards against float error pushing a side to limit + 1.
    return (
        max(1, min(limit, round(width * scale))),
        max(1, min(limit, round(height * scale))),
    )


def tokens_for_size(width: int, height: int) -> int:
    """Token cost of an image of the given pixel size."""
    width, height = _fit_within(width, height)
    raw = math.ceil(width / PATCH) * math.ceil(height / PATCH) + DELIMITER_TOKENS
    return max(MIN_TOKENS, min(MAX_TOKENS, raw))


def image_tokens(data: bytes, fallback: int = DEFAULT_FALLBACK_TOKENS) -> int:
    """Token cost of one image; ``fallback`` when its header cannot be read."""
    try:
        size = _header_size(data)
    except _TooLarge:
        # Pillow refuses even to open it: far beyond 2048² px, so it is priced at the cap
        # (only an extreme aspect ratio would cost less, and that needs the header).
        return MAX_TOKENS
    if size is None:
        return fallback
    return tokens_for_size(*size)
