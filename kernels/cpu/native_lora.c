/*
 * LoRA deltas for the CPU (Punica's BGMV and SGMV), reading every row's adapter in place.
 *
 * Why C: in PyTorch a decode batch of many adapters gathers each row's A and B into a
 * [rows, R, K] and a [rows, N, R] copy before two batched matmuls, so the weights cross
 * memory three times and the copy costs more than the arithmetic (a rank-8 adapter on a
 * small model's seven projections moved about 6 MB a step). Here each row reads its own
 * slot's A and B where they lie in the stacks, once, and prefill segments need no
 * per-segment PyTorch calls.
 *
 * Layout (float32; strides in elements, the last dimension of x, y and A contiguous):
 *   x [rows, K] (row stride x_t), y [rows, N] (row stride y_t), added to in place
 *   A [slots, R, K]: slot s, rank row j at a + s*a_s + j*a_r
 *   B [slots, N, R]: slot s, output n, rank column j at b + s*b_s + n*b_n + j*b_r
 *   scales [slots]; a row of slot -1 is not touched (its bits stay).
 * B's rank columns contiguous (b_r == 1, the stacks' layout) take R-long dot products
 * per output; any other B strides take the output-major loop.
 * Per row: mid = A[s] @ x (float32), delta = B[s] @ mid, y += delta * scale: the
 * reference's order of operations, so results differ from it only by summation order.
 */
#include <stdint.h>
#include <stdlib.h>

#include <omp.h>

#include "native_simd.h"

/* A dot product of a short vector (B's rank columns, R*P <= a few dozen): the AVX-512
 * path takes the tail in one masked step instead of one scalar step per element. */
#if defined(__AVX512F__)
static inline float dot_short(const float *restrict a, const float *restrict b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        acc = _mm512_fmadd_ps(
            _mm512_maskz_loadu_ps(tail, a + i), _mm512_maskz_loadu_ps(tail, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
#else
#define dot_short dot
#endif

typedef struct {
    const float *x;
    float *y;
    const float *a;
    const float *b;
    const float *scales;
    int64_t x_t, y_t, a_s, a_r, b_s, b_n, b_r;
    int k, n, r;
} LoraArgs;

static void lora_row(const LoraArgs *p, int64_t t, int slot, float *mid, float *acc) {
    const float *x = p->x + t * p->x_t;
    const float *a = p->a + slot * p->a_s;
    const float *b = p->b + slot * p->b_s;
    float *y = p->y + t * p->y_t;
    for (int j = 0; j < p->r; j++) mid[j] = dot_short(x, a + j * p->a_r, p->k);
    if (p->b_r == 1) {
        for (int n = 0; n < p->n; n++) acc[n] = dot_short(mid, b + n * p->b_n, p->r);
    } else {
        for (int n = 0; n < p->n; n++) acc[n] = 0.0f;
        for (int j = 0; j < p->r; j++) {
            const float m = mid[j];
            const float *col = b + j * p->b_r;
            for (int n = 0; n < p->n; n++) acc[n] += m * col[n * p->b_n];
        }
    }
    const float scale = p->scales[slot];
#pragma omp simd
    for (int n = 0; n < p->n; n++) y[n] += acc[n] * scale;
}

/* Rows [first, end) of one thread: `slot_of(t)` from token_slots or the segments. */
static int lora_rows(
    const LoraArgs *p, const int32_t *token_slots, const int32_t *seg_starts,
    const int32_t *seg_slots, int num_segments, int64_t rows, int num_threads) {
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && rows > 1)
    {
        float *mid = malloc(sizeof(float) * (size_t)(p->r + p->n));
        if (mid == NULL) {
#pragma omp atomic write
            failed = 1;
        } else {
            float *acc = mid + p->r;
            if (token_slots != NULL) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < rows; t++)
                    if (token_slots[t] >= 0) lora_row(p, t, token_slots[t], mid, acc);
            } else {
                for (int g = 0; g < num_segments; g++) {
                    const int slot = seg_slots[g];
                    if (slot < 0) continue;
#pragma omp for schedule(static) nowait
                    for (int64_t t = seg_starts[g]; t < seg_starts[g + 1]; t++)
                        lora_row(p, t, slot, mid, acc);
                }
            }
            free(mid);
        }
    }
    return failed ? -1 : 0;
}

int hydrant_lora_bgmv_f32(
    const float *x, int64_t x_t, float *y, int64_t y_t, const float *a, int64_t a_s,
    int64_t a_r, const float *b, int64_t b_s, int64_t b_n, int64_t b_r,
    const float *scales, const int32_t *token_slots, int64_t rows, int k, int n, int r,
    int num_threads) {
    const LoraArgs p = {x, y, a, b, scales, x_t, y_t, a_s, a_r, b_s, b_n, b_r, k, n, r};
    return lora_rows(&p, token_slots, NULL, NULL, 0, rows, num_threads);
}

int hydrant_lora_sgmv_f32(
    const float *x, int64_t x_t, float *y, int64_t y_t, const float *a, int64_t a_s,
    int64_t a_r, const float *b, int64_t b_s, int64_t b_n, int64_t b_r,
    const float *scales, const int32_t *seg_starts, const int32_t *seg_slots,
    int num_segments, int64_t rows, int k, int n, int r, int num_threads) {
    const LoraArgs p = {x, y, a, b, scales, x_t, y_t, a_s, a_r, b_s, b_n, b_r, k, n, r};
    return lora_rows(&p, NULL, seg_starts, seg_slots, num_segments, rows, num_threads);
}
