"""Configuration values (config.py): sizes given as strings, by users and environment."""

from __future__ import annotations

import pytest

from conveyor import config
from conveyor.errors import InputError


@pytest.mark.parametrize("value", ["1e9999999", "1" * 5000, "1e" + "9" * 5000, "1e30"])
def test_a_size_larger_than_any_memory_is_refused_at_once(value):
    # Before: "1e9999999" spent seconds building a 10-million-digit integer and then raised
    # Python's own ValueError; a longer exponent would run for minutes.
    with pytest.raises(InputError, match="larger than any memory.*use bytes as an int"):
        config.parse_size("block_bytes", value)


def test_large_but_real_sizes_still_parse():
    assert config.parse_size("memory_limit", "1e29") == 10**29
    assert config.parse_size("memory_limit", "0001.5e3KiB") == 1536000


def test_a_size_in_non_ascii_digits_is_refused():
    with pytest.raises(InputError, match="is not a size"):
        config.parse_size("block_bytes", "\u0664\u0660\u0669\u0666")  # 4096 in Arabic-Indic
