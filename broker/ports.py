"""Free TCP ports on the loopback address, for local brokers and the processes
that serve metrics or pages next to them."""

from __future__ import annotations

import socket

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
