"""`hydrant preflight`: the launch checklist, run against a live deployment over HTTP."""

from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult, Status
from hydrant.platform.preflight.runner import CHECK_NAMES, run_preflight

__all__ = ["CHECK_NAMES", "CheckResult", "PreflightOptions", "Status", "run_preflight"]
