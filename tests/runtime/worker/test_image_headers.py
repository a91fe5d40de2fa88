"""An image's pixels are counted from its header before it is decoded (ortinf/runtime/worker/images.py): a file is
opened, never read whole for the count, and the count refuses a request whose images are too many pixels together."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from ortinf.errors import RequestError
from ortinf.runtime.worker.images import MAX_REQUEST_PIXELS, check_request_pixels, declared_pixels


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_file_is_counted_from_its_header(tmp_path):
    path = tmp_path / "big.png"
    path.write_bytes(png(640, 480) + bytes(32 << 20))  # 32 MiB past the image: a full read would allocate them
    tracemalloc.start()
    try:
        assert declared_pixels(path) == declared_pixels(str(path)) == 640 * 480
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes allocated to read a header"
    assert declared_pixels(png(7, 3)) == 21 and declared_pixels(np.zeros((5, 4, 3), np.uint8)) == 20
    assert declared_pixels(b"not an image") == 0 and declared_pixels(tmp_path / "missing.png") == 0


def test_too_many_pixels_together_are_refused_before_decoding():
    side = int(MAX_REQUEST_PIXELS ** 0.5) + 1
    huge = png(side, side)
    with pytest.raises(RequestError, match="pixels together"):
        check_request_pixels([huge])
    check_request_pixels([png(64, 64)] * 4)
