"""Sizes in bytes written the way operators write them (``512MiB``, ``2G``, ``800M``).

A plain integer is bytes. Suffixes are case-insensitive: ``k``/``kb`` = 10^3,
``m``/``mb`` = 10^6, ``g``/``gb`` = 10^9, and the binary ``ki``/``kib`` = 2^10,
``mi``/``mib`` = 2^20, ``gi``/``gib`` = 2^30 (Kubernetes' quantities, with an
optional ``b``). A fraction is allowed before a suffix (``1.5GiB``).
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
ACCEPTED = "bytes as an integer, or a number with a unit: k, M, G (10^3...) or Ki, Mi, Gi (2^10...)"


def parse_byte_size(value: object) -> int:
    """``value`` (an int, or a string such as ``"512MiB"``) in bytes.

    Raises :class:`ValueError` naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(ACCEPTED)
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise ValueError(ACCEPTED)
    match = _SIZE_RE.match(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(ACCEPTED)
    number, unit = match.group(1), _UNITS[match.group(2).lower()]
    if "." in number:
        if unit == 1:
            raise ValueError(ACCEPTED)  # a fraction of a byte
        return int(float(number) * unit)
    return int(number) * unit


def format_byte_size(size: int) -> str:
    """``size`` for a log line: ``512.0 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
