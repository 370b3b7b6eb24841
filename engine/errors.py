"""Errors the engine raises to its callers.

The engine never imports the platform, so it cannot raise HTTP errors; it
raises these typed errors instead and the front maps them (an
`InvalidRequestError` becomes an OpenAI-style 400 whose `param` names the
offending request field).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequestError(EngineError):
    """A request the engine cannot serve as asked; the caller's fault, not the engine's.

    `param` is the OpenAI request parameter at fault (e.g. "temperature"), or
    None when the problem is not tied to one field, so the API can echo it in
    its error body the way OpenAI does.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class ModelLoadError(EngineError):
    """A checkpoint directory that cannot be turned into a model.

    Raised before any request is served, so the operator sees the cause (a
    missing file, a tensor of the wrong shape) instead of a wrong answer later.
    """


class UnsupportedModelError(ModelLoadError):
    """The checkpoint's architecture or an option of it (a RoPE type) is not one we implement.

    Failing loudly beats loading an unknown layout by guesswork: a model that
    loads but computes something else would serve plausible garbage.
    """


class MissingWeightError(ModelLoadError):
    """A tensor the model needs is absent from the checkpoint (or has the wrong shape)."""


class KVCacheCapacityError(EngineError):
    """The KV memory budget cannot hold even one sequence of the maximum length.

    Raised at start-up: an engine that cannot finish a max-length request would
    preempt it forever instead of serving it.
    """


class ChatTemplateError(InvalidRequestError):
    """A conversation that cannot be rendered: the model has no chat template, or its
    template rejected the messages (e.g. roles that do not alternate)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "messages")
