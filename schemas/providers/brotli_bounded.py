"""brotli decoding that stops at an output size.

The brotli module's ``Decompressor.process`` has no output bound (a bound came only in versions
the recorder's proxy does not install with): one byte of input can end a command that copies
16 MiB, and ``process`` returns all of it at once. The decoder itself can stop anywhere: its
streaming call (``BrotliDecoderDecompressStream``) writes at most the room it is given and says
when it needs more. That call is reached here through the brotli module's own compiled extension,
which carries the decoder (or links the system's ``libbrotlidec``, whose symbols it then shows).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

ROOM = 1 << 20
"""Bytes of output decoded per call: what is held above the limit at most."""

_ERROR, _SUCCESS, _NEEDS_MORE_INPUT, _NEEDS_MORE_OUTPUT = range(4)
_u8p = ctypes.POINTER(ctypes.c_uint8)
_sizep = ctypes.POINTER(ctypes.c_size_t)


class BrotliError(ValueError):
    """The body is not a brotli stream (corrupt) or no brotli decoder can be loaded."""


class BrotliTooLarge(ValueError):
    """The stream decodes to more than the limit."""


@functools.cache
def _decoder_library(path: str | None) -> Any:
    lib = ctypes.CDLL(path or ctypes.util.find_library("brotlidec") or "libbrotlidec.so.1")
    lib.BrotliDecoderCreateInstance.restype = ctypes.c_void_p
    lib.BrotliDecoderCreateInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.BrotliDecoderDestroyInstance.argtypes = [ctypes.c_void_p]
    lib.BrotliDecoderDecompressStream.restype = ctypes.c_int
    sized = (_sizep, ctypes.POINTER(_u8p))  # (bytes available, next byte): the input's, the output's
    lib.BrotliDecoderDecompressStream.argtypes = [ctypes.c_void_p, *sized, *sized, _sizep]
    lib.BrotliDecoderGetErrorCode.restype = ctypes.c_int
    lib.BrotliDecoderGetErrorCode.argtypes = [ctypes.c_void_p]
    lib.BrotliDecoderErrorString.restype = ctypes.c_char_p
    lib.BrotliDecoderErrorString.argtypes = [ctypes.c_int]
    return lib


def _library(brotli: Any) -> Any:
    """The decoder of ``brotli`` (the module): its extension's, else the system's."""
    path = getattr(getattr(brotli, "_brotli", None), "__file__", None)
    for candidate in dict.fromkeys((path, None)):
        try:
            return _decoder_library(candidate)
        except (OSError, AttributeError) as e:
            why = e
    raise BrotliError(f"no brotli decoder to call: {why}")


def available(brotli: Any) -> bool:
    """Whether a decoder that stops at a size can be called for ``brotli`` (the module)."""
    try:
        _library(brotli)
    except BrotliError:
        return False
    return True


def decode(data: bytes, brotli: Any, limit: int, out: bytearray) -> bool:
    """``data`` decoded onto ``out``, at most ``limit`` bytes in all (``BrotliTooLarge`` once there
    would be more, with no more than ``ROOM`` bytes of it ever held); whether the stream ended (its
    last meta-block decoded). ``BrotliError`` for a corrupt stream or data after its end, with
    ``out`` holding what decoded before it."""
    lib = _library(brotli)
    state = lib.BrotliDecoderCreateInstance(None, None, None)
    if not state:
        raise MemoryError("brotli: cannot make a decoder")
    source = ctypes.c_char_p(bytes(data))  # (the bytes' own buffer, not a copy; kept alive here)
    room = (ctypes.c_uint8 * ROOM)()
    next_in, available_in = ctypes.cast(source, _u8p), ctypes.c_size_t(len(data))
    try:
        while True:
            want = min(ROOM, limit + 1 - len(out))
            next_out, available_out = ctypes.cast(room, _u8p), ctypes.c_size_t(want)
            result = lib.BrotliDecoderDecompressStream(
                state, *map(ctypes.byref, (available_in, next_in, available_out, next_out)), None
            )
            out += memoryview(room)[: want - available_out.value]
            if len(out) > limit:
                raise BrotliTooLarge(f"the body decodes to more than {limit:,} bytes")
            if result == _NEEDS_MORE_OUTPUT:
                continue
            if result == _ERROR:
                why = lib.BrotliDecoderErrorString(lib.BrotliDecoderGetErrorCode(state)) or b"_ERROR"
                raise BrotliError(f"corrupt brotli stream ({why.decode('ascii', 'replace').strip('_')})")
            if result == _SUCCESS and available_in.value:
                raise BrotliError(f"{available_in.value:,} bytes after the end of the brotli stream")
            return bool(result == _SUCCESS)
    finally:
        lib.BrotliDecoderDestroyInstance(state)
