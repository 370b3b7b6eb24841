"""Argument checks shared by the Triton launchers and the reference dispatch.

Both backends must refuse the same bad calls with the same message, so the
semantic checks (ranks, sizes that must agree, dtypes) live here, once. The
launchers add what only a raw kernel cares about: device and strides.
Checks never read tensor *values* (that would synchronise a CUDA stream);
value contracts such as "slot < num_blocks * block_size" are documented on
the ops instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hydrant.kernels.errors import KernelArgumentError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def require(condition: bool, message: str) -> None:
    """Raise `KernelArgumentError(message)` unless `condition` holds."""
    if not condition:
        raise KernelArgumentError(message)


def check_rank(tensor: torch.Tensor, name: str, ndim: int, layout: str) -> None:
    require(
        tensor.dim() == ndim,
        f"{name} must be {ndim}-D {layout}, got shape {tuple(tensor.shape)}",
    )


def check_dtype(tensor: torch.Tensor, name: str, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    require(
        tensor.dtype in allowed,
        f"{name} has dtype {tensor.dtype}; expected one of {', '.join(map(str, allowed))}",
    )


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors on one device; return it."""
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    require(
        len(devices) == 1,
        "tensors are on different devices: "
        + ", ".join(f"{name}={t.device}" for name, t in present.items()),
    )
    return devices.pop()


def check_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> bool:
    """Validate one layer's paged cache; return True when it is the int8 (scaled) layout."""
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    check_rank(k_cache, "k_cache", 4, layout)
    require(
        v_cache.shape == k_cache.shape,
        f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}",
    )
    require(
        v_cache.dtype == k_cache.dtype,
        f"v_cache dtype {v_cache.dtype} != k_cache dtype {k_cache.dtype}",
    )
    check_dtype(k_cache, "k_cache", (*FLOAT_DTYPES, torch.int8))
    quantized = k_cache.dtype == torch.int8
    if not quantized:
        require(
            k_scale is None and v_scale is None,
            "k_scale/v_scale are only valid with int8 caches",
        )
        return False
    if k_scale is None or v_scale is None:
        raise KernelArgumentError("int8 caches need both k_scale and v_scale")
    expected = tuple(k_cache.shape[:3])
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        require(
            tuple(scale.shape) == expected,
            f"{name} must have shape [num_blocks, block_size, num_kv_heads] = {expected}, "
            f"got {tuple(scale.shape)}",
        )
        check_dtype(scale, name, (torch.float32,))
    return True


def check_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> bool:
    """Validate `write_kv` arguments; return True for the int8 cache path."""
    check_rank(key, "key", 3, "[num_tokens, num_kv_heads, head_dim]")
    require(
        value.shape == key.shape,
        f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}",
    )
    check_dtype(key, "key", FLOAT_DTYPES)
    require(value.dtype == key.dtype, f"value dtype {value.dtype} != key dtype {key.dtype}")
    quantized = check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    require(
        tuple(key.shape[1:]) == tuple(k_cache.shape[2:]),
        f"key heads/head_dim {tuple(key.shape[1:])} do not match the cache's "
        f"{tuple(k_cache.shape[2:])}",
    )
    if not quantized:
        require(
            k_cache.dtype == key.dtype,
            f"cache dtype {k_cache.dtype} != key dtype {key.dtype} (only int8 caches convert)",
        )
    check_rank(slot_mapping, "slot_mapping", 1, "[num_tokens]")
    check_dtype(slot_mapping, "slot_mapping", INDEX_DTYPES)
    require(
        slot_mapping.shape[0] == key.shape[0],
        f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens",
    )
    check_same_device(
        key=key,
        value=value,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    return quantized


def check_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None = None,
) -> bool:
    """Validate decode (`cu_seqlens_q` None) or prefill attention; True for int8 caches."""
    check_rank(q, "q", 3, "[tokens, num_heads, head_dim]")
    check_dtype(q, "q", FLOAT_DTYPES)
    quantized = check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    if not quantized:
        require(k_cache.dtype == q.dtype, f"cache dtype {k_cache.dtype} != q dtype {q.dtype}")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    require(q.shape[2] == head_dim, f"q head_dim {q.shape[2]} != cache head_dim {head_dim}")
    require(
        q.shape[1] % num_kv_heads == 0,
        f"q has {q.shape[1]} heads, not a multiple of the cache's {num_kv_heads} KV heads",
    )
    check_rank(block_tables, "block_tables", 2, "[batch, max_blocks]")
    check_dtype(block_tables, "block_tables", INDEX_DTYPES)
    check_rank(context_lens, "context_lens", 1, "[batch]")
    check_dtype(context_lens, "context_lens", INDEX_DTYPES)
    batch = block_tables.shape[0]
    require(
        context_lens.shape[0] == batch,
        f"context_lens has {context_lens.shape[0]} entries for {batch} block-table rows",
    )
    if cu_seqlens_q is None:
        require(q.shape[0] == batch, f"q has {q.shape[0]} rows for a batch of {batch}")
    else:
        check_rank(cu_seqlens_q, "cu_seqlens_q", 1, "[batch + 1]")
        check_dtype(cu_seqlens_q, "cu_seqlens_q", INDEX_DTYPES)
        require(
            cu_seqlens_q.shape[0] == batch + 1,
            f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries for a batch of {batch}",
        )
    check_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        context_lens=context_lens,
        cu_seqlens_q=cu_seqlens_q,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    return quantized


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    require(x.dim() >= 1, "x must have at least one dimension (hidden)")
    check_dtype(x, "x", FLOAT_DTYPES)
    check_dtype(weight, "weight", FLOAT_DTYPES)
    require(
        weight.dim() == 1 and weight.shape[0] == x.shape[-1],
        f"weight shape {tuple(weight.shape)} must be [hidden={x.shape[-1]}]",
    )
    if residual is not None:
        require(
            residual.shape == x.shape,
            f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}",
        )
        require(residual.dtype == x.dtype, f"residual dtype {residual.dtype} != x {x.dtype}")
    check_same_device(x=x, weight=weight, residual=residual)


def check_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    check_rank(positions, "positions", 1, "[num_tokens]")
    check_dtype(positions, "positions", INDEX_DTYPES)
    check_rank(q, "q", 3, "[num_tokens, num_heads, head_dim]")
    check_rank(k, "k", 3, "[num_tokens, num_kv_heads, head_dim]")
    check_dtype(q, "q", FLOAT_DTYPES)
    require(k.dtype == q.dtype, f"k dtype {k.dtype} != q dtype {q.dtype}")
    tokens = positions.shape[0]
    require(
        q.shape[0] == tokens and k.shape[0] == tokens,
        f"q/k have {q.shape[0]}/{k.shape[0]} tokens for {tokens} positions",
    )
    require(q.shape[2] == k.shape[2], f"q head_dim {q.shape[2]} != k head_dim {k.shape[2]}")
    check_rank(cos_sin_cache, "cos_sin_cache", 2, "[max_position, rotary_dim]")
    check_dtype(cos_sin_cache, "cos_sin_cache", FLOAT_DTYPES)
    rot = cos_sin_cache.shape[1]
    require(
        rot % 2 == 0 and 0 < rot <= q.shape[2],
        f"cos_sin_cache width {rot} must be even and at most head_dim {q.shape[2]}",
    )
    check_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)


def check_silu_and_mul(x: torch.Tensor) -> None:
    require(x.dim() >= 1, "x must have at least one dimension")
    check_dtype(x, "x", FLOAT_DTYPES)
    require(x.shape[-1] % 2 == 0, f"last dimension {x.shape[-1]} must be even (gate | up)")


def check_w8a16(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> None:
    check_rank(x, "x", 2, "[M, K]")
    check_dtype(x, "x", FLOAT_DTYPES)
    check_rank(qweight, "qweight", 2, "[N, K]")
    check_dtype(qweight, "qweight", (torch.int8,))
    require(
        qweight.shape[1] == x.shape[1],
        f"x has K={x.shape[1]} but qweight has K={qweight.shape[1]}",
    )
    check_dtype(scales, "scales", FLOAT_DTYPES)
    require(
        scales.dim() == 1 and scales.shape[0] == qweight.shape[0],
        f"scales shape {tuple(scales.shape)} must be [N={qweight.shape[0]}]",
    )
    check_same_device(x=x, qweight=qweight, scales=scales)


def check_w4a16(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
) -> None:
    check_rank(x, "x", 2, "[M, K]")
    check_dtype(x, "x", FLOAT_DTYPES)
    k = x.shape[1]
    require(
        group_size >= 2 and group_size % 2 == 0 and k % group_size == 0,
        f"group_size {group_size} must be even and divide K={k}",
    )
    check_rank(qweight, "qweight", 2, "[N, K // 2]")
    check_dtype(qweight, "qweight", (torch.uint8,))
    require(
        qweight.shape[1] * 2 == k,
        f"qweight has {qweight.shape[1]} bytes per row; K={k} needs {k // 2}",
    )
    groups = (qweight.shape[0], k // group_size)
    for name, tensor in (("scales", scales), ("zeros", zeros)):
        require(
            tuple(tensor.shape) == groups,
            f"{name} shape {tuple(tensor.shape)} must be [N, K // group_size] = {groups}",
        )
    check_dtype(scales, "scales", FLOAT_DTYPES)
    check_dtype(zeros, "zeros", (*FLOAT_DTYPES, torch.uint8))
    check_same_device(x=x, qweight=qweight, scales=scales, zeros=zeros)


def _check_lora_weights(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> None:
    """The shapes SGMV and BGMV share: `y[T, N] += scale * (x[T, K] @ A[s].T) @ B[s].T`."""
    check_rank(y, "y", 2, "[T, N]")
    check_rank(x, "x", 2, "[T, K]")
    check_rank(lora_a, "lora_a", 3, "[slots, R, K]")
    check_rank(lora_b, "lora_b", 3, "[slots, N, R]")
    check_rank(scales, "scales", 1, "[slots]")
    for name, tensor in (("y", y), ("x", x), ("lora_a", lora_a), ("lora_b", lora_b)):
        check_dtype(tensor, name, FLOAT_DTYPES)
    require(y.shape[0] == x.shape[0], f"y has {y.shape[0]} rows, x {x.shape[0]}")
    slots, rank, k = lora_a.shape
    require(k == x.shape[1], f"lora_a is [slots, R, {k}] but x has K={x.shape[1]}")
    require(rank >= 1, "lora_a must have a rank of at least 1")
    want_b = (slots, y.shape[1], rank)
    require(
        tuple(lora_b.shape) == want_b,
        f"lora_b shape {tuple(lora_b.shape)} must be [slots, N, R] = {want_b}",
    )
    require(scales.shape[0] == slots, f"scales has {scales.shape[0]} entries for {slots} slots")
    check_dtype(scales, "scales", (torch.float32,))


def check_lora_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    _check_lora_weights(y, x, lora_a, lora_b, scales)
    check_rank(token_slots, "token_slots", 1, "[T]")
    check_dtype(token_slots, "token_slots", INDEX_DTYPES)
    require(
        token_slots.shape[0] == x.shape[0],
        f"token_slots has {token_slots.shape[0]} entries for {x.shape[0]} rows",
    )
    check_same_device(
        y=y, x=x, lora_a=lora_a, lora_b=lora_b, scales=scales, token_slots=token_slots
    )


def check_lora_sgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
) -> None:
    _check_lora_weights(y, x, lora_a, lora_b, scales)
    check_rank(seg_starts, "seg_starts", 1, "[segments + 1]")
    check_rank(seg_slots, "seg_slots", 1, "[segments]")
    check_dtype(seg_starts, "seg_starts", INDEX_DTYPES)
    check_dtype(seg_slots, "seg_slots", INDEX_DTYPES)
    require(
        seg_starts.shape[0] == seg_slots.shape[0] + 1,
        f"seg_starts has {seg_starts.shape[0]} entries for {seg_slots.shape[0]} segments "
        "(one more is needed: the end of the last)",
    )
    check_same_device(
        y=y,
        x=x,
        lora_a=lora_a,
        lora_b=lora_b,
        scales=scales,
        seg_starts=seg_starts,
        seg_slots=seg_slots,
    )
