"""Free TCP ports on the loopback address, for local brokers and the processes
that serve metrics or pages next to them."""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"
_LOWEST = 10_000
_ATTEMPTS = 200


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (source ports of outgoing
    connections)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768
    return max(low, _LOWEST + 1_000)


def _candidates(count: int) -> Iterator[int]:
    """Random first ports of ``count`` consecutive ones below the ephemeral range.

    Ports from bind(0) are ephemeral ones: any outgoing connection on the machine
    may take one as its source port between the check and the listener's bind
    (a local broker died so: "Unable to start acceptor for CONTROLLER", while
    other tests' clients made thousands of connections)."""
    high = _ephemeral_low() - count
    rng = random.SystemRandom()
    for _ in range(_ATTEMPTS):
        yield rng.randrange(_LOWEST, high)


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the ephemeral range (another process may
    still take it before it is used)."""
    return free_port_run(1)


def free_port_pair(preferred: int | None = None) -> int:
    """A port p with p and p+1 free on 127.0.0.1 (a broker and its controller),
    ``preferred`` when it is."""
    return free_port_run(2, preferred)


def ports_free(ports: Iterable[int]) -> bool:
    """Whether every one of ``ports`` can be bound on 127.0.0.1 now, as a server binds
    (SO_REUSEADDR: connections of a stopped broker in TIME_WAIT do not count)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            s = stack.enter_context(socket.socket())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                return False
    return True


def free_port_run(count: int, preferred: int | None = None) -> int:
    """A port p with p, p+1, ..., p+count-1 free on 127.0.0.1 (the client and controller
    ports of a local cluster), ``preferred`` when it is; otherwise below the
    ephemeral range."""
    candidates = itertools.chain([preferred] if preferred else [], _candidates(count))
    for port in candidates:
        if port + count - 1 < 65535 and ports_free(range(port, port + count)):
            return port
    raise RuntimeError(f"no {count} free consecutive ports on 127.0.0.1")
