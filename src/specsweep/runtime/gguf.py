"""A GGUF file's metadata: its key-value header, read without loading any tensor.

The layout (GGUF versions 2 and 3, as llama.cpp's ``ggml/src/gguf.cpp`` reads it, little-endian):
the magic ``GGUF``, a u32 version, a u64 tensor count, a u64 key-value count, then each pair as a
string key (u64 length, bytes), a u32 value type and the value. Strings are a u64 length and
bytes; an array is a u32 element type, a u64 count and the elements. Only scalars are kept:
arrays (the tokenizer's vocabulary) are skipped.

Nothing raises: a file that cannot be read as GGUF gives None.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
# value type -> struct format of a scalar (gguf.h, enum gguf_type)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# a header past these is not one a real model has: read no further
_MAX_PAIRS = 1 << 20
_MAX_STRING = 1 << 26


class _NotGguf(Exception):
    pass


def gguf_metadata(path: str | Path) -> dict[str, Any] | None:
    """Every scalar key of ``path``'s GGUF header (strings, numbers, booleans), or None where the
    file is missing, unreadable or not GGUF."""
    try:
        with open(path, "rb") as file:
            if file.read(4) != MAGIC:
                return None
            version = _read(file, "<I")
            if version < 2:
                return None  # version 1 counted with u32s: no model a current llama.cpp loads
            _read(file, "<Q")  # tensors
            pairs = _read(file, "<Q")
            if pairs > _MAX_PAIRS:
                return None
            found: dict[str, Any] = {}
            for _ in range(pairs):
                key = _string(file)
                kind = _read(file, "<I")
                value = _value(file, kind)
                if kind != _ARRAY:
                    found[key] = value
            return found
    except (OSError, _NotGguf, struct.error, UnicodeDecodeError):
        return None


def _read(file: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = file.read(size)
    if len(data) != size:
        raise _NotGguf
    return struct.unpack(fmt, data)[0]


def _string(file: IO[bytes]) -> str:
    length = _read(file, "<Q")
    if length > _MAX_STRING:
        raise _NotGguf
    data = file.read(length)
    if len(data) != length:
        raise _NotGguf
    return data.decode("utf-8")


def _value(file: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        return _read(file, _SCALARS[kind])
    if kind == _STRING:
        return _string(file)
    if kind != _ARRAY:
        raise _NotGguf
    inner = _read(file, "<I")
    count = _read(file, "<Q")
    if inner in _SCALARS:
        file.seek(count * struct.calcsize(_SCALARS[inner]), 1)
    elif inner == _STRING:
        for _ in range(count):
            file.seek(_read(file, "<Q"), 1)
    else:
        raise _NotGguf  # nested arrays: no key a model's header needs here
    return None
