"""Errors shared by every layer of Hydrant (no dependencies, safe to import anywhere)."""


class HydrantError(Exception):
    """Base class of Hydrant's own errors."""


class ConfigurationError(HydrantError):
    """Settings that cannot work; raised at start-up, before anything is served."""
