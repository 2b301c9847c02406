"""One client TCP connection (optionally TLS) whose reads carry their arrival time.

While a response is read, an ``add_reader`` callback drains the non-blocking socket and keeps
(bytes, stamp) per read: the kernel's receive time with ``SO_TIMESTAMPNS`` (read with
``recvmsg``, see ``kernel_stamps``), else ``perf_counter`` in the callback. TLS runs over
memory BIOs on the same socket, so the ciphertext reads keep their stamps: a TLS record's
plaintext is stamped with the read that completed the record. Errors are plain OSError and
TimeoutError here; the transport turns them into httpx exceptions.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

from specsweep.runtime.kernel_stamps import ANCILLARY_SIZE, KernelClock, enable_kernel_stamps

# A read asks for at most this much. CPython allocates the whole size before each recv and
# shrinks it after; glibc serves 128 KiB or more with mmap until the process has freed a large
# mapped block, so 256 KiB could cost an mmap, mremap and munmap per read (15-20 us a chunk).
_READ_SIZE = 64 * 1024
_HIGH_WATER = 4 * 1024 * 1024  # stop reading a connection whose reader has this much pending

_Tls = tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]  # the session, ciphertext in, ciphertext out


async def open_connection(
    key: tuple[str, str, int], *, kernel_stamps: bool, tls_context: ssl.SSLContext | None
) -> Connection:
    """Connect to (scheme, host, port), trying each address; TLS handshake if a context is given."""
    loop = asyncio.get_running_loop()
    _, host, port = key
    addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    failure: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kernel = kernel_stamps and enable_kernel_stamps(sock)
            await loop.sock_connect(sock, address)
            tls = None if tls_context is None else await _handshake(sock, tls_context, host)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        return Connection(sock, key, KernelClock() if kernel else None, tls)
    raise failure


async def _handshake(sock: socket.socket, context: ssl.SSLContext, host: str) -> _Tls:
    loop = asyncio.get_running_loop()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    session = context.wrap_bio(incoming, outgoing, server_hostname=host)
    while True:
        try:
            session.do_handshake()
            break
        except ssl.SSLWantReadError:
            if outgoing.pending:
                await loop.sock_sendall(sock, outgoing.read())
            data = await loop.sock_recv(sock, _READ_SIZE)
            if not data:
                raise ConnectionResetError("the server closed the connection during the TLS handshake") from None
            incoming.write(data)
    if outgoing.pending:
        await loop.sock_sendall(sock, outgoing.read())
    return session, incoming, outgoing


class Connection:
    """A connection's socket, and the reads taken from it and not yet handed out."""

    __slots__ = (
        "_clock", "_deadline", "_loop", "_reading", "_timer", "_tls", "_waiter", "buffered", "eof", "error", "key",
        "reads", "sock",
    )  # fmt: skip

    def __init__(
        self, sock: socket.socket, key: tuple[str, str, int], clock: KernelClock | None, tls: _Tls | None
    ) -> None:
        self.sock = sock
        self.key = key
        self._loop = asyncio.get_running_loop()
        self._clock = clock
        self._tls = tls
        self._reading = False
        self._waiter: asyncio.Future[None] | None = None
        # One timer per connection, not one per wait: a wait moves the deadline, and the timer,
        # when it fires, expires the wait only if the deadline has passed (else re-arms). A
        # timer per wait cost a heap push and a cancelled entry per streamed chunk.
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.reads: list[tuple[bytes, float]] = []
        self.buffered = 0
        self.eof = False
        self.error: OSError | None = None

    def _on_readable(self) -> None:
        try:
            if self._clock is not None:
                data, ancillary, _, _ = self.sock.recvmsg(_READ_SIZE, ANCILLARY_SIZE)
                stamp = self._clock.stamp(ancillary, time.perf_counter())
            else:
                data = self.sock.recv(_READ_SIZE)
                stamp = time.perf_counter()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.error = exc
            self._stop_reading()
        else:
            if not data:
                self.eof = True
                self._stop_reading()
            elif self._tls is not None:
                data = self._decrypt(data)
            if data:
                self.reads.append((data, stamp))
                self.buffered += len(data)
                if self.buffered > _HIGH_WATER:
                    self._stop_reading()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _decrypt(self, data: bytes) -> bytes:
        """The plaintext of every TLS record this read completed (b"" if none)."""
        session, incoming, outgoing = self._tls  # type: ignore[misc]
        incoming.write(data)
        parts = []
        try:
            while True:
                parts.append(session.read(_READ_SIZE))
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:  # close_notify
            self.eof = True
            self._stop_reading()
        except ssl.SSLError as exc:
            self.error = exc
            self._stop_reading()
        if outgoing.pending:  # a TLS 1.3 key update wants an answer
            try:
                self.sock.send(outgoing.read())
            except OSError as exc:
                self.error = exc
        return b"".join(parts)

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.sock.fileno())
            self._reading = False

    async def send(self, data: bytes, timeout_s: float) -> None:
        if self._tls is not None:
            session, _, outgoing = self._tls
            session.write(data)
            data = outgoing.read()
        try:
            sent = self.sock.send(data)  # a request fits the socket buffer nearly always
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            async with asyncio.timeout(timeout_s):
                await self._loop.sock_sendall(self.sock, data[sent:])

    async def take(self, timeout_s: float) -> list[tuple[bytes, float]]:
        """Every read since the last take, waiting for one; [] at end of stream. Raises OSError, TimeoutError."""
        while not self.reads and not self.eof and self.error is None:  # a TLS read may bring no plaintext
            if not self._reading:
                self._loop.add_reader(self.sock.fileno(), self._on_readable)
                self._reading = True
            waiter = self._waiter = self._loop.create_future()
            deadline = self._deadline = self._loop.time() + timeout_s
            timer = self._timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = self._loop.call_at(deadline, self._on_deadline)
            try:
                await waiter
            finally:
                self._waiter = None
        reads = self.reads
        if reads:
            self.reads, self.buffered = [], 0
            return reads
        if self.error is not None:
            raise self.error
        return []

    def release(self) -> bool:
        """Stop reading; True if the connection can carry another request."""
        self._stop_reading()
        return not (self.reads or self.eof or self.error)

    def usable(self) -> bool:
        """An idle connection the server has not closed (and sent nothing on)."""
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # end of stream, or bytes nobody asked for (for TLS, possibly a session ticket)

    def _on_deadline(self) -> None:
        """Expire the wait in progress if its deadline has passed; else wait for the deadline again."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait now; the next one arms a timer
        if self._loop.time() >= self._deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = self._loop.call_at(self._deadline, self._on_deadline)

    def close(self) -> None:
        self._stop_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.sock.close()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionAbortedError("connection closed"))
