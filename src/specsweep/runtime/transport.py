"""An httpx transport that does its socket and HTTP/1.1 work with aiohttp.

The measuring client is written against httpx (its API, its exceptions, ``MockTransport`` in
tests); this transport only changes who reads the wire. httpx's default stack (httpcore on
anyio, h11) costs about 290 us of CPU per streamed chunk here, aiohttp's C parser about 80
(``bench/client_overhead.py``), and under speculative decoding a client at 64 streams receives
thousands of chunks a second: the difference decides whether the client's own timestamps stay
within a millisecond or two of the server's writes.

Arrival times are taken where the bytes come off the socket, in the connection's protocol
callback, not where a task gets round to reading them: when a server step writes to 64
streams at once, the event loop runs all 64 socket callbacks before any stream's task
resumes, so a stamp taken at read time would include the parsing of every stream served
before it. The stamps reach the client through the response's ``extensions`` (ARRIVALS).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import StreamReader

# The response extension that carries an ArrivalTimes for the body being read.
ARRIVALS = "specsweep.arrivals"


class _StampingHandler(ResponseHandler):
    """aiohttp's response protocol, noting when each read from the socket arrived.

    Each entry is (the body's reader, its payload bytes so far, perf_counter at arrival):
    payload bytes rather than socket bytes, so chunked-encoding framing does not shift them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: deque[tuple[StreamReader, int, float]] = deque()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        super().data_received(data)
        reader = self._payload
        if isinstance(reader, StreamReader) and reader.total_bytes:
            self.arrivals.append((reader, reader.total_bytes, now))


class _StampingConnector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(_StampingHandler, loop=self._loop)


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


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, arrivals: ArrivalTimes) -> None:
        self._response = response
        self._times = arrivals
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        self._protocol = protocol if isinstance(protocol, _StampingHandler) else None

    def _note_arrivals(self, consumed: int, end: int) -> None:
        """Move the protocol's stamps for payload bytes consumed..end into the piece's segments."""
        times = self._times
        times._read_at = time.perf_counter()
        times._segments.clear()
        if self._protocol is None:
            return
        reader, pending = self._response.content, self._protocol.arrivals
        while pending:
            owner, total, arrived = pending[0]
            if owner is not reader or total <= consumed:
                pending.popleft()  # another response's, or bytes already handed out
                continue
            times._segments.append((min(total, end) - consumed, arrived))
            if total > end:
                break
            pending.popleft()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        consumed = 0
        try:
            async for data in self._response.content.iter_any():
                self._note_arrivals(consumed, consumed + len(data))
                consumed += len(data)
                yield data
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
            raise httpx.RemoteProtocolError(f"peer closed the connection mid-response ({exc})") from None
        except aiohttp.ClientConnectionError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from None
        except TimeoutError:
            raise httpx.ReadTimeout("timed out reading the response") from None

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests through one aiohttp session (connections pooled and kept alive)."""

    def __init__(
        self, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0, stamp_arrivals: bool = True
    ) -> None:
        """``stamp_arrivals=False`` leaves arrival times to the reader (bench/client_overhead.py compares)."""
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=timeout_s)
        self._connector_class = _StampingConnector if stamp_arrivals else aiohttp.TCPConnector
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = self._connector_class(limit=0, force_close=False, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in ("host", "content-length")]
        try:
            response = await self._get_session().request(
                request.method, str(request.url), data=body or None, headers=headers, allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc), request=request) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise httpx.RemoteProtocolError(
                f"Server disconnected without sending a response ({exc})", request=request
            ) from None
        except aiohttp.ClientError as exc:
            raise httpx.TransportError(f"{type(exc).__name__}: {exc}", request=request) from None
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting", request=request) from None
        arrivals = ArrivalTimes()
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_AiohttpStream(response, arrivals),
            request=request,
            extensions={ARRIVALS: arrivals},
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
            await asyncio.sleep(0)  # let aiohttp finish closing its connections
