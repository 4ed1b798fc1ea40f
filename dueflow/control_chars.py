"""Control characters: what names refuse and what operator output escapes (pure).

One set of characters, :data:`CONTROL_CHARS`, serves both ends:

- every door refuses them in job ids, idempotency keys, schedule ids and label
  keys (:func:`dueflow.records.job_request.check_name`), so a name dueflow
  writes never carries them;
- every operator output (CLI text and JSON, the status page and its API, text
  logs) shows them escaped (:func:`escape_text`), because wire data written by
  other clients, and handler error texts, can hold anything.

The set: C0 controls U+0000-U+001F (NUL, ESC, CR, LF, TAB...), DEL U+007F, C1
controls U+0080-U+009F (CSI U+009B starts a terminal escape as ESC ``[`` does),
the line and paragraph separators U+2028 and U+2029, and the bidirectional
formatting controls U+061C, U+200E, U+200F, U+202A-U+202E and U+2066-U+2069
(they reorder how a terminal or a browser shows the text around them: an id
with U+202E shows reversed). Other invisible format characters (zero-width
joiners, used in emoji) are not in it.

Escaped, a character reads as Python writes it in a string literal: ``\\x1b``,
``\\x00``, ``\\n``, ``\\x9b``, ``\\u202e``; bytes that are not UTF-8 as
``\\xff``. Backslashes are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import orjson

CONTROL_CHARS: Final = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")
# The characters of CONTROL_CHARS that JSON encoders write raw (JSON must escape
# only C0, and '"' and '\\'): escaped after encoding, inside strings only.
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

CONTROL_CHARS_TEXT: Final = (
    "no control characters (C0 U+0000-U+001F, DEL, C1 U+0080-U+009F, "
    "line/paragraph separators U+2028/U+2029, bidi controls U+061C U+200E U+200F "
    "U+202A-U+202E U+2066-U+2069)"
)

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# What escape_text escapes: CONTROL_CHARS and lone surrogates.
_ESCAPED = re.compile(f"[{CONTROL_CHARS}\ud800-\udfff]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character of :data:`CONTROL_CHARS`."""
    if text.isascii():
        return not text.isprintable()
    return _CONTROL.search(text) is not None


def _escaped(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_text(value: object, *, keep: str = "") -> str:
    """``value`` as text an operator can see safely: control characters escaped.

    A ``str`` keeps every other character (``keep``: control characters to leave
    raw, e.g. ``"\\n"`` for whole lines of output); lone surrogates (from text
    decoded with ``surrogateescape``) show as ``\\udcff``. ``bytes`` are decoded
    as UTF-8, each invalid byte shown as ``\\xNN``; anything else is ``str(value)``,
    escaped. Never raises.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("utf-8", "backslashreplace")
    elif isinstance(value, str):
        text = value
    elif isinstance(value, int) and value.bit_length() > _MAX_DECIMAL_BITS:
        text = f"an integer of {value.bit_length()} bits"  # str() would raise
    else:
        try:
            text = str(value)
        except Exception as exc:  # a hostile __str__ must not stop an output
            text = f"<{type(value).__name__}: str() raised {type(exc).__name__}>"
    if text.isascii() and text.isprintable():
        return text
    if keep:
        return _ESCAPED.sub(lambda m: m.group() if m.group() in keep else _escaped(m.group()), text)
    return _ESCAPED.sub(lambda m: _escaped(m.group()), text)


def escape_json_text(encoded: str) -> str:
    """JSON text with the characters of :data:`CONTROL_CHARS` that encoders leave raw
    (DEL, C1, separators, bidi controls) written as ``\\uXXXX`` escapes: still the
    same JSON value (they can only occur inside strings), and nothing in it moves
    a terminal. C0 characters are escaped by every JSON encoder already."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded)


def json_text(
    data: Any,
    *,
    indent: bool = False,
    default: Callable[[Any], Any] | None = None,
    non_str_keys: bool = False,
) -> str:
    """``data`` as JSON text an operator can see safely, and always valid JSON:
    orjson's encoding, then :func:`escape_json_text`. What orjson refuses in wire
    data (a lone surrogate from ``surrogateescape`` decoding, an integer beyond 64
    bits) is written as text instead (:func:`json_safe`) rather than raised."""
    option = (orjson.OPT_INDENT_2 if indent else 0) | (
        orjson.OPT_NON_STR_KEYS if non_str_keys else 0
    )
    try:
        raw = orjson.dumps(data, default=default, option=option)
    except orjson.JSONEncodeError:
        try:
            raw = orjson.dumps(json_safe(data), default=default, option=option)
        except orjson.JSONEncodeError:  # what ``default`` refuses too: as text
            raw = orjson.dumps(json_safe(data, as_text=True), option=option)
    if raw.isascii() and b"\x7f" not in raw:  # the common case: nothing to escape
        return raw.decode()
    return escape_json_text(raw.decode())


_INT64 = range(-(1 << 63), 1 << 64)  # orjson takes signed and unsigned 64-bit


def json_safe(value: Any, *, as_text: bool = False, depth: int = 0) -> Any:
    """``value`` (dicts, lists, tuples, scalars) with what orjson refuses written as
    text: lone surrogates in strings and keys as ``\\udcff``, integers beyond 64 bits
    as their decimal text (past Python's digit limit: how many bits), keys that are
    no strings and anything nested deeper than orjson goes as their text;
    ``as_text``: every other object too (:func:`escape_text`, which never raises)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        if value in _INT64:
            return value
        bits = value.bit_length()
        return str(value) if bits <= _MAX_DECIMAL_BITS else f"an integer of {bits} bits"
    if depth >= _MAX_DEPTH:
        return escape_text(value)
    if isinstance(value, dict):
        return {
            (json_safe(k) if isinstance(k, str) else escape_text(k)): json_safe(
                v, as_text=as_text, depth=depth + 1
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [json_safe(v, as_text=as_text, depth=depth + 1) for v in value]
    return escape_text(value) if as_text else value


_MAX_DECIMAL_BITS = 14_000  # str() of an int refuses more than 4300 digits
_MAX_DEPTH = 200  # orjson refuses deeper nesting (255 levels)


__all__ = [
    "CONTROL_CHARS",
    "CONTROL_CHARS_TEXT",
    "escape_json_text",
    "escape_text",
    "has_control",
    "json_safe",
    "json_text",
]
