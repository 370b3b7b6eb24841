"""One typed settings object, read once from `HYDRANT_*` variables and an optional TOML file.

Modules never read the environment themselves: the CLI builds a `Settings`
with `load_settings()` and passes it down, so tests can build one directly and
two settings objects can live in one process (two gateways in one test).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

from hydrant.errors import ConfigurationError

ENV_PREFIX = "HYDRANT_"

FailureMode = Literal["closed", "open"]
LogFormat = Literal["json", "text"]
PoolScalerKind = Literal["local", "kubernetes", "none"]
ScaleDownMode = Literal["sleep", "exit"]
# Where `hydrant serve` runs its own engines when no pools are configured: in a child
# process per model (its own interpreter, no GIL shared with the gateway), or in a thread.
EmbeddedEngineMode = Literal["process", "thread"]
DigestNoUsage = Literal["send", "skip"]
LedgerCommitMode = Literal["database", "journal"]  # hydrant.platform.ledger.service
UsageExportFormat = Literal["stripe", "json"]  # hydrant.platform.usage_export.wire
# How `tool_choice: auto` reads calls from a model's text (hydrant.platform.inference.chat.tools);
# "none" turns `auto` off for the model.
TOOL_CALL_PARSERS = ("hermes", "mistral", "llama3_json", "none")
# Kinds of upstream pool (`HYDRANT_POOL_BACKENDS`): servers that speak the OpenAI API (vLLM,
# SGLang, another Hydrant) and accept a token-id `prompt` on `/v1/completions`.
UpstreamKind = Literal["openai"]
UPSTREAM_KINDS: tuple[UpstreamKind, ...] = ("openai",)


@dataclass(frozen=True)
class ModelSpec:
    """A model the gateway serves: the public name and the checkpoint directory."""

    name: str
    path: Path

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse `name=path`, the form used in `HYDRANT_MODELS` (comma separated)."""
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ConfigurationError(
                f"model spec {text!r} must look like NAME=PATH (e.g. llama3=/models/llama3-8b)"
            )
        return cls(name=name.strip(), path=Path(path.strip()).expanduser())


@dataclass(frozen=True)
class UpstreamSpec:
    """A model whose pool is upstream servers, not Hydrant workers: the kind and the members."""

    model: str
    kind: UpstreamKind
    urls: tuple[str, ...]
    # The members run vLLM's sleep mode (`HYDRANT_UPSTREAM_SLEEP`): put to sleep when idle,
    # woken by the first request (dispatch.upstream_health, dispatch.pool).
    sleep: bool = False


def parse_pool_backends(text: str) -> dict[str, UpstreamSpec]:
    """`MODEL=KIND:URL[,URL...]`, models separated by `;` (URLs by `,`)."""
    specs: dict[str, UpstreamSpec] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        model, sep, rest = (part.strip() for part in item.partition("="))
        kind_text, _, urls_text = rest.partition(":")
        kind = next((k for k in UPSTREAM_KINDS if k == kind_text.strip()), None)
        urls = tuple(u.strip().rstrip("/") for u in urls_text.split(",") if u.strip())
        if not sep or not model or kind is None or not urls:
            raise ConfigurationError(
                f"pool backend {item.strip()!r} must look like MODEL=KIND:URL[,URL...] with KIND"
                f" one of {', '.join(UPSTREAM_KINDS)} ({ENV_PREFIX}POOL_BACKENDS)"
            )
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ConfigurationError(
                f"pool backend of {model}: {bad[0]!r} is not an http(s) URL"
                f" ({ENV_PREFIX}POOL_BACKENDS)"
            )
        if model in specs:
            raise ConfigurationError(f"pool backend of {model} is set twice")
        specs[model] = UpstreamSpec(model=model, kind=kind, urls=urls)
    return specs


@dataclass(frozen=True)
class Settings:
    """Everything Hydrant can be configured with; each field is documented in the README."""

    data_dir: Path = Path("data")
    database_url: str | None = None
    redis_url: str | None = None
    smtp_url: str | None = None
    outbox_dir: Path | None = None
    models: tuple[ModelSpec, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    admin_bootstrap_key: str | None = None
    secret_key: str | None = None
    key_env: Literal["live", "test"] = "live"
    key_cache_ttl_s: float = 5.0
    adapter_refresh_s: float = 5.0  # how soon other gateways see an adapter added or removed
    auto_migrate: bool = True
    device: str = "cpu"
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    kv_cache_bytes: int = 256 * 1024 * 1024
    max_num_seqs: int = 0  # 0: by device, 128 on CPU, 256 on GPU (default_max_num_seqs)
    long_lane_tokens: int = 2048  # per engine step, for prompts of 512+ tokens
    quantization: str | None = None
    kv_cache_dtype: Literal["auto", "int8"] = "auto"
    enforce_eager: bool = False  # no CUDA graphs for decode steps
    enable_prefix_caching: bool = True  # reuse cached KV blocks of shared prompt prefixes
    # base prompt tokens of a step with decodes (token_budget.prefill_cap); 0: off
    max_prefill_tokens_while_decoding: int = 1024
    # batch lines' tokens in a step; unset: by device, 64 on CPU, 512 on GPU; 0: off
    max_background_step_tokens: int | None = None
    max_loras: int = 8  # LoRA adapters in device memory at once (slots, LRU); 0: none
    max_cpu_loras: int = 32  # more adapters kept loaded in host memory (LRU)
    max_lora_rank: int = 16  # largest adapter rank served; every slot is padded to it
    engine_threads: str = "auto"  # torch threads: auto (engine_config.resolve_num_threads) or N
    max_request_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    body_read_timeout_s: float = 30.0
    ingest_concurrency: int = 8  # generation requests in the admission path at once; 0: off
    lean_path: bool = True  # generation routes answered from ASGI; false: Litestar's handlers
    header_read_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    auth_max_failures: int = 20
    auth_failure_window_s: float = 60.0
    auth_block_s: float = 300.0
    trusted_proxies: str = ""
    cors_origins: str = ""
    metrics_token: str | None = None  # set: GET /metrics needs `Authorization: Bearer <it>`
    default_max_tokens: int = 256
    tool_call_parsers: str = ""  # NAME=PARSER,…: overrides the format read from the template
    responses_store_days: int = 30  # Responses API answers kept this long; 0: none
    files_max_bytes: int = 100 * 1024 * 1024  # one `/v1/files` upload at most
    files_max_lines: int = 50_000  # lines of a `purpose=batch` file (one request each)
    files_dir: Path | None = None  # a volume for file contents; None: in the database
    files_retention_days: int = 30  # files (uploads and batch outputs) deleted after
    batch_lane_slots: int = 8  # batch lines of one model a gateway runs at once, when idle
    batch_lane_busy_slots: int = 0  # ... and while interactive requests of it are in flight
    price_input_per_mtok: Decimal = Decimal("0.10")
    price_cached_input_per_mtok: Decimal = Decimal("0.05")
    price_output_per_mtok: Decimal = Decimal("0.40")
    device_price_per_hour: Decimal = Decimal("1.00")
    # Cost reconciliation: how often a gateway records its pools' worker states (0: never).
    timeline_sample_s: float = 5.0
    long_lane_slots: int = 2
    long_lane_queue: int = 64
    spool_max_bytes: int = 256 * 1024 * 1024
    ledger_commit: LedgerCommitMode = "database"
    redis_failure_mode: FailureMode = "closed"
    # a request's quota admission called inline (blocking) while it is alone in the admission
    # path and Redis answers within this (median of 16 calls); 0: always through the loop
    quota_inline_ms: float = 1.0
    log_level: str = "INFO"
    log_format: LogFormat = "json"
    log_file: Path | None = None
    public_url: str | None = None
    digest_from: str = "Hydrant <hydrant@localhost>"
    digest_no_usage: DigestNoUsage = "send"
    admin_digest_to: str | None = None
    admin_digest_hour: int = 7
    invoice_issuer: str = "HYD"  # the prefix of invoice numbers: HYD-2026-000123
    invoice_issuer_name: str = "Hydrant"  # who issues the invoices, as printed on them
    embedded_jobs: bool = True
    embedded_engine: EmbeddedEngineMode = "process"
    worker_pools: bool = False
    worker_secret: str | None = None
    worker_registry_prefix: str = "hydrant:workers"
    worker_registry_dir: Path | None = None  # a worker registers here (files), not in Redis
    worker_advertise_host: str | None = None
    worker_advertise_port: int = 0  # 0: the port it listens on (else: behind a proxy/NAT)
    worker_keepalive_s: float = 2.0  # empty frame on a silent step stream (link)
    worker_stream_idle_timeout_s: float = 30.0  # gateway: silent this long = worker lost
    worker_max_streams: int = 1024  # gateway: admit/cancel calls open to one worker at once
    worker_heartbeat_s: float = 1.0
    worker_heartbeat_ttl_s: float = 5.0
    worker_drain_timeout_s: float = 30.0
    pool_scaler: PoolScalerKind = "local"
    pool_start_workers: int = 1
    pool_max_workers: int = 4
    pool_idle_timeout_s: float = 300.0
    pool_scale_down: ScaleDownMode = "sleep"
    pool_wake_timeout_s: float = 60.0
    pool_swap_timeout_s: float = 300.0
    pool_prefix_blocks: int = 8
    pool_backends: str = ""  # MODEL=openai:URL[,URL...];...: upstream servers instead of workers
    upstream_api_key: str | None = field(default=None, repr=False)  # sent as a bearer token
    upstream_api_key_file: Path | None = None  # or read from this file (a mounted secret)
    upstream_health_s: float = 2.0  # each upstream member probed this often
    # Upstream models whose members sleep when idle (vLLM's sleep mode, level 1), comma separated
    upstream_sleep: str = ""
    # Sent on the sleep-mode calls (/sleep, /wake_up, /is_sleeping); unset: the upstream API key
    upstream_control_key: str | None = field(default=None, repr=False)
    upstream_control_key_file: Path | None = None  # or read from this file (a mounted secret)
    upstream_max_inflight: int = 256  # requests one member takes before the pool counts it full
    # The usage export (hydrant.platform.usage_export): hourly usage records to a receiver.
    usage_export_url: str | None = None  # None: no export job runs
    usage_export_format: UsageExportFormat = "stripe"
    usage_export_secret: str | None = None  # sent as `Authorization: Bearer`; never logged
    usage_export_event_name: str = "hydrant_tokens"  # the Stripe meter's event name
    usage_export_batch_size: int = 100  # records claimed (and, as json, posted) at once
    usage_export_settle_s: float = 300.0  # an hour is exported this long after it ends
    usage_export_backoff_s: float = 30.0  # first retry delay, doubled per attempt (1 h max)
    usage_export_lease_s: float = 300.0  # a claimed record is re-sent after this unmarked
    usage_export_timeout_s: float = 10.0  # one HTTP request to the receiver
    usage_export_lookback_hours: int = 168  # late ledger entries recorded this far back
    # Delivered records of hours older than this are deleted (hydrant.billing.purge_usage_export)
    # and no hour older is exported again; longer than the lookback. 0: kept forever.
    usage_export_retention_days: int = 400
    # The cost reconciliation's daily rows and worker timeline older than this are deleted
    # (hydrant.billing.purge_reconciliation); at least 2 (yesterday is re-stored). 0: kept.
    reconciliation_retention_days: int = 400
    # Fair share in front of upstream members: prompt + max_tokens this gateway has in flight on
    # one member, the rest waits in tenant-fair order (0: no bound, no fair queue) ...
    upstream_max_inflight_tokens: int = 65536
    upstream_queue_timeout_s: float = 30.0  # ... at most this long, then a 503
    k8s_api_url: str | None = None
    k8s_token: str | None = None
    k8s_namespace: str = "default"
    k8s_deployment: str = "hydrant-worker-{model}"
    k8s_container: str = "worker"
    # an upstream pool's workload, scaled 0<->1 by the gateway with the kubernetes scaler
    k8s_upstream_workload: str = "deployment/vllm-{model}"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def effective_database_url(self) -> str:
        """The configured database, or the embedded SQLite file under the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'hydrant.db').resolve()}"

    @property
    def effective_outbox_dir(self) -> Path:
        return self.outbox_dir or self.data_dir / "outbox"

    def tool_call_parser(self, model: str) -> str | None:
        """The tool-call format set for a served model (None: the one its chat template
        teaches, found by `template_parser`), like vLLM's `--tool-call-parser`.

        A template may teach a format Hydrant mistakes for another, or one a fine-tune
        no longer follows; this is the operator's way to say which, or to turn `auto` off.
        """
        return _tool_call_parsers(self.tool_call_parsers).get(model)

    @property
    def pool_mode(self) -> bool:
        """Models are served by pools (Hydrant workers and/or upstream servers), not in here."""
        return self.worker_pools or bool(self.pool_backends.strip())

    def upstream_pools(self) -> dict[str, UpstreamSpec]:
        """The models served by upstream servers (`HYDRANT_POOL_BACKENDS`), by name."""
        specs = parse_pool_backends(self.pool_backends)
        sleeping = self.upstream_sleep_models()
        return {name: replace(spec, sleep=name in sleeping) for name, spec in specs.items()}

    def upstream_sleep_models(self) -> frozenset[str]:
        """The upstream models whose members sleep when idle (`HYDRANT_UPSTREAM_SLEEP`)."""
        return frozenset(m.strip() for m in self.upstream_sleep.split(",") if m.strip())

    def upstream_key(self) -> str | None:
        """The upstream servers' API key: the setting, else the file's first line."""
        return _secret(self.upstream_api_key, self.upstream_api_key_file, "UPSTREAM_API_KEY")

    def upstream_control_secret(self) -> str | None:
        """The key of the upstream members' sleep-mode calls: its own, else the API key.

        vLLM leaves those routes unguarded (they exist only in its dev mode); a
        Hydrant upstream answers them for admin keys only, where the API key is a
        tenant's: hence a key of their own.
        """
        own = _secret(
            self.upstream_control_key, self.upstream_control_key_file, "UPSTREAM_CONTROL_KEY"
        )
        return own or self.upstream_key()

    @property
    def demo_model_dir(self) -> Path:
        return self.data_dir / "models" / "demo"

    @property
    def embedded(self) -> bool:
        """True when no external service is configured: everything runs in this process."""
        return self.database_url is None and self.redis_url is None

    def served_models(self) -> tuple[ModelSpec, ...]:
        """The models to serve; the generated demo model when none is configured."""
        if self.models:
            return self.models
        return (ModelSpec(name="demo", path=self.demo_model_dir),)


def _tool_call_parsers(text: str) -> dict[str, str]:
    parsers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, parser = (part.strip() for part in item.partition("="))
        if not sep or not name or parser not in TOOL_CALL_PARSERS:
            raise ConfigurationError(
                f"tool call parser {item.strip()!r} must look like MODEL=PARSER with PARSER "
                f"one of {', '.join(TOOL_CALL_PARSERS)} ({ENV_PREFIX}TOOL_CALL_PARSERS)"
            )
        parsers[name] = parser
    return parsers


_FIELD_TYPES: dict[str, Any] = get_type_hints(Settings)
_ENV_FIELDS = [f.name for f in fields(Settings) if f.name != "extra"]


def _coerce(name: str, raw: Any) -> Any:
    """Turn an environment string or TOML value into the field's type, with a clear error."""
    kind = _FIELD_TYPES[name]
    try:
        if name == "models":
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            specs = []
            for item in items:
                if isinstance(item, Mapping):
                    specs.append(ModelSpec(name=str(item["name"]), path=Path(str(item["path"]))))
                elif str(item).strip():
                    specs.append(ModelSpec.parse(str(item)))
            return tuple(specs)
        if name == "engine_threads":
            text = str(raw).strip().lower()
            if text != "auto" and not (text.isdigit() and int(text) >= 1):
                raise ValueError("expected auto or a positive integer")
            return text
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in {"1", "true", "yes", "on"}:
                return True
            if text in {"0", "false", "no", "off"}:
                return False
            raise ValueError("expected true or false")
        if kind is int:
            return int(raw)
        if kind == int | None:
            return None if str(raw).strip() == "" else int(raw)
        if kind is float:
            return float(raw)
        if kind is Decimal:
            if isinstance(raw, float):
                raise ValueError("money must be written as a string, not a float")
            value = Decimal(str(raw))
            if not value.is_finite() or value < 0:
                raise ValueError("expected a non-negative decimal number")
            return value
        if kind in (Path, Path | None):
            return Path(str(raw)).expanduser() if str(raw) != "" else None
        choices = get_args(kind)
        if choices and all(isinstance(c, str) for c in choices):
            if str(raw) not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}")
            return str(raw)
        return None if raw == "" and "None" in str(kind) else str(raw)
    except (ValueError, KeyError, TypeError, InvalidOperation) as exc:
        raise ConfigurationError(f"setting {name} ({ENV_PREFIX}{name.upper()}): {exc}") from exc


def load_settings(
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    **overrides: Any,
) -> Settings:
    """Build settings: defaults, then the TOML file, then `HYDRANT_*` variables, then overrides."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            document = tomllib.loads(Path(config_file).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read config file {config_file}: {exc}") from exc
        section = document.get("hydrant", document)
        unknown = sorted(set(section) - set(_ENV_FIELDS))
        if unknown:
            raise ConfigurationError(f"unknown settings in {config_file}: {', '.join(unknown)}")
        values.update({k: _coerce(k, v) for k, v in section.items()})
    for name in _ENV_FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw)
    for name, value in overrides.items():
        if name not in _FIELD_TYPES:
            raise ConfigurationError(f"unknown setting {name!r}")
        if value is not None:
            values[name] = _coerce(name, value) if isinstance(value, str) else value
    settings = replace(Settings(), **values)
    if not 0 < settings.port < 65536:
        raise ConfigurationError(f"port {settings.port} is out of range 1-65535")
    if not re.fullmatch(r"[A-Z][A-Z0-9]{0,15}", settings.invoice_issuer):
        raise ConfigurationError(
            f"invoice_issuer {settings.invoice_issuer!r} must be 1-16 capital letters or digits"
            f" starting with a letter ({ENV_PREFIX}INVOICE_ISSUER)"
        )
    _check_retention(settings)
    served = {spec.name for spec in settings.served_models()}
    unknown = sorted(set(_tool_call_parsers(settings.tool_call_parsers)) - served)
    if unknown:
        raise ConfigurationError(
            f"a tool call parser is set for {', '.join(unknown)}, which is not served "
            f"(served: {', '.join(sorted(served))}; {ENV_PREFIX}TOOL_CALL_PARSERS)"
        )
    unserved = sorted(set(settings.upstream_pools()) - served)
    if unserved:
        raise ConfigurationError(
            f"an upstream pool is set for {', '.join(unserved)}, which is not served: the gateway"
            f" tokenizes, so name its tokenizer's directory in {ENV_PREFIX}MODELS"
            f" ({ENV_PREFIX}POOL_BACKENDS)"
        )
    not_upstream = sorted(settings.upstream_sleep_models() - set(settings.upstream_pools()))
    if not_upstream:
        raise ConfigurationError(
            f"sleep mode is set for {', '.join(not_upstream)}, whose pool is not upstream servers"
            f" (a Hydrant worker pool sleeps by {ENV_PREFIX}POOL_SCALE_DOWN;"
            f" {ENV_PREFIX}UPSTREAM_SLEEP)"
        )
    return settings


def _secret(value: str | None, path: Path | None, name: str) -> str | None:
    """A secret given as a setting, else as the first line of a file (a mounted secret)."""
    if value:
        return value
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the file of {ENV_PREFIX}{name} ({ENV_PREFIX}{name}_FILE):"
            f" {type(exc).__name__}"
        ) from exc


def _check_retention(settings: Settings) -> None:
    """Retentions too short to be safe: the usage export's must outlast its lookback (else a
    purged hour could be exported twice), the reconciliation's must keep yesterday's
    timeline, which the job stores again after midnight."""
    export_days = settings.usage_export_retention_days
    if export_days < 0 or 0 < export_days * 24 <= settings.usage_export_lookback_hours:
        raise ConfigurationError(
            f"usage_export_retention_days ({export_days}) must be 0 (kept forever) or longer"
            f" than usage_export_lookback_hours ({settings.usage_export_lookback_hours} h)"
            f" ({ENV_PREFIX}USAGE_EXPORT_RETENTION_DAYS)"
        )
    reconciliation_days = settings.reconciliation_retention_days
    if reconciliation_days < 0 or reconciliation_days == 1:
        raise ConfigurationError(
            f"reconciliation_retention_days ({reconciliation_days}) must be 0 (kept forever)"
            f" or at least 2 ({ENV_PREFIX}RECONCILIATION_RETENTION_DAYS)"
        )
