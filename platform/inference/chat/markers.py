"""Finding tags in text that arrives in pieces."""

from __future__ import annotations


def partial_suffix(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker`: what a
    stream holds back until the next piece says whether the tag is there."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def undecided(head: str, marker: str) -> bool:
    """Whether text that starts with `head` may still turn out to open with `marker`
    (nothing yet, or a strict prefix of it): a reader waits before it says which."""
    return not head or (marker.startswith(head) and head != marker)
