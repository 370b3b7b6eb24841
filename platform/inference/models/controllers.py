"""Routes: `GET /v1/models` and `GET /v1/models/{model}` (OpenAI's list and retrieve)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from hydrant.platform.auth.principal import Principal
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.schemas import ModelCard, ModelList
from hydrant.platform.inference.serving import served_model


class ModelsController(Controller):
    path = "/v1/models"

    @get("/")
    async def list_models(
        self, inference: NamedDependency[InferenceApi], principal: NamedDependency[Principal]
    ) -> ModelList:
        """The models this gateway serves that the key's plan includes, then the LoRA
        adapters on them this tenant may use (public ones and its own)."""
        allowed = principal.allowed_models
        models = [m for m in inference.registry.all() if allowed is None or m.name in allowed]
        cards = [ModelCard(id=m.name, created=m.created) for m in models]
        if inference.adapters is not None:
            served = set(inference.registry.names())
            cards.extend(
                ModelCard(
                    id=a.model_name,
                    created=a.created,
                    owned_by=a.tenant_id or "hydrant",
                    parent=a.base_model,
                )
                for a in inference.adapters.visible(principal.tenant_id)
                if a.base_model in served
                and (allowed is None or a.base_model in allowed or a.model_name in allowed)
            )
        return ModelList(data=cards)

    @get("/{model:path}")
    async def retrieve_model(
        self,
        model: FromPath[str],
        inference: NamedDependency[InferenceApi],
        principal: NamedDependency[Principal],
    ) -> ModelCard:
        """OpenAI's "retrieve model"; a path parameter, since served names may hold a slash."""
        served = served_model(inference, principal, model.lstrip("/"))
        if served.adapter is not None:
            return ModelCard(id=served.adapter.name, created=served.created, parent=served.name)
        return ModelCard(id=served.name, created=served.created)
