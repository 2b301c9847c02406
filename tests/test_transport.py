"""The aiohttp-backed transport: chunk arrival times come from the socket, not from the reader.

A server thread writes a chunked SSE response byte by byte the way a real server does, and
notes when it wrote each content event (perf_counter, the same clock in every thread).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from specsweep.runtime.client import StreamingClient
from specsweep.runtime.transport import ARRIVALS, AiohttpTransport, _StampingHandler
from specsweep.workload import WorkloadPrompt

PROMPT = WorkloadPrompt(id="p1", subcategory="", prompt="Tell me about the sea.")


def _event(text: str | None, tokens: int) -> bytes:
    choices = [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": None}]
    body = json.dumps({"id": "c1", "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
    return f"data: {body}\n\n".encode()


def _chunked(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


class ScriptedServer:
    """One connection: headers at once, then each event when ``before_write()`` returns."""

    def __init__(self, events: list[bytes], before_write) -> None:
        self.events = events
        self.before_write = before_write
        self.written: list[float] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, rest = request.partition(b"\r\n\r\n")
            length = int(next(v for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                              if k.lower() == b"content-length"))  # fmt: skip
            while len(rest) < length:
                rest += connection.recv(65536)
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for event in self.events:
                self.before_write()
                self.written.append(time.perf_counter())
                connection.sendall(_chunked(event))
            connection.sendall(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.listener.close()


def test_the_transport_stamps_in_the_socket_callback() -> None:
    """Guards the hook into aiohttp: a release that drops it makes timestamps read-time again."""

    async def go() -> type:
        transport = AiohttpTransport()
        session = transport._get_session()
        protocol = session.connector._factory()
        await transport.aclose()
        return type(protocol)

    assert asyncio.run(go()) is _StampingHandler


def test_first_token_time_is_the_content_not_the_headers() -> None:
    """Headers go out at once and the first content 0.2 s later: TTFT is 0.2 s, not ~0."""
    delays = iter([0.2, 0.05, 0.0])
    server = ScriptedServer(
        [_event("Once", 1), _event(" upon a time", 4), _event(None, 4)], lambda: time.sleep(next(delays))
    )

    async def go():
        async with StreamingClient(f"http://127.0.0.1:{server.port}", model="m") as client:
            return await client.stream(PROMPT, max_tokens=4, temperature=0.0)

    record = asyncio.run(go())
    server.thread.join(5)
    assert record.ok and record.completion_tokens == 4 and record.num_chunks == 2
    first_error = record.started_at + record.ttft_s - server.written[0]
    last_error = record.started_at + record.last_token_s - server.written[1]
    assert 0 <= first_error < 0.02 and 0 <= last_error < 0.02
    assert record.ttft_s == pytest.approx(0.2, abs=0.05)


def test_a_piece_read_late_keeps_the_arrival_of_each_of_its_parts() -> None:
    """Two socket reads that one body read returns together keep their own arrival times;
    stamps of another response or of bytes already handed out are dropped."""
    from collections import deque
    from types import SimpleNamespace

    from specsweep.runtime.transport import ArrivalTimes, _AiohttpStream

    reader, other = object(), object()
    stamps = [(other, 50, 0.5), (reader, 10, 1.0), (reader, 30, 2.0), (reader, 45, 3.0)]
    protocol = SimpleNamespace(arrivals=deque(stamps))
    stream = _AiohttpStream.__new__(_AiohttpStream)
    stream._response = SimpleNamespace(content=reader)
    stream._times = times = ArrivalTimes()
    stream._protocol = protocol
    stream._note_arrivals(10, 40)  # bytes 10..39 were read in one piece; 0..9 went out before
    assert [times.at(0), times.at(19), times.at(20), times.at(29)] == [2.0, 2.0, 3.0, 3.0]
    assert list(protocol.arrivals) == [(reader, 45, 3.0)]  # its last 5 bytes are still to be read
    stream._note_arrivals(40, 45)
    assert times.at(0) == times.at(4) == 3.0 and not protocol.arrivals


def test_responses_carry_their_arrival_times() -> None:
    server = ScriptedServer([_event("x", 1), _event(None, 1)], lambda: None)

    async def go():
        transport = AiohttpTransport()
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        async with httpx.AsyncClient(transport=transport) as http, http.stream("POST", url, json={}) as response:
            arrivals = response.extensions[ARRIVALS]
            stamps = []
            async for data in response.aiter_bytes():
                stamps.append((arrivals.at(0), arrivals.at(len(data) - 1), time.perf_counter()))
            return stamps

    stamps = asyncio.run(go())
    server.thread.join(5)
    assert stamps
    for first, last, read in stamps:
        assert first <= last <= read
