"""Lines a test captured from file descriptor 2, less those of other tests' clients.

librdkafka writes its log lines straight to stderr (``%3|<time>|FAIL|rdkafka#...``)
for a client made outside a command-line scope, from its own threads, for as long
as the client lives. A client that an earlier test of the same pytest process made
against a broker since stopped keeps writing such lines into whatever a later test
captures. A test that checks what a command prints keeps the librdkafka lines that
name its own address and leaves the others out.
"""

from __future__ import annotations

import re

_LIBRDKAFKA = re.compile(r"^%\d\|\d+\.\d+\|")


def own_lines(err: str, address: str) -> list[str]:
    """``err``'s lines, without librdkafka's lines that do not mention ``address``."""
    return [
        line for line in err.splitlines() if not (_LIBRDKAFKA.match(line) and address not in line)
    ]
