"""An httpx transport for the streaming path: HTTP/1.1 on asyncio sockets, each read stamped by the kernel.

The measuring client is written against httpx (its API, its exceptions, ``MockTransport`` in
tests); this transport only changes who reads the wire, and when the bytes are said to have
arrived. A server step writes a chunk to every stream at once, and one Python event loop
spends 30-90 us of CPU per chunk (docs/measure.md), so with 64 streams the last socket of a
burst is read milliseconds after its data came in: any time the process takes itself (in a
protocol callback, or when a task reads) carries that queueing. The kernel's receive timestamp does not
(``runtime/kernel_stamps.py``, which also says what the stamp of a TCP read means).

Each connection (``runtime/connection.py``) is a non-blocking socket with ``SO_TIMESTAMPNS``
set; while a response is read, an ``add_reader`` callback drains it with ``recvmsg`` and keeps
(bytes, stamp) per read, TLS decrypted on the way for https. The response's
``extensions[ARRIVALS]`` is an ``ArrivalTimes`` that gives, for each piece of body handed out,
the arrival of any byte of it. ``stamps="socket"`` takes ``perf_counter`` in that callback
instead and ``stamps="read"`` leaves the time to the reader (``bench/client_overhead.py``
compares the three). Without kernel stamps (not Linux) the callback's time is used.

h11 frames each request and response (``runtime/http1.py``): it is given the reads one at a
time, so the body bytes it hands back keep the stamp of the read they came in. h11 decides
whether a connection may carry another request; this transport keeps the idle ones and checks
before reuse that the server has not closed one meanwhile (llama.cpp closes after every
streamed response; a close that races the next request is left to the client's retry). No
proxies or HTTP/2; httpx decodes any Content-Encoding above. Failures surface as httpx exceptions:
ConnectError/ConnectTimeout (TLS verification included), RemoteProtocolError when the server
closes before or in the middle of a response or sends a malformed one, ReadError,
ReadTimeout and WriteTimeout (``timeout_s``, each wait), LocalProtocolError for a request h11
will not write, UnsupportedProtocol.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from typing import Literal

import h11
import httpx

from specsweep.runtime.connection import Connection, open_connection
from specsweep.runtime.http1 import Exchange

# The response extension that carries an ArrivalTimes for the body being read.
ARRIVALS = "specsweep.arrivals"
Stamps = Literal["kernel", "socket", "read"]
_Reads = list[tuple[bytes, float]]  # (bytes, arrival) per read, as a connection takes them

_DEFAULT_PORTS = {"http": 80, "https": 443}


class ArrivalTimes:
    """When the bytes of the piece of body last read arrived: ``at(offset)`` for any offset in it."""

    __slots__ = ("_read_at", "_segments")

    def __init__(self) -> None:
        self._segments: list[tuple[int, float]] = []  # (end offset in the piece, arrival)
        self._read_at = 0.0

    def at(self, offset: int) -> float:
        """Arrival time of the byte at ``offset`` of the last piece (its read time if unknown)."""
        for end, arrived in self._segments:
            if offset < end:
                return arrived
        return self._read_at


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(
        self, transport: Http1Transport, connection: Connection, exchange: Exchange, early: _Reads,
        arrivals: ArrivalTimes,
    ) -> None:  # fmt: skip
        self._transport = transport
        self._connection = connection
        self._exchange = exchange
        self._early = early  # body bytes that came with the head, with their stamps
        self._times = arrivals
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        exchange, connection, times = self._exchange, self._connection, self._times
        timeout_s = self._transport.timeout_s
        pieces, self._early = self._early, []
        while True:
            if pieces:
                segments = times._segments
                segments.clear()
                total = 0
                for piece, stamp in pieces:
                    total += len(piece)
                    segments.append((total, stamp))
                times._read_at = time.perf_counter()
                yield pieces[0][0] if len(pieces) == 1 else b"".join(piece for piece, _ in pieces)
            if exchange.done:
                return
            try:
                reads = await connection.take(timeout_s)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out reading the response") from None
            except OSError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from None
            if not reads:
                exchange.feed_end()
            pieces = [(piece, stamp) for data, stamp in reads if (piece := exchange.feed(data))]

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._transport._give_back(self._connection, self._exchange.reusable)


class Http1Transport(httpx.AsyncBaseTransport):
    """Sends httpx requests over pooled keep-alive HTTP/1.1 connections, stamping arrival in the kernel."""

    def __init__(
        self, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0, stamps: Stamps = "kernel",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        """``timeout_s`` bounds each wait for the server (head, any body read, the write); https
        verifies with ``ssl_context``, by default httpx's (certifi, SSL_CERT_FILE)."""
        if stamps not in ("kernel", "socket", "read"):
            raise ValueError(f"stamps must be 'kernel', 'socket' or 'read', got {stamps!r}")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.stamps: Stamps = stamps
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._open: set[Connection] = set()
        self._ssl_context = ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"{scheme!r} URLs are not supported", request=request)
        exchange = Exchange()
        data = exchange.request_bytes(request, await request.aread())
        key = (scheme, request.url.host, request.url.port or _DEFAULT_PORTS[scheme])
        connection = self._idle_connection(key) or await self._connect(key, request)
        try:
            await self._send(connection, data, request)
            head, early = await self._read_head(connection, exchange, request)
        except BaseException:
            self._give_back(connection, reusable=False)
            raise
        arrivals = ArrivalTimes()
        stream = _ResponseStream(self, connection, exchange, early, arrivals)
        extensions = {} if self.stamps == "read" else {ARRIVALS: arrivals}
        return httpx.Response(
            status_code=head.status_code, headers=head.headers.raw_items(), stream=stream, request=request,
            extensions=extensions,
        )  # fmt: skip

    def _idle_connection(self, key: tuple[str, str, int]) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            self._give_back(connection, reusable=False)
        return None

    async def _connect(self, key: tuple[str, str, int], request: httpx.Request) -> Connection:
        scheme, host, port = key
        if scheme == "https" and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context()
            self._ssl_context.set_alpn_protocols(["http/1.1"])
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                connection = await open_connection(
                    key,
                    kernel_stamps=self.stamps == "kernel",
                    tls_context=self._ssl_context if scheme == "https" else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        self._open.add(connection)
        return connection

    async def _send(self, connection: Connection, data: bytes, request: httpx.Request) -> None:
        try:
            await connection.send(data, self.timeout_s)
        except TimeoutError:
            raise httpx.WriteTimeout("timed out sending the request", request=request) from None
        except OSError as exc:
            raise httpx.RemoteProtocolError(
                f"Server disconnected without sending a response ({exc})", request=request
            ) from None

    async def _read_head(
        self, connection: Connection, exchange: Exchange, request: httpx.Request
    ) -> tuple[h11.Response, _Reads]:
        """The final (non-1xx) response head, and the body bytes read with it, with their stamps."""
        early: _Reads = []
        while exchange.response is None:
            try:
                reads = await connection.take(self.timeout_s)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out waiting for the response", request=request) from None
            except OSError as exc:
                raise httpx.RemoteProtocolError(
                    f"Server disconnected without sending a response ({exc})", request=request
                ) from None
            if not reads:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
            early += [(piece, stamp) for data, stamp in reads if (piece := exchange.feed(data))]
        return exchange.response, early

    def _give_back(self, connection: Connection, reusable: bool) -> None:
        if reusable and connection.release() and connection in self._open:
            self._idle.setdefault(connection.key, []).append(connection)
            return
        connection.close()
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()
