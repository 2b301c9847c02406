"""When the kernel received the bytes a TCP read returns, on the clock of ``time.perf_counter``.

With ``SO_TIMESTAMPNS`` set on a socket, Linux stamps every incoming packet as the driver (for
127.0.0.1, the loopback device) hands it to the network stack, and ``recvmsg`` returns the
stamp as an ``SCM_TIMESTAMPNS`` control message. The stamp is taken in softirq context, before
any process runs, so it does not depend on how busy the reading process is.

What the stamp of one TCP read means: since Linux 4.14 (commit 98aaa913b4ed, "tcp: Extend
SOF_TIMESTAMPING_RX_SOFTWARE to TCP recvmsg") a read returns the timestamp of the skb holding
the highest sequence number it copied, that is the arrival of its *last* byte; when the kernel
coalesces queued skbs it keeps the appended (later) one's stamp. So every byte of a read
arrived at or before its stamp, and a read that returns data from several server writes gets
the time of the latest one; a short read of only the first write does not help, its bytes
were already merged in the receive queue (checked on loopback, kernel 6.18). The error is
therefore one-sided and bounded by how far the reader is behind the *next* packet of the same
connection, not by how far it is behind the first.

The stamp is on CLOCK_REALTIME; ``time.perf_counter`` is CLOCK_MONOTONIC on Linux. Both are
slewed alike by NTP (only CLOCK_MONOTONIC_RAW is not), so their difference changes only when
the wall clock is stepped. It is sampled when a connection opens, and sampled again if a
converted stamp ever lies after the time it was read (a step since). A step during a
connection that moves the wall clock back goes unnoticed: the stamps of that connection
would be early by the step.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time

# asm-generic/socket.h values; Python's socket module does not export them.
SO_TIMESTAMPNS_OLD = 35
SO_TIMESTAMPNS_NEW = 64  # Linux 5.1+: a struct __kernel_timespec (two 64-bit fields) everywhere
# Architectures whose SOL_SOCKET option numbers are the asm-generic ones (alpha, mips, parisc
# and sparc number them differently).
_GENERIC_SOCKET_ABI = {"x86_64", "amd64", "aarch64", "arm64", "riscv64", "i386", "i686", "armv7l", "ppc64le", "s390x"}
_TIMESPEC64 = struct.Struct("qq")
_TIMESPEC32 = struct.Struct("ii")

# Room for one control message holding a timespec (CMSG_SPACE(16) is 32 on 64-bit Linux).
ANCILLARY_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what this socket receives; False where it cannot."""
    if sys.platform != "linux" or platform.machine().lower() not in _GENERIC_SOCKET_ABI:
        return False
    for option in (SO_TIMESTAMPNS_NEW, SO_TIMESTAMPNS_OLD):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
        except OSError:
            continue
        return True
    return False


def sample_clock_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC in ns, from the tightest of a few bracketed reads."""
    best_gap, best_offset = None, 0
    for _ in range(tries):
        before = time.perf_counter_ns()
        real = time.time_ns()
        after = time.perf_counter_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, best_offset = after - before, real - (before + after) // 2
    return best_offset


class KernelClock:
    """Turns the SCM_TIMESTAMPNS of a read into a perf_counter time (one per connection)."""

    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = sample_clock_offset_ns()

    def stamp(self, ancillary: list[tuple[int, int, bytes]], read_at: float) -> float:
        """The kernel's receive time of the read's last byte; ``read_at`` if it sent none."""
        for level, kind, data in ancillary:
            if level != socket.SOL_SOCKET or kind not in (SO_TIMESTAMPNS_NEW, SO_TIMESTAMPNS_OLD):
                continue
            seconds, nanoseconds = (_TIMESPEC64 if len(data) >= 16 else _TIMESPEC32).unpack_from(data)
            received_ns = seconds * 1_000_000_000 + nanoseconds
            stamp = (received_ns - self.offset_ns) * 1e-9
            if stamp > read_at:  # the wall clock was stepped forward since the offset was taken
                self.offset_ns = sample_clock_offset_ns()
                stamp = min((received_ns - self.offset_ns) * 1e-9, read_at)
            return stamp
        return read_at
