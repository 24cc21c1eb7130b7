"""Image pricing from the header: the edges of the downscale, the patch grid and the clamp."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from palimpsest.shared.image_tokens import (
    MAX_TOKENS,
    MIN_TOKENS,
    image_size,
    image_tokens,
    tokens_for_size,
)


def make_image(width: int, height: int, fmt: str = "PNG") -> bytes:
    # Mode "1" keeps even large test images small and fast to encode.
    mode = "RGB" if fmt in {"JPEG", "WEBP"} else "1"
    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("width", "height", "expected"),
    [
        (1024, 1024, 32 * 32 + 2),  # 1026
        (512, 512, 16 * 16 + 2),  # 258: a 512² thumbnail sits just above the 256 floor
        (2048, 2048, MAX_TOKENS),  # 64*64+2 = 4098, clamped
        (2049, 2049, MAX_TOKENS),  # downscaled to 2048², then clamped
        (1, 10000, MIN_TOKENS),  # downscaled to 1x2048: 1*64+2 = 66 -> floor
        (10, 10, MIN_TOKENS),
        (4096, 1024, 64 * 16 + 2),  # halved to 2048x512
        (1000, 700, 32 * 22 + 2),  # ceil(1000/32)=32, ceil(700/32)=22
    ],
)
def test_image_tokens_edges(width: int, height: int, expected: int) -> None:
    assert image_tokens(make_image(width, height)) == expected


def test_downscale_keeps_aspect_ratio_for_wide_images() -> None:
    # 6000x3000 -> 2048x1024 -> 64*32+2 = 2050
    assert tokens_for_size(6000, 3000) == 2050


def test_1024_costs_four_times_512_area() -> None:
    big, small = image_tokens(make_image(1024, 1024)), image_tokens(make_image(512, 512))
    assert big - 2 == 4 * (small - 2)


def test_corrupt_header_uses_default_fallback() -> None:
    assert image_tokens(b"\x89PNG\r\n\x1a\nnot really a png") == 1024
    assert image_tokens(b"") == 1024


def test_custom_fallback() -> None:
    assert image_tokens(b"definitely not an image", fallback=777) == 777


def test_truncated_image_still_priced_from_header() -> None:
    data = make_image(1024, 1024)
    # The header survives; the pixel data does not. Pricing never decodes, so it still works.
    assert image_tokens(data[:64]) == 1026


def test_image_size_reads_header_only() -> None:
    assert image_size(make_image(640, 480)) == (640, 480)
    assert image_size(make_image(640, 480, "JPEG")) == (640, 480)
    assert image_size(b"garbage") is None


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature plus IHDR: enough for the header reader, no pixel data at all."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    signature = b"\x89PNG\r\n\x1a\n"
    header = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    # Pillow peeks at the next chunk's header before it reports a size, so end with IEND.
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return signature + header + end


def test_header_only_png_is_priced() -> None:
    assert image_tokens(png_header_only(1024, 1024)) == 1026


def test_decompression_bomb_is_priced_at_the_cap() -> None:
    # Pillow refuses to open 30000² px at all; it is still an image far beyond 2048².
    data = png_header_only(30000, 30000)
    assert image_tokens(data) == MAX_TOKENS
    assert image_size(data) is None
