"""API keys as tenants and admins manage them: issue, list, rotate, revoke.

The key format, its hashing and the lookup cache belong to authentication
(`hydrant.platform.auth.key_codec`, `key_hashing`, `key_cache`): checking a key
is below managing one. They are re-exported here because `generate_key` is
how a person makes a bootstrap key (README).
"""

from hydrant.platform.auth.key_cache import KeyCache
from hydrant.platform.auth.key_codec import (
    KEY_PATTERN,
    GeneratedKey,
    KeyEnv,
    MalformedKeyError,
    ParsedKey,
    generate_key,
    parse_key,
    redact_keys,
)
from hydrant.platform.auth.key_hashing import hash_key, verify_against_dummy, verify_key

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
