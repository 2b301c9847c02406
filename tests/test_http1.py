"""HTTP/1.1 framing by h11, fed read by read: the body bytes, the read each came in, reuse, errors.

The truth is the wire each test writes: which of its bytes are body, and where the reads are cut.
"""

from __future__ import annotations

import bisect

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsweep.runtime.http1 import Exchange

URL = "http://127.0.0.1:8000/v1/completions"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FRAMINGS = ["chunked", "length", "close"]


def _sent(method: str = "POST") -> Exchange:
    """An exchange whose request has been written (h11 reads a response only after its request)."""
    exchange = Exchange()
    request = httpx.Request(method, URL, json={} if method == "POST" else None)
    exchange.request_bytes(request, request.read())
    return exchange


def _wire(payloads: list[bytes], framing: str) -> tuple[bytes, list[int]]:
    """A 200 response carrying the payloads in one framing, and the wire offset of every body byte."""
    body = b"".join(payloads)
    if framing == "chunked":
        wire, offsets = bytearray(CHUNKED_HEAD), []
        for payload in payloads:
            wire += b"%x;note=1\r\n" % len(payload)
            offsets += range(len(wire), len(wire) + len(payload))
            wire += payload + b"\r\n"
        return bytes(wire + b"0\r\nX-Trailer: 1\r\n\r\n"), offsets
    if framing == "length":
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    else:
        head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    return head + body, list(range(len(head), len(head) + len(body)))


def _feed_cut(wire: bytes, cuts: list[int], framing: str) -> tuple[Exchange, bytes, list[int]]:
    """Feed the wire as reads cut at ``cuts``: the exchange, the body, and the read each body byte came in."""
    exchange, body, reads = _sent(), b"", []
    for read, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(wire)], strict=True)):
        piece = exchange.feed(wire[start:end])
        body += piece
        reads += [read] * len(piece)
    if framing == "close":
        exchange.feed_end()
    return exchange, body, reads


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=6), st.sampled_from(FRAMINGS), st.data())
def test_body_bytes_come_back_with_the_read_that_carried_them(
    payloads: list[bytes], framing: str, data: st.DataObject
) -> None:
    wire, offsets = _wire(payloads, framing)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(wire) - 1))))
    exchange, body, reads = _feed_cut(wire, cuts, framing)
    assert body == b"".join(payloads)
    assert reads == [bisect.bisect_right(cuts, offset) for offset in offsets]
    assert exchange.done and exchange.response is not None and exchange.response.status_code == 200
    assert exchange.reusable is (framing != "close")


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_response_split_at_every_byte(framing: str) -> None:
    """Each byte its own read: the same body, and body byte i came in the read that is wire byte offsets[i]."""
    payloads = [b'data: {"choices":[{"delta":{"content":"Once"}}]}\n\n', b"data: [DONE]\n\n"]
    wire, offsets = _wire(payloads, framing)
    exchange, body, reads = _feed_cut(wire, list(range(1, len(wire))), framing)
    assert body == b"".join(payloads) and reads == offsets and exchange.done


@pytest.mark.parametrize(
    ("response", "method", "body", "reusable"),
    [
        (CHUNKED_HEAD + b"2\r\nok\r\n0\r\n\r\n", "POST", b"ok", True),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, close\r\nContent-Length: 2\r\n\r\nok", "POST", b"ok", False),
        # h11 does not take up HTTP/1.0's keep-alive extension (RFC 9112 section 9.3 leaves it optional).
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", "POST", b"ok", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "HEAD", b"", True),  # a HEAD response has no body
        (b"HTTP/1.1 204 No Content\r\n\r\n", "POST", b"", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST", b"ok", True),
    ],
)
def test_framing_and_reuse_follow_the_head(response: bytes, method: str, body: bytes, reusable: bool) -> None:
    exchange = _sent(method)
    assert exchange.feed(response) == body
    assert exchange.done and exchange.response is not None and exchange.response.status_code in (200, 204)
    assert exchange.reusable is reusable


def test_a_request_that_asks_to_close_leaves_the_connection_unusable() -> None:
    exchange = Exchange()
    request = httpx.Request("POST", URL, headers={"Connection": "close"}, json={})
    exchange.request_bytes(request, request.read())
    assert exchange.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == b"ok"
    assert exchange.done and not exchange.reusable


RESPONSES = [(CHUNKED_HEAD + b"0\r\n\r\n", b""), (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok")]


@pytest.mark.parametrize(("response", "body"), RESPONSES)
def test_bytes_after_the_body_mark_the_connection_unusable(response: bytes, body: bytes) -> None:
    clean, together, apart = _sent(), _sent(), _sent()
    assert clean.feed(response) == together.feed(response + b"HTTP") == apart.feed(response) == body
    assert apart.feed(b"HTTP") == b""  # a later read, after the end of the body
    assert clean.done and together.done and apart.done
    assert clean.reusable and not together.reusable and not apart.reusable


@pytest.mark.parametrize(
    "chunks",
    [
        b"-5\r\n",
        b"1_0\r\n",
        b"zz\r\n",
        b"3\r\nabcX\r\n",
        b"3\r\nabcXY0\r\n\r\n",  # h11 before 0.16 skipped the two bytes after a chunk unchecked
    ],
)
def test_malformed_chunks_are_refused(chunks: bytes) -> None:
    exchange = _sent()
    exchange.feed(CHUNKED_HEAD)
    with pytest.raises(httpx.RemoteProtocolError, match="malformed response"):
        exchange.feed(chunks)


@pytest.mark.parametrize(
    "head",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 2OO OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000,  # a head that has not ended after 64 KiB
    ],
)
def test_malformed_heads_are_refused(head: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="malformed response"):
        _sent().feed(head)


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (CHUNKED_HEAD + b"5\r\nab", "mid-response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "mid-response"),
    ],
)
def test_a_close_inside_a_framed_body_is_an_error(response: bytes, error: str) -> None:
    exchange = _sent()
    assert exchange.feed(response) == b"ab"
    with pytest.raises(httpx.RemoteProtocolError, match=error):
        exchange.feed_end()
    assert not exchange.reusable


def test_the_request_goes_out_whole_with_its_length() -> None:
    """A streamed request body is read whole by the transport, so it is sent with Content-Length."""
    request = httpx.Request("POST", URL + "?x=1", content=iter([b'{"a":', b"1}"]))
    assert request.headers["transfer-encoding"] == "chunked"
    wire = Exchange().request_bytes(request, request.read())
    head, _, body = wire.partition(b"\r\n\r\n")
    request_line, *lines = head.split(b"\r\n")
    fields = {name.lower(): value for name, value in (line.split(b": ", 1) for line in lines)}
    assert request_line == b"POST /v1/completions?x=1 HTTP/1.1"
    assert fields[b"host"] == b"127.0.0.1:8000" and fields[b"content-length"] == b"7"
    assert b"transfer-encoding" not in fields and body == b'{"a":1}'


def test_a_header_that_would_split_the_request_is_refused() -> None:
    request = httpx.Request("POST", URL, headers={"Authorization": "Bearer x\r\nX-Injected: 1"}, json={})
    with pytest.raises(httpx.LocalProtocolError, match="Illegal header value"):
        Exchange().request_bytes(request, request.read())
