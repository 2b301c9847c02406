"""An httpx transport that does its socket and HTTP/1.1 work with aiohttp.

The measuring client is written against httpx (its API, its exceptions, ``MockTransport`` in
tests); this transport only changes who reads the wire. httpx's default stack (httpcore on
anyio, h11) costs about 290 us of CPU per streamed chunk here, aiohttp's C parser about 80
(``bench/client_overhead.py``), and under speculative decoding a client at 64 streams receives
thousands of chunks a second: the difference decides whether the client's own timestamps stay
within a millisecond or two of the server's writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
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

    def __init__(self, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
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
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_AiohttpStream(response),
            request=request,
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
            await asyncio.sleep(0)  # let aiohttp finish closing its connections
