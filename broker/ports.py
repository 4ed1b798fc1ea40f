"""Free TCP ports on the loopback address, for local brokers and the processes
that serve metrics or pages next to them."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port free on 127.0.0.1 now (another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_port_pair(preferred: int | None = None) -> int:
    """A port p with p and p+1 free on 127.0.0.1 (a broker and its controller),
    ``preferred`` when it is."""
    candidates = ([preferred] if preferred else []) + [0] * 50
    for want in candidates:
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, want))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind((LOOPBACK, port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair on 127.0.0.1")


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
    ports of a local cluster), ``preferred`` when it is."""
    candidates = ([preferred] if preferred else []) + [0] * 50
    for want in candidates:
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, want))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if port + count - 1 >= 65535:
            continue
        if ports_free(range(port + 1, port + count)):
            return port
    raise RuntimeError(f"no {count} free consecutive ports on 127.0.0.1")
