"""API keys: the format (`codec`), how they are stored and checked (`hashing`), the auth cache."""

from hydrant.platform.keys.cache import KeyCache
from hydrant.platform.keys.codec import (
    KEY_PATTERN,
    GeneratedKey,
    KeyEnv,
    MalformedKeyError,
    ParsedKey,
    generate_key,
    parse_key,
    redact_keys,
)
from hydrant.platform.keys.hashing import hash_key, verify_against_dummy, verify_key

__all__ = [
    "KEY_PATTERN",
    "GeneratedKey",
    "KeyCache",
    "KeyEnv",
    "MalformedKeyError",
    "ParsedKey",
    "generate_key",
    "hash_key",
    "parse_key",
    "redact_keys",
    "verify_against_dummy",
    "verify_key",
]
