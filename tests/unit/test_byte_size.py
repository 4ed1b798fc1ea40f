"""Sizes operators write (``512MiB``, ``2G``): worker.max_memory and --max-memory."""

from __future__ import annotations

import pytest

from dueflow.byte_size import format_byte_size, parse_byte_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("800M", 800_000_000),
        ("800MB", 800_000_000),
        ("800mb", 800_000_000),
        ("512Mi", 512 * 2**20),
        ("512MiB", 512 * 2**20),
        ("512 MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("2g", 2_000_000_000),
        ("64k", 64_000),
        ("64KiB", 65_536),
    ],
)
def test_sizes_parse(text: object, size: int) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "12 parsecs", "-5M", "1.5", "M", True, 1.5, None])
def test_bad_sizes_name_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match="bytes as an integer, or a number with a unit"):
        parse_byte_size(text)


def test_sizes_print_for_logs() -> None:
    assert format_byte_size(512 * 2**20) == "512.0 MiB"
    assert format_byte_size(3 * 2**29) == "1.5 GiB"
    assert format_byte_size(100) == "100 B"
