"""The models this gateway serves right now: name → tokenizer, engine client, limits.

The gateway tokenizes itself (quotas are counted with the model's real
tokenizer before dispatch), so each entry holds a tokenizer next to the
`EngineClient` that runs the model, in this process or behind HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hydrant.engine.protocol import AdapterRef, EngineClient
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.errors import NotFound


@dataclass
class ServedModel:
    name: str
    tokenizer: Tokenizer
    client: EngineClient
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))
    state: str = "loaded"
    # Engine limits, for `GET /admin/engines` and `hydrant preflight` (None: not known here).
    max_num_seqs: int | None = None
    block_size: int | None = None
    tool_call_parser: str | None = None  # set by the operator (None: read from the template)
    # A LoRA adapter on this base model: a per-request view of the base model's entry
    # (same tokenizer, same engine client), never an entry of the registry itself.
    adapter: AdapterRef | None = None


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}

    def add(self, model: ServedModel) -> None:
        self._models[model.name] = model

    def get(self, name: str) -> ServedModel:
        try:
            return self._models[name]
        except KeyError:
            raise NotFound(
                f"The model `{name}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            ) from None

    def find(self, name: str) -> ServedModel | None:
        return self._models.get(name)

    def names(self) -> list[str]:
        return sorted(self._models)

    def all(self) -> list[ServedModel]:
        return [self._models[name] for name in self.names()]

    def model_state(self, name: str) -> str | None:
        """`ModelRuntime` for readiness: the state of a model this gateway holds."""
        model = self._models.get(name)
        return model.state if model is not None else None
