"""A batch's input file, line by line: read, checked up front, and what each line may cost.

Every line is checked when the batch is made, before any work, with the checks the
interactive request path makes (the same body decoding, preparation and tokenization,
and the plan's length tiers), so a line that would fail later fails the whole batch
now, with `errors` naming its line number (1-based, counting every line of the file).
The runner reads the same file again and prepares each pending line the same way, so
what a line reserved at creation is exactly what it gives back when it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import msgspec

from hydrant.engine.output_constraints import constraint_error
from hydrant.platform.auth.principal import Principal
from hydrant.platform.billing.money import to_micro_units
from hydrant.platform.billing.pricing import Price, TokenUsage, charge_for
from hydrant.platform.errors import DomainError
from hydrant.platform.inference.chat.controllers import CHAT
from hydrant.platform.inference.completions.controllers import TEXT
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.embeddings.controllers import EMBEDDINGS
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.inference.responses.controllers import RESPONSES
from hydrant.platform.inference.schemas import decode_body
from hydrant.platform.inference.serving import Endpoint, prepare_body
from hydrant.platform.quotas.tiers import RequestTooLargeError, TierPolicy, classify

# The endpoints a batch may name, each served by its `/v1` surface's own `Endpoint`.
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": TEXT,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
}
MAX_CUSTOM_ID = 512
MAX_ERRORS = 1000  # a file of 50,000 bad lines gets the first thousand named


class RawLine(msgspec.Struct, kw_only=True):
    """One line as the file holds it; the body stays raw for the endpoint's own decoder."""

    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: msgspec.Raw = msgspec.Raw()  # empty: the line has no body


@dataclass(frozen=True)
class LineError:
    code: str
    message: str
    line: int
    param: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class InputLine:
    """A line that reads as a request: its number, its custom_id, its decoded body."""

    number: int
    custom_id: str
    body: Any


@dataclass(frozen=True)
class LineCost:
    """The most a line can use: its prompt tokens, and prompt + max output tokens."""

    prompt_tokens: int
    output_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def money(self, price: Price) -> Decimal:
        usage = TokenUsage(input_tokens=self.prompt_tokens, output_tokens=self.output_tokens)
        return charge_for(usage, price)

    def micros(self, price: Price) -> int:
        """`money` in integer micro-units: what the line holds of its batch's reservation
        (a batch reserves the sum of its lines', so each gives back exactly its own)."""
        return to_micro_units(self.money(price))


def line_cost(prepared: PreparedRequest) -> LineCost:
    """What the gate would reserve for this request (quotas/gate.py): its prompt tokens and
    every choice's `max_tokens`."""
    output = sum(p.sampling.max_tokens * p.sampling.n for p in prepared.prompts)
    return LineCost(prepared.prompt_tokens, output)


def read_lines(content: bytes, url: str, endpoint: Endpoint) -> Iterator[InputLine | LineError]:
    """Each non-blank line of the file as a request of `endpoint`, or why it is not one."""
    seen: set[str] = set()
    for number, text in enumerate(content.splitlines(), start=1):
        if not text.strip():
            continue
        try:
            raw = msgspec.json.decode(text, type=RawLine)
        except (msgspec.DecodeError, msgspec.ValidationError):
            yield LineError("invalid_json_line", "the line is not a JSON object", number)
            continue
        custom_id = raw.custom_id
        if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
            yield LineError(
                "invalid_custom_id",
                f"custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters",
                number,
                "custom_id",
            )
            continue
        if custom_id in seen:
            yield LineError(
                "duplicate_custom_id", f"custom_id {custom_id!r} is used twice", number, "custom_id"
            )
            continue
        seen.add(custom_id)
        if raw.method != "POST":
            yield LineError("invalid_method", "method must be POST", number, "method")
            continue
        if raw.url != url:
            yield LineError(
                "invalid_url", f"url must be the batch's endpoint, {url}", number, "url"
            )
            continue
        if not bytes(raw.body):
            yield LineError("invalid_body", "the line has no body", number, "body")
            continue
        try:
            body = decode_body(bytes(raw.body), endpoint.body)
        except DomainError as exc:
            yield LineError("invalid_body", exc.message, number, exc.param)
            continue
        if getattr(body, "stream", False):
            yield LineError("invalid_body", "stream is not supported in a batch", number, "stream")
            continue
        if getattr(body, "previous_response_id", None) is not None:  # nothing is stored
            yield LineError(
                "invalid_body",
                "previous_response_id is not supported in a batch: send the conversation in input",
                number,
                "previous_response_id",
            )
            continue
        yield InputLine(number, custom_id, body)


@dataclass
class Checked:
    """A file checked as a batch: its model, each line's cost, or the errors."""

    model: str | None
    costs: dict[int, LineCost]  # by line number
    errors: list[LineError]
    # The LoRA adapter every line names on `model` (`base:adapter`), None: the base model.
    # One per batch, like the model: the batch is priced and reserved at its price.
    adapter: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.costs.values())

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.costs.values())


def check_file(content: bytes, url: str, api: InferenceApi, principal: Principal) -> Checked:
    """Every line prepared as the request path would (CPU work: run it in a thread)."""
    endpoint = ENDPOINTS[url]
    policy = principal.plan.tiers if principal.plan is not None else TierPolicy()
    checked = Checked(model=None, costs={}, errors=[])

    def fail(error: LineError) -> None:
        if len(checked.errors) < MAX_ERRORS:
            checked.errors.append(error)

    for item in read_lines(content, url, endpoint):
        if isinstance(item, LineError):
            fail(item)
            continue
        try:
            model, prepared = prepare_body(api, principal, endpoint, item.body)
        except DomainError as exc:
            code = exc.code or "invalid_request"
            fail(LineError(code, exc.message, item.number, exc.param))
            continue
        adapter = model.adapter.name if model.adapter is not None else None
        if checked.model is None:
            checked.model, checked.adapter = model.name, adapter
        elif (model.name, adapter) != (checked.model, checked.adapter):
            fail(
                LineError(
                    "mismatched_model",
                    f"every line of a batch must use one model; the first used "
                    f"{checked.adapter or checked.model!r}, this one {adapter or model.name!r}",
                    item.number,
                    "model",
                )
            )
            continue
        constraint = prepared.settings.structured_output
        problem = constraint_error(*constraint) if constraint is not None else None
        if problem is not None:
            field = prepared.constraint_field
            fail(LineError("invalid_body", f"{field}: {problem}", item.number, field))
            continue
        try:
            for prompt in prepared.prompts:
                classify(
                    len(prompt.token_ids),
                    prompt.sampling.max_tokens,
                    policy,
                    model_context=model.max_model_len,
                )
        except RequestTooLargeError as exc:
            fail(LineError("context_length_exceeded", str(exc), item.number, "max_tokens"))
            continue
        checked.costs[item.number] = line_cost(prepared)
    if not checked.costs and not checked.errors:
        fail(LineError("empty_file", "the input file holds no request", 1))
    return checked
