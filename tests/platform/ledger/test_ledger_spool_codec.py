"""Spool records: exact Decimals, no floats, a checksum that catches any damage."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrant.platform.ledger.spool_codec import (
    CorruptRecordError,
    decode_record,
    encode_record,
)

BASE = {"request_id": "r1", "charge": Decimal("0.001234"), "tags": ["a", 1, None, True]}


def test_round_trip_keeps_decimals_exact() -> None:
    line = encode_record(BASE)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded = decode_record(line)
    assert decoded == BASE
    assert str(decoded["charge"]) == "0.001234"


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"request_id": "r", "charge": 0.1}, TypeError),
        ({"request_id": "r", "x": {"$decimal": "1"}}, ValueError),
        ({"request_id": "r", "x": Decimal("NaN")}, ValueError),
        ({"request_id": "r", "x": object()}, TypeError),
        ({"request_id": "r", 1: "x"}, TypeError),
        ({"charge": Decimal(1)}, ValueError),
        ({"request_id": ""}, ValueError),
        ({"request_id": "r", "blob": "x" * 70_000}, ValueError),
    ],
)
def test_unspoolable_entries_are_refused(bad: dict[object, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_record(cast(Any, bad))


def test_newlines_inside_values_stay_inside_one_line() -> None:
    line = encode_record({"request_id": "r\n2", "note": "a\nb"})
    assert line.count(b"\n") == 1
    assert decode_record(line)["request_id"] == "r\n2"


@pytest.mark.parametrize(
    "line",
    [b"", b"\n", b"00000000 {}\n", b"zzzzzzzz {}\n", b"12345678{}\n", b'00000000 {"request_id":1}'],
)
def test_malformed_lines_are_corrupt(line: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_record(line)


@given(st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_any_single_byte_change_is_detected(position: int, value: int) -> None:
    line = bytearray(encode_record(BASE))
    index = position % (len(line) - 1)  # keep the final newline
    if line[index] == value:
        return
    line[index] = value
    try:
        decoded = decode_record(bytes(line))
    except CorruptRecordError:
        return
    pytest.fail(f"damage at byte {index} went unnoticed: {decoded}")
