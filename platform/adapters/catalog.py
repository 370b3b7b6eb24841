"""The gateway's copy of the adapter registry: which adapters a request may name.

Why a copy: resolving `model` happens on every request, before anything else, and must
not cost a query. The copy is reloaded every `refresh_s` (other gateways see an adapter
added or removed within that, without a restart), and the gateway that handles the admin
call applies the change at once, like the auth cache's invalidation. A reload that
started before such a local change is dropped, so it cannot undo the change with what it
read before the change was committed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select

from hydrant.engine.protocol import AdapterRef
from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.refreshed_copy import RefreshedCopy
from hydrant.platform.db.session import Database
from hydrant.platform.errors import InvalidRequest

log = logging.getLogger(__name__)

# No `:` (it separates base and adapter in `base:adapter`) and no `/`.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class AdapterEntry:
    base_model: str
    name: str
    path: str
    tenant_id: str | None  # None: public
    created: int  # unix seconds, for `GET /v1/models`

    @property
    def model_name(self) -> str:
        """How requests, prices, reports and metrics name it."""
        return f"{self.base_model}:{self.name}"

    @property
    def ref(self) -> AdapterRef:
        return AdapterRef(name=self.model_name, path=self.path)

    def visible_to(self, tenant_id: str | None) -> bool:
        """Public adapters, and a tenant's own; an admin key (no tenant) sees them all."""
        return self.tenant_id is None or tenant_id is None or self.tenant_id == tenant_id

    @classmethod
    def of(cls, row: Adapter) -> AdapterEntry:
        return cls(
            base_model=row.base_model,
            name=row.name,
            path=row.path,
            tenant_id=row.tenant_id,
            created=int(row.created_at.timestamp()),
        )


class AdapterCatalog(RefreshedCopy):
    copy_name = "adapter-catalog"

    def __init__(self, database: Database | None, refresh_s: float = 5.0) -> None:
        self.database = database
        self.refresh_s = max(0.1, refresh_s)
        self._entries: dict[tuple[str, str], AdapterEntry] = {}
        self._version = 0  # bumped by every local change (see the module's docstring)

    # ---- what the request path asks ------------------------------------------------------

    def resolve(
        self, model: str, tenant_id: str | None, served: Iterable[str]
    ) -> AdapterEntry | None:
        """The adapter `model` names for this tenant (`base:adapter`, or an adapter's name
        when one visible adapter of a served base model has it), or None: then the caller
        answers as for an unknown model, so another tenant's adapter is not revealed."""
        bases = set(served)
        base, sep, name = model.rpartition(":")
        if sep:
            entry = self._entries.get((base, name))
            if entry is not None and base in bases and entry.visible_to(tenant_id):
                return entry
            return None
        matches = [e for e in self.visible(tenant_id) if e.name == model and e.base_model in bases]
        if len(matches) > 1:
            names = ", ".join(sorted(e.model_name for e in matches))
            raise InvalidRequest(
                f"`{model}` names adapters of several base models; use one of: {names}",
                param="model",
                code="ambiguous_model",
            )
        return matches[0] if matches else None

    def visible(self, tenant_id: str | None) -> list[AdapterEntry]:
        """The adapters this tenant may use, by name."""
        entries = (e for e in self._entries.values() if e.visible_to(tenant_id))
        return sorted(entries, key=lambda e: e.model_name)

    def directories_of(self, base_model: str) -> dict[str, str]:
        """Every adapter of `base_model` (any tenant's), name to directory: what a hot swap
        of the base model must still fit."""
        return {e.name: e.path for e in self._entries.values() if e.base_model == base_model}

    # ---- changes ---------------------------------------------------------------------------

    def put(self, entry: AdapterEntry) -> None:
        self._version += 1
        self._entries[(entry.base_model, entry.name)] = entry

    def discard(self, base_model: str, name: str) -> None:
        self._version += 1
        self._entries.pop((base_model, name), None)

    async def refresh(self) -> None:
        if self.database is None:
            return
        version = self._version
        async with self.database.session() as session:
            rows = (await session.scalars(select(Adapter))).all()
        if version != self._version:
            return  # changed here meanwhile: the next reload reads it committed
        self._entries = {(r.base_model, r.name): AdapterEntry.of(r) for r in rows}

    def _can_refresh(self) -> bool:
        return self.database is not None
