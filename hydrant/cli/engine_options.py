"""Engine options that `hydrant serve` (in-process engines) and `hydrant worker` share.

One definition, so the two commands cannot drift in choices, defaults or help.
Both leave the value None when the flag is absent, so the setting decides.
"""

from __future__ import annotations

import click

kv_cache_dtype_option = click.option(
    "--kv-cache-dtype",
    type=click.Choice(["auto", "int8"]),
    help="KV cache storage: the compute dtype, or int8 with per-token scales "
    "(HYDRANT_KV_CACHE_DTYPE).",
)
enforce_eager_option = click.option(
    "--enforce-eager",
    is_flag=True,
    default=None,
    help="No CUDA graphs for decode steps: launch every kernel eagerly (HYDRANT_ENFORCE_EAGER).",
)
