"""The seal of stored answers: it opens only under the same server secret, for the same
tenant and answer id, and a changed byte anywhere is refused."""

from __future__ import annotations

import pytest

from hydrant.platform.inference.responses.seal import ResponseSealer, UnreadableAnswer

PAYLOAD = {"input": [{"role": "user", "content": "naïve café ☕"}], "body": {"id": "resp_1"}}


def test_a_sealed_answer_opens_to_what_was_sealed() -> None:
    sealer = ResponseSealer(lambda: b"s" * 32)
    blob = sealer.seal("ten_a", "resp_1", PAYLOAD)
    assert sealer.open("ten_a", "resp_1", blob) == PAYLOAD
    assert sealer.seal("ten_a", "resp_1", PAYLOAD) != blob  # a fresh nonce each time


@pytest.mark.parametrize(
    ("tenant", "response_id", "secret"),
    [
        ("ten_b", "resp_1", b"s" * 32),
        ("ten_a", "resp_2", b"s" * 32),
        ("ten_a", "resp_1", b"t" * 32),
    ],
    ids=["other tenant", "other answer", "other server secret"],
)
def test_it_does_not_open_elsewhere(tenant: str, response_id: str, secret: bytes) -> None:
    blob = ResponseSealer(lambda: b"s" * 32).seal("ten_a", "resp_1", PAYLOAD)
    with pytest.raises(UnreadableAnswer):
        ResponseSealer(lambda: secret).open(tenant, response_id, blob)


def test_a_changed_byte_or_version_is_refused() -> None:
    sealer = ResponseSealer(lambda: b"s" * 32)
    blob = sealer.seal("ten_a", "resp_1", PAYLOAD)
    for index in (0, 5, len(blob) // 2, len(blob) - 1):  # version, nonce, body, tag
        damaged = bytearray(blob)
        damaged[index] ^= 0x01
        with pytest.raises(UnreadableAnswer):
            sealer.open("ten_a", "resp_1", bytes(damaged))


def test_the_server_secret_is_read_only_when_first_needed() -> None:
    reads: list[int] = []

    def secret() -> bytes:
        reads.append(1)
        return b"s" * 32

    sealer = ResponseSealer(secret)
    assert reads == []
    sealer.open("ten_a", "resp_1", sealer.seal("ten_a", "resp_1", PAYLOAD))
    assert reads == [1]
