"""HTTP/1.1 framing for the streaming transport: h11, fed one timestamped read at a time, no I/O.

h11 writes the request and reads the response: status line and headers, 1xx responses,
chunked, Content-Length or close-delimited bodies, and whether the connection may carry
another request. What it cannot know is when the bytes arrived. ``Exchange.feed`` gives h11
one read and takes every event that read completes before the next read goes in. h11 hands
out body bytes as soon as it holds them and keeps back only framing whose end it has not seen
(a chunk-size or trailer line, a chunk's closing CRLF, the head), so the body bytes one
``feed`` returns all came in the read it was given, and carry that read's stamp.

h11's errors become httpx's (RemoteProtocolError for a malformed response or one the server
ended early, LocalProtocolError for a request h11 will not write), so the transport raises
only httpx exceptions.
"""

from __future__ import annotations

import h11
import httpx

# The longest head (or chunk-size or trailer line) h11 waits for before refusing the response.
_MAX_HEAD = 64 * 1024
_DATA, _RESPONSE, _END, _INFORMATIONAL = h11.Data, h11.Response, h11.EndOfMessage, h11.InformationalResponse


class Exchange:
    """One request and its response on a connection, framed by h11."""

    __slots__ = ("_h11", "done", "response")

    def __init__(self) -> None:
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        self.response: h11.Response | None = None  # the final (non-1xx) head, once it has come
        self.done = False  # the whole response has been read

    def request_bytes(self, request: httpx.Request, body: bytes) -> bytes:
        """The request head and body; the body is whole, so Content-Length replaces any chunked framing."""
        headers = [
            (name, value)
            for name, value in request.headers.raw
            if name.lower() not in (b"content-length", b"transfer-encoding")
        ]
        if body or request.method in ("POST", "PUT", "PATCH"):
            headers.append((b"Content-Length", b"%d" % len(body)))
        send = self._h11.send
        try:
            head = send(h11.Request(method=request.method, target=request.url.raw_path, headers=headers))
            return head + (send(h11.Data(data=body)) if body else b"") + send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(f"cannot send this request: {exc}", request=request) from None

    def feed(self, data: bytes) -> bytes:
        """The body bytes in this read (once the head is in ``response``); raises httpx.RemoteProtocolError."""
        self._h11.receive_data(data)
        try:
            return self._drain()
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(f"malformed response: {exc}") from None

    def feed_end(self) -> None:
        """The server closed the connection: the end of a close-delimited body, else an error."""
        self._h11.receive_data(b"")
        try:
            self._drain()
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(f"peer closed the connection mid-response ({exc})") from None
        if not self.done:
            raise httpx.RemoteProtocolError("peer closed the connection mid-response")

    def _drain(self) -> bytes:
        """Every event h11 can make of what it holds; the body bytes among them."""
        next_event = self._h11.next_event
        parts = []
        while True:
            event = next_event()
            kind = type(event)
            if kind is _DATA:
                parts.append(event.data)  # type: ignore[union-attr]
            elif kind is _RESPONSE:
                self.response = event  # type: ignore[assignment]
            elif kind is _END:
                self.done = True
                break
            elif kind is not _INFORMATIONAL:  # NEED_DATA, or PAUSED by bytes after the response
                break
        return b"".join(parts)

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry another request: h11 says both sides are done, nothing came after."""
        connection = self._h11
        return (
            connection.our_state is h11.DONE
            and connection.their_state is h11.DONE
            and connection.trailing_data == (b"", False)
        )
