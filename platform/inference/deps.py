"""What the inference API's handlers are given: one object, injected once per request.

Why one object and not five dependencies: every `/v1` request needs the same
few services, and resolving one cached dependency costs the hot path less
than resolving each; it is built once, at the app's assembly
(`hydrant.platform.services`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hydrant.platform.adapters.catalog import AdapterCatalog
from hydrant.platform.inference.abuse import AbuseGuard
from hydrant.platform.inference.responses.store import ResponseStore
from hydrant.platform.inference.service import InferenceService
from hydrant.platform.ledger.attribution import EndUserHasher
from hydrant.platform.models.registry import ModelRegistry


@dataclass(frozen=True)
class InferenceApi:
    registry: ModelRegistry
    service: InferenceService
    abuse: AbuseGuard
    responses: ResponseStore
    default_max_tokens: int
    adapters: AdapterCatalog | None = None  # LoRA adapters a request may name
    end_users: EndUserHasher | None = None  # hashes `user`/`safety_identifier` for the ledger
