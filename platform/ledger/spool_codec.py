"""One spool record per line: `<crc32 as 8 hex digits> <compact JSON>\\n`.

Why lines with a checksum: a crash can leave the last line half-written, and a
disk can return garbage; the checksum tells a whole record from a damaged one,
and the newline lets the reader resynchronise on the next record instead of
losing the rest of the file. Decimals (money) travel as `{"$decimal": "1.25"}`
and come back as Decimal, exactly; floats are refused, because a ledger entry
with a float in it has already lost money.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from hydrant.errors import HydrantError

DECIMAL_TAG = "$decimal"
MAX_RECORD_BYTES = 64 * 1024


class CorruptRecordError(HydrantError):
    """A line that is not a whole, intact record."""


def _to_jsonable(value: Any, path: str) -> Any:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{path}: Decimal must be finite")
        return {DECIMAL_TAG: str(value)}
    if isinstance(value, float):
        raise TypeError(f"{path}: floats are not allowed in ledger entries (use Decimal)")
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, Mapping):
        if DECIMAL_TAG in value:
            raise ValueError(f"{path}: the key {DECIMAL_TAG!r} is reserved")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: keys must be strings")
            out[key] = _to_jsonable(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_to_jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{path}: {type(value).__name__} cannot be spooled")


def _from_json_object(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and DECIMAL_TAG in obj:
        return Decimal(obj[DECIMAL_TAG])
    return obj


def encode_record(entry: Mapping[str, Any]) -> bytes:
    """The line for `entry`, which must carry a non-empty string `request_id`."""
    if not isinstance(entry, Mapping):
        raise TypeError("a ledger entry is a mapping")
    request_id = entry.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("a ledger entry needs a non-empty string request_id")
    payload = json.dumps(
        _to_jsonable(entry, "entry"), separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")
    line = b"%08x %s\n" % (zlib.crc32(payload), payload)
    if len(line) > MAX_RECORD_BYTES:
        raise ValueError(f"a ledger entry must encode to at most {MAX_RECORD_BYTES} bytes")
    return line


def decode_record(line: bytes) -> dict[str, Any]:
    """The entry in a complete line, or `CorruptRecordError`."""
    if not line.endswith(b"\n") or len(line) < 11 or line[8:9] != b" ":
        raise CorruptRecordError("not a complete record line")
    payload = line[9:-1]
    try:
        expected = int(line[:8], 16)
    except ValueError as exc:
        raise CorruptRecordError("bad checksum field") from exc
    if zlib.crc32(payload) != expected:
        raise CorruptRecordError("checksum mismatch")
    try:
        entry = json.loads(payload, object_hook=_from_json_object, parse_float=Decimal)
    except (ValueError, ArithmeticError) as exc:
        raise CorruptRecordError("undecodable payload") from exc
    if not isinstance(entry, dict) or not isinstance(entry.get("request_id"), str):
        raise CorruptRecordError("record is not a ledger entry")
    return entry
