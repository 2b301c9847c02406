"""The streaming transport on real sockets: kernel arrival stamps, framing, keep-alive, errors.

Server threads write responses the way real servers do and note when they wrote each event
(perf_counter, the same clock in every thread and the one the stamps are converted to).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from specsweep.runtime.client import StreamingClient
from specsweep.runtime.kernel_stamps import SO_TIMESTAMPNS_NEW, KernelClock, enable_kernel_stamps
from specsweep.runtime.transport import ARRIVALS, Http1Transport
from specsweep.workload import WorkloadPrompt

PROMPT = WorkloadPrompt(id="p1", subcategory="", prompt="Tell me about the sea.")
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
with socket.socket() as _probe:
    KERNEL_STAMPS = enable_kernel_stamps(_probe)


def _event(text: str | None, tokens: int) -> bytes:
    choices = [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": None}]
    body = json.dumps({"id": "c1", "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
    return f"data: {body}\n\n".encode()


def _chunked(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _read_request(connection: socket.socket) -> bool:
    """Read one request (head and Content-Length body); False if the client closed instead."""
    request = b""
    while b"\r\n\r\n" not in request:
        more = connection.recv(65536)
        if not more:
            return False
        request += more
    head, _, rest = request.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int({k.lower(): v for k, v in fields.items()}.get(b"content-length", b"0"))
    while len(rest) < length:
        rest += connection.recv(65536)
    return True


class Server:
    """Accepts ``connections`` connections and runs ``script(connection, written)`` on each."""

    def __init__(
        self, script: Callable[[socket.socket, list[float]], None], connections: int = 1,
        tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        self.script = script
        self.tls = tls
        self.written: list[float] = []
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._serve, args=(connections,), daemon=True)
        self.thread.start()

    def _serve(self, connections: int) -> None:
        with self.listener:
            for _ in range(connections):
                connection, _ = self.listener.accept()
                self.accepted += 1
                if self.tls is not None:
                    try:
                        connection = self.tls.wrap_socket(connection, server_side=True)
                    except ssl.SSLError:
                        connection.close()
                        continue
                with connection:
                    self.script(connection, self.written)


def sse_script(events: list[bytes], delays: list[float], requests: int = 1) -> Callable:
    def script(connection: socket.socket, written: list[float]) -> None:
        for _ in range(requests):
            if not _read_request(connection):
                return
            connection.sendall(SSE_HEAD)
            for event, delay in zip(events, delays, strict=True):
                time.sleep(delay)
                written.append(time.perf_counter())
                connection.sendall(_chunked(event))
            connection.sendall(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    return script


async def _pieces(url: str, block_s: float = 0.0, **transport_args) -> list[tuple[bytes, float, float]]:
    """Each body piece with the arrival of its first and last byte, the loop blocked before reading."""
    async with (
        httpx.AsyncClient(transport=Http1Transport(**transport_args)) as http,
        http.stream("POST", url + "/v1/completions", json={}) as response,
    ):
        time.sleep(block_s)  # the client's own CPU load, between the head and the body
        arrivals = response.extensions[ARRIVALS]
        return [(data, arrivals.at(0), arrivals.at(len(data) - 1)) async for data in response.aiter_bytes()]


@pytest.mark.skipif(not KERNEL_STAMPS, reason="no SO_TIMESTAMPNS here")
def test_kernel_stamps_do_not_wait_for_a_busy_client() -> None:
    """An event read 150 ms late (the loop busy) keeps its kernel arrival; the callback's stamp does not."""
    for stamps, lateness in (("kernel", (0.0, 0.01)), ("socket", (0.14, 1.0))):
        server = Server(sse_script([_event("x", 1)], [0.05]))
        pieces = asyncio.run(_pieces(server.url, block_s=0.2, stamps=stamps))
        server.thread.join(5)
        first = next(arrived for data, arrived, _ in pieces if b'"x"' in data)
        assert lateness[0] <= first - server.written[0] < lateness[1], stamps


@pytest.mark.skipif(not KERNEL_STAMPS, reason="no SO_TIMESTAMPNS here")
def test_one_read_of_two_writes_carries_the_later_arrival() -> None:
    """TCP semantics: the stamp of a read is the arrival of its last byte (the kernel merges queued skbs)."""
    server = Server(sse_script([_event("a", 1), _event("b", 2)], [0.02, 0.05]))
    pieces = asyncio.run(_pieces(server.url, block_s=0.2))
    server.thread.join(5)
    data, first, last = pieces[0]
    assert b'"a"' in data and b'"b"' in data
    assert first == last and 0 <= first - server.written[1] < 0.01


def test_first_token_time_is_the_content_not_the_headers() -> None:
    """Headers go out at once and the first content 0.2 s later: TTFT is 0.2 s, not ~0."""
    server = Server(sse_script([_event("Once", 1), _event(" upon a time", 4), _event(None, 4)], [0.2, 0.05, 0.0]))

    async def go():
        async with StreamingClient(server.url, model="m") as client:
            return await client.stream(PROMPT, max_tokens=4, temperature=0.0)

    record = asyncio.run(go())
    server.thread.join(5)
    assert record.ok and record.completion_tokens == 4 and record.num_chunks == 2
    first_error = record.started_at + record.ttft_s - server.written[0]
    last_error = record.started_at + record.last_token_s - server.written[1]
    assert 0 <= first_error < 0.02 and 0 <= last_error < 0.02
    assert record.ttft_s == pytest.approx(0.2, abs=0.05)


@pytest.mark.parametrize("stamps", ["kernel", "socket"])
def test_stamps_lie_between_the_write_and_the_read(stamps: str) -> None:
    server = Server(sse_script([_event("x", 1), _event(None, 1)], [0.01, 0.01]))
    pieces = asyncio.run(_pieces(server.url, stamps=stamps))
    server.thread.join(5)
    assert b"".join(data for data, _, _ in pieces).count(b"data:") == 3
    assert all(first <= last for _, first, last in pieces)
    assert pieces[0][1] >= server.written[0]


def test_read_stamps_leave_the_time_to_the_reader() -> None:
    server = Server(sse_script([], []))

    async def go():
        async with httpx.AsyncClient(transport=Http1Transport(stamps="read")) as http:
            response = await http.post(server.url + "/v1/completions", json={})
            return response.extensions.get(ARRIVALS), response.content

    arrivals, content = asyncio.run(go())
    server.thread.join(5)
    assert arrivals is None and content == b"data: [DONE]\n\n"


@pytest.mark.parametrize("stamps", ["kernel", "socket"])
def test_a_response_written_byte_by_byte_keeps_each_bytes_arrival(stamps: str) -> None:
    """One write per byte: the same body, and every body byte arrived after its write and before its read.

    The reader dawdles after each piece, so the socket is read several times (a stamp each) per piece."""
    payloads = [_event("x", 1), b"data: [DONE]\n\n"]
    wire, offsets = bytearray(SSE_HEAD), []
    for payload in payloads:
        wire += b"%x\r\n" % len(payload)
        offsets += range(len(wire), len(wire) + len(payload))
        wire += payload + b"\r\n"
    wire += b"0\r\n\r\n"

    def script(connection: socket.socket, written: list[float]) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _read_request(connection)
        for offset in range(len(wire)):
            written.append(time.perf_counter())
            connection.sendall(wire[offset : offset + 1])
            time.sleep(0.0002)

    async def go() -> list[tuple[float, float]]:
        """(arrival, read time) per body byte."""
        async with (
            httpx.AsyncClient(transport=Http1Transport(stamps=stamps)) as http,
            http.stream("POST", server.url + "/v1/completions", json={}) as response,
        ):
            arrivals, times, body = response.extensions[ARRIVALS], [], b""
            async for data in response.aiter_bytes():
                read_at = time.perf_counter()
                times += [(arrivals.at(offset), read_at) for offset in range(len(data))]
                body += data
                await asyncio.sleep(0.005)
            assert body == b"".join(payloads)
            return times

    server = Server(script)
    times = asyncio.run(go())
    server.thread.join(5)
    assert len(times) == len(offsets)
    for offset, (arrived, read_at) in zip(offsets, times, strict=True):
        assert server.written[offset] <= arrived <= read_at


def _requests(
    url: str, count: int, transport: Http1Transport | None = None, pause_s: float = 0.0
) -> tuple[list[bytes], int]:
    async def go():
        async with httpx.AsyncClient(transport=transport or Http1Transport()) as http:
            bodies = []
            for i in range(count):
                bodies.append((await http.post(url + "/v1/completions", json={"n": i})).content)
                await asyncio.sleep(pause_s)
            return bodies, len(http._transport._open)

    return asyncio.run(go())


def test_keep_alive_reuses_the_connection() -> None:
    server = Server(sse_script([_event("x", 1)], [0.0], requests=3), connections=1)
    bodies, open_connections = _requests(server.url, 3)
    server.thread.join(5)
    assert server.accepted == 1 and open_connections == 1 and all(b'"x"' in body for body in bodies)


def test_a_server_that_closes_after_each_response_gets_a_fresh_connection() -> None:
    """llama.cpp closes after each stream: the idle connection is seen closed before it is reused."""

    def script(connection: socket.socket, written: list[float]) -> None:
        _read_request(connection)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        time.sleep(0.02)  # closes after the response has gone out (a request sent before would be reset)

    server = Server(script, connections=3)
    bodies, _ = _requests(server.url, 3, pause_s=0.1)
    server.thread.join(5)
    assert bodies == [b"hello"] * 3 and server.accepted == 3


@pytest.mark.parametrize(
    ("response", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil close", b"until close"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n", b"abc"),
    ],
)
def test_bodies_in_every_framing(response: bytes, body: bytes) -> None:
    def script(connection: socket.socket, written: list[float]) -> None:
        _read_request(connection)
        for byte in range(len(response)):  # byte by byte, so every parser state meets a read boundary
            connection.sendall(response[byte : byte + 1])

    server = Server(script)
    bodies, _ = _requests(server.url, 1)
    server.thread.join(5)
    assert bodies == [body]


def _failure(script: Callable, **transport_args) -> type[Exception]:
    server = Server(script)
    try:
        _requests(server.url, 1, Http1Transport(**transport_args))
    except httpx.HTTPError as exc:
        return type(exc)
    finally:
        server.thread.join(5)
    raise AssertionError("no error")


def test_the_timeout_bounds_each_wait_not_the_whole_response() -> None:
    """Events 0.1 s apart for 0.8 s, with a 0.25 s timeout: never silent that long, so no ReadTimeout."""
    server = Server(sse_script([_event("x", i + 1) for i in range(8)], [0.1] * 8))
    bodies, _ = _requests(server.url, 1, Http1Transport(timeout_s=0.25))
    server.thread.join(5)
    assert bodies[0].count(b'"x"') == 8 and bodies[0].endswith(b"data: [DONE]\n\n")


def test_errors_are_httpx_exceptions() -> None:
    def closes(connection, written):
        _read_request(connection)

    def truncates(connection, written):
        _read_request(connection)
        connection.sendall(SSE_HEAD + _chunked(_event("x", 1)) + b"5\r\nab")

    def stalls(connection, written):
        _read_request(connection)
        connection.sendall(SSE_HEAD)
        time.sleep(0.5)

    def garbles(connection, written):
        _read_request(connection)
        connection.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")

    assert _failure(closes) is httpx.RemoteProtocolError
    assert _failure(truncates) is httpx.RemoteProtocolError
    assert _failure(stalls, timeout_s=0.2) is httpx.ReadTimeout
    assert _failure(garbles) is httpx.RemoteProtocolError
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        _requests(f"http://127.0.0.1:{port}", 1)


def _holds_open(connection: socket.socket) -> None:
    """Keep the connection open until the client drops it (or 5 s pass)."""
    connection.settimeout(5)
    try:
        while connection.recv(65536):
            pass
    except OSError:
        pass


@pytest.mark.parametrize(
    "response",
    [
        SSE_HEAD + _chunked(_event("x", 1)) + b"zz\r\n",  # a chunk size that is not hex
        SSE_HEAD + b"3\r\nabcXY",  # no CRLF after a chunk
        b"HTTP/1.1 2OO OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000,  # a head that does not end
    ],
)
def test_a_malformed_response_is_an_error_at_once_not_a_timeout(response: bytes) -> None:
    """The server sends something malformed and keeps the connection open: the client does not wait."""

    def script(connection: socket.socket, written: list[float]) -> None:
        _read_request(connection)
        connection.sendall(response)
        _holds_open(connection)

    started = time.perf_counter()
    assert _failure(script, timeout_s=5.0) is httpx.RemoteProtocolError
    assert time.perf_counter() - started < 2.0


def test_a_request_that_h11_will_not_write_fails_before_connecting() -> None:
    """A header value with CR LF would split the request: refused before any connection (none listens)."""
    with socket.create_server(("127.0.0.1", 0)) as unused:
        port = unused.getsockname()[1]

    async def go() -> None:
        async with httpx.AsyncClient(transport=Http1Transport()) as http:
            await http.post(f"http://127.0.0.1:{port}/v1/completions", headers={"X-Note": "a\r\nHost: b"}, json={})

    with pytest.raises(httpx.LocalProtocolError, match="Illegal header value"):
        asyncio.run(go())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_https_streams_with_kernel_stamps_and_verifies_the_server(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = Server(sse_script([_event("x", 1)], [0.05], requests=2), tls=server_side)
    trusting = ssl.create_default_context(cafile=str(cert))
    pieces = asyncio.run(_pieces(server.url, block_s=0.2 if KERNEL_STAMPS else 0.0, ssl_context=trusting))
    server.thread.join(5)
    assert b"".join(data for data, _, _ in pieces).count(b"data:") == 2
    first = next(arrived for data, arrived, _ in pieces if b'"x"' in data)
    assert 0 <= first - server.written[0] < (0.01 if KERNEL_STAMPS else 1.0)  # decrypted late, stamped on arrival

    stranger = Server(sse_script([], []), tls=server_side)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        _requests(stranger.url, 1, Http1Transport(ssl_context=ssl.create_default_context()))
    stranger.thread.join(5)


@pytest.mark.parametrize("tls", [False, True])
def test_a_body_of_many_reads_arrives_whole(tls: bool, certificate: tuple[Path, Path]) -> None:
    """A megabyte body, sent at once: many reads of the socket (and TLS records), the same bytes."""
    body = bytes(range(256)) * 4096

    def script(connection: socket.socket, written: list[float]) -> None:
        _read_request(connection)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    cert, key = certificate
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = Server(script, tls=server_side if tls else None)
    transport = Http1Transport(ssl_context=ssl.create_default_context(cafile=str(cert)))
    bodies, _ = _requests(server.url, 1, transport)
    server.thread.join(5)
    assert bodies == [body]


def test_kernel_clock_converts_the_wall_clock_stamp() -> None:
    clock = KernelClock()
    now_ns = time.time_ns()
    read_at = time.perf_counter() + 0.001
    ancillary = [(socket.SOL_SOCKET, SO_TIMESTAMPNS_NEW, struct.pack("qq", *divmod(now_ns, 1_000_000_000)))]
    assert clock.stamp(ancillary, read_at) == pytest.approx(read_at - 0.001, abs=0.001)
    assert clock.stamp([], read_at) == read_at
    assert clock.stamp(ancillary, read_at - 1.0) <= read_at - 1.0  # never after the read
