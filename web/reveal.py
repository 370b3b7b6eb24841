"""A new key's secret, held for one showing and then forgotten.

Why not render the secret in the POST's response: reloading that page would
post again and make another key. The POST stores the secret here and
redirects; the first GET of the reveal page takes it out, so reloading shows
"already shown" and the secret exists nowhere on the server any more. Held in
this process only (for at most `TTL_S`), bound to the session that made it:
behind several gateways, /ui needs session affinity for this one redirect,
or the page says the key was made but can no longer be shown (rotate it).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

TTL_S = 600.0
MAX_HELD = 1000


@dataclass(frozen=True)
class Reveal:
    secret: str
    key_id: str
    key_prefix: str
    tenant_id: str | None
    action: str  # "created" or "rotated"


class RevealStore:
    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[float, Reveal]] = {}
        self._lock = threading.Lock()

    def put(self, sid: str, reveal: Reveal) -> str:
        token = secrets.token_urlsafe(24)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            while len(self._held) >= MAX_HELD:
                self._held.pop(next(iter(self._held)))
            self._held[(sid, token)] = (now, reveal)
        return token

    def take(self, sid: str, token: str) -> Reveal | None:
        with self._lock:
            self._expire(time.monotonic())
            held = self._held.pop((sid, token), None)
        return None if held is None else held[1]

    def _expire(self, now: float) -> None:
        for key in [k for k, (at, _) in self._held.items() if now - at > TTL_S]:
            del self._held[key]


REVEALS = RevealStore()
