"""The HTTP/1.1 response framing the streaming transport needs (RFC 9112), with no I/O.

A response head is parsed once; its body is decoded read by read, as the bytes come, so that
each piece of payload keeps the arrival time of the read that brought it. Malformed input
raises ValueError (the transport turns it into httpx.RemoteProtocolError).
"""

from __future__ import annotations

from dataclasses import dataclass

_HEX_DIGITS = b"0123456789abcdefABCDEF"
_MAX_LINE = 8 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseHead:
    status: int
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool  # the server allows another request on this connection
    chunked: bool
    content_length: int | None


def parse_head(raw: bytes) -> ResponseHead:
    """The status line and header fields, without the blank line that ends them."""
    lines = raw.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: list[tuple[bytes, bytes]] = []
    connection_tokens: set[bytes] = set()
    chunked, content_length = False, None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise ValueError(f"malformed header line: {line[:80]!r}")
        value = value.strip()
        headers.append((name, value))
        lower = name.lower()
        if lower == b"transfer-encoding":
            chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
        elif lower == b"content-length":
            if not value.isdigit() or (content_length is not None and int(value) != content_length):
                raise ValueError(f"bad Content-Length: {value[:40]!r}")
            content_length = int(value)
        elif lower == b"connection":
            connection_tokens.update(token.strip().lower() for token in value.split(b","))
    # HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 only when asked to.
    keep_alive = b"keep-alive" in connection_tokens if version == b"HTTP/1.0" else b"close" not in connection_tokens
    return ResponseHead(
        status=int(code), headers=headers, keep_alive=keep_alive, chunked=chunked, content_length=content_length
    )


class BodyDecoder:
    """A body of known length (Content-Length, or none at all): ``feed`` returns the payload in it."""

    __slots__ = ("done", "remaining", "surplus")

    def __init__(self, length: int = 0) -> None:
        self.remaining = length
        self.done = length == 0
        self.surplus = False  # bytes came after the end of the body

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.surplus = self.surplus or bool(data)
            return b""
        piece = data[: self.remaining]
        self.remaining -= len(piece)
        if self.remaining == 0:
            self.done = True
            self.surplus = len(data) > len(piece)
        return piece

    def finish_at_close(self) -> bool:
        """Whether the server closing the connection ends the body (rather than truncating it)."""
        return False


class CloseDelimitedBody(BodyDecoder):
    """No length and not chunked: the body runs until the server closes the connection."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(1)

    def feed(self, data: bytes) -> bytes:
        return data

    def finish_at_close(self) -> bool:
        self.done = True
        return True


_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class ChunkedBody(BodyDecoder):
    """Transfer-Encoding: chunked, decoded incrementally (chunk extensions and trailers skipped)."""

    __slots__ = ("_pending", "_state")

    def __init__(self) -> None:
        super().__init__(1)
        self.remaining = 0
        self._state = _SIZE
        self._pending = b""  # an incomplete size or trailer line, or part of a chunk's CRLF

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return super().feed(data)
        buffer = self._pending + data if self._pending else data
        self._pending = b""
        parts: list[bytes] = []
        position, size = 0, len(buffer)
        while position < size:
            state = self._state
            if state == _DATA:
                end = min(position + self.remaining, size)
                parts.append(buffer[position:end])
                self.remaining -= end - position
                position = end
                if self.remaining == 0:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if size - position < 2:
                    self._pending = buffer[position:]
                    break
                if buffer[position : position + 2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                position += 2
                self._state = _SIZE
            else:
                end = buffer.find(b"\r\n", position)
                if end < 0:
                    if size - position > _MAX_LINE:
                        raise ValueError("chunk size or trailer line too long")
                    self._pending = buffer[position:]
                    break
                line = buffer[position:end]
                position = end + 2
                if state == _TRAILER:
                    if not line:
                        self.done = True
                        self.surplus = position < size
                        break
                    continue
                digits = line.split(b";", 1)[0].strip()
                if not digits or digits.strip(_HEX_DIGITS) or len(digits) > 16:
                    raise ValueError(f"bad chunk size line {line[:40]!r}")
                self.remaining = int(digits, 16)
                self._state = _DATA if self.remaining else _TRAILER
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


def body_decoder(head: ResponseHead, method: str) -> BodyDecoder:
    """How the body of this response is framed (RFC 9112 section 6.3)."""
    if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
        return BodyDecoder(0)
    if head.chunked:
        return ChunkedBody()
    if head.content_length is not None:
        return BodyDecoder(head.content_length)
    return CloseDelimitedBody()
