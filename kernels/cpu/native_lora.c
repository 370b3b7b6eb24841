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
 * B's rank columns contiguous (b_r == 1, the stacks' layout) take R-long dot products,
 * 16 outputs at a time; outputs contiguous (b_n == 1) take broadcast multiply-adds, as
 * does the B of a slot with TRANSPOSE_ROWS rows or more (a prefill segment, or a decode
 * step's rows of one adapter), copied transposed once (transpose_b); other strides a
 * plain loop.
 * Per row: mid = A[s] @ x (float32), delta = B[s] @ mid, y += delta * scale: the
 * reference's order of operations, so results differ from it only by summation order.
 */
#include <stdint.h>
#include <stdlib.h>

#include <omp.h>

#include "native_simd.h"

#if defined(__AVX512F__)
/*
 * Lane u of the result is dot(v, rows + u * stride, len) for u < count (0 above): 16 dot
 * products share the loads of `v` and one transposing reduction (reduce16), where one at
 * a time would spend more on each reduction than on the multiplies (B's rows are only
 * R*P long). The tail of `len` is one masked step.
 */
static inline __m512 dots16(
    const float *restrict v, const float *restrict rows, int64_t stride, int count, int len) {
    __m512 acc[16];
    for (int u = 0; u < 16; u++) acc[u] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= len; i += 16) {
        const __m512 vv = _mm512_loadu_ps(v + i);
        for (int u = 0; u < 16; u++)
            if (u < count)
                acc[u] = _mm512_fmadd_ps(vv, _mm512_loadu_ps(rows + u * stride + i), acc[u]);
    }
    if (i < len) {
        const __mmask16 tail = (__mmask16)((1u << (len - i)) - 1u);
        const __m512 vv = _mm512_maskz_loadu_ps(tail, v + i);
        for (int u = 0; u < 16; u++)
            if (u < count)
                acc[u] = _mm512_fmadd_ps(
                    vv, _mm512_maskz_loadu_ps(tail, rows + u * stride + i), acc[u]);
    }
    return reduce16(acc);
}
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

/* mid[j] = A[slot][j] . x for the R rank rows. */
static inline void shrink(const LoraArgs *p, const float *x, const float *a, float *mid) {
#if defined(__AVX512F__)
    for (int j = 0; j < p->r; j += 16) {
        const int count = p->r - j < 16 ? p->r - j : 16;
        const __mmask16 lanes = (__mmask16)((1u << count) - 1u);
        _mm512_mask_storeu_ps(mid + j, lanes, dots16(x, a + j * p->a_r, p->a_r, count, p->k));
    }
#else
    for (int j = 0; j < p->r; j++) mid[j] = dot(x, a + j * p->a_r, p->k);
#endif
}

/* y += (B @ mid) * scale, B's output n and rank column j at b + n*b_n + j*b_r. */
static inline void expand(
    const LoraArgs *p, const float *mid, const float *b, int64_t b_n, int64_t b_r, float scale,
    float *y, float *acc) {
#if defined(__AVX512F__)
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int n = 0; n < p->n; n += 16) {
        const int count = p->n - n < 16 ? p->n - n : 16;
        const __mmask16 lanes = (__mmask16)((1u << count) - 1u);
        __m512 delta;
        if (b_n == 1) { /* rank rows contiguous over outputs: broadcast mid[j], no reduction */
            delta = _mm512_setzero_ps();
            for (int j = 0; j < p->r; j++)
                delta = _mm512_fmadd_ps(_mm512_set1_ps(mid[j]),
                                        _mm512_maskz_loadu_ps(lanes, b + j * b_r + n), delta);
        } else if (b_r == 1) {
            delta = dots16(mid, b + n * b_n, b_n, count, p->r);
        } else {
            break;
        }
        const __m512 out = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, y + n),
                                         _mm512_mul_ps(delta, vscale));
        _mm512_mask_storeu_ps(y + n, lanes, out);
    }
    if (b_n == 1 || b_r == 1) return;
#endif
    if (b_r == 1) {
        for (int n = 0; n < p->n; n++) acc[n] = dot(mid, b + n * b_n, p->r);
    } else {
        for (int n = 0; n < p->n; n++) acc[n] = 0.0f;
        for (int j = 0; j < p->r; j++) {
            const float m = mid[j];
            const float *col = b + j * b_r;
            for (int n = 0; n < p->n; n++) acc[n] += m * col[n * b_n];
        }
    }
#pragma omp simd
    for (int n = 0; n < p->n; n++) y[n] += acc[n] * scale;
}

/*
 * A segment's rows (a prefill chunk, or a decode step's rows of one slot) share one
 * adapter: with B in the stacks' layout (rank columns contiguous) and at least
 * TRANSPOSE_ROWS rows, its B is copied once, transposed, into
 * `bt` [R, N], so every row's expand is broadcast multiply-adds over contiguous outputs
 * instead of R-long dot products. The copy also notes, per block of 16 outputs, which
 * rank rows have a nonzero there: a fused projection's B is block-structured (part p's
 * outputs read only its own rank columns; see engine/lora_slots.py) and ranks below the
 * stacks' are zero-padded, so the expand skips what would only add zeros (q/k/v: two
 * thirds of it). The copy is paid once per segment, the savings once per row.
 */
enum { TRANSPOSE_ROWS = 4, MAX_TRANSPOSED = 1 << 20 };

typedef struct {
    float *bt;          /* [R, N] */
    int32_t *rows_of;   /* [blocks, R]: the rank rows with a nonzero in each output block */
    int32_t *count_of;  /* [blocks] */
} Transposed;

static void transpose_b(const LoraArgs *p, const float *b, const Transposed *tb) {
    for (int n0 = 0, block = 0; n0 < p->n; n0 += 16, block++) {
        const int end = p->n - n0 < 16 ? p->n : n0 + 16;
        int count = 0;
        for (int j = 0; j < p->r; j++) {
            int nonzero = 0;
            for (int n = n0; n < end; n++) {
                const float v = b[n * p->b_n + j];
                tb->bt[(int64_t)j * p->n + n] = v;
                nonzero |= v != 0.0f;
            }
            if (nonzero) tb->rows_of[(int64_t)block * p->r + count++] = j;
        }
        tb->count_of[block] = count;
    }
}

/* y += (B @ mid) * scale from the transposed B, rank rows that are zero in a block skipped. */
static inline void expand_transposed(
    const LoraArgs *p, const Transposed *tb, const float *mid, float scale, float *y) {
    for (int n0 = 0, block = 0; n0 < p->n; n0 += 16, block++) {
        const int count = p->n - n0 < 16 ? p->n - n0 : 16;
        const int32_t *rows = tb->rows_of + (int64_t)block * p->r;
#if defined(__AVX512F__)
        const __mmask16 lanes = (__mmask16)((1u << count) - 1u);
        __m512 delta = _mm512_setzero_ps();
        for (int c = 0; c < tb->count_of[block]; c++)
            delta = _mm512_fmadd_ps(
                _mm512_set1_ps(mid[rows[c]]),
                _mm512_maskz_loadu_ps(lanes, tb->bt + (int64_t)rows[c] * p->n + n0), delta);
        const __m512 out = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, y + n0),
                                         _mm512_mul_ps(delta, _mm512_set1_ps(scale)));
        _mm512_mask_storeu_ps(y + n0, lanes, out);
#else
        float delta[16] = {0};
        for (int c = 0; c < tb->count_of[block]; c++) {
            const float m = mid[rows[c]];
            const float *row = tb->bt + (int64_t)rows[c] * p->n + n0;
            for (int u = 0; u < count; u++) delta[u] += m * row[u];
        }
        for (int u = 0; u < count; u++) y[n0 + u] += delta[u] * scale;
#endif
    }
}

/* Row `t` of slot `slot`, through `tb` (its segment's transposed B) or B in place. */
static inline void lora_row(
    const LoraArgs *p, int64_t t, int slot, const Transposed *tb, float *mid, float *acc) {
    shrink(p, p->x + t * p->x_t, p->a + slot * p->a_s, mid);
    if (tb != NULL)
        expand_transposed(p, tb, mid, p->scales[slot], p->y + t * p->y_t);
    else
        expand(p, mid, p->b + slot * p->b_s, p->b_n, p->b_r, p->scales[slot],
               p->y + t * p->y_t, acc);
}

/*
 * The rows of each segment, in order: positions seg_starts[g]..seg_starts[g + 1] of
 * `order` (the rows themselves when NULL) share slot seg_slots[g]. SGMV's segments are
 * the prefill chunks; BGMV's are its decode rows grouped by slot (hydrant_lora_bgmv_f32),
 * so an adapter with several rows in the step, the popular one of skewed traffic, gets
 * the transposed, zero-skipping expand too.
 */
static int lora_rows(
    const LoraArgs *p, const int32_t *order, const int32_t *seg_starts,
    const int32_t *seg_slots, int num_segments, int64_t rows, int num_threads) {
    int failed = 0;
    const int blocks = (p->n + 15) / 16;
    const int64_t transposed = (int64_t)p->r * p->n;
    const int use_bt = transposed <= MAX_TRANSPOSED;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && rows > 1)
    {
        float *mid = malloc(sizeof(float) * (size_t)(p->r + p->n + (use_bt ? transposed : 0)));
        int32_t *index = use_bt ? malloc(sizeof(int32_t) * (size_t)blocks * (p->r + 1)) : NULL;
        if (mid == NULL || (use_bt && index == NULL)) {
#pragma omp atomic write
            failed = 1;
        } else {
            float *acc = mid + p->r;
            const Transposed tb = {acc + p->n, index, index + (int64_t)blocks * p->r};
            for (int g = 0; g < num_segments; g++) {
                const int slot = seg_slots[g];
                const int64_t first = seg_starts[g], end = seg_starts[g + 1];
                if (slot < 0 || end <= first) continue;
                const int copy =
                    use_bt && p->b_r == 1 && p->b_n != 1 && end - first >= TRANSPOSE_ROWS;
                if (copy) transpose_b(p, p->b + slot * p->b_s, &tb);
#pragma omp for schedule(static) nowait
                for (int64_t i = first; i < end; i++)
                    lora_row(p, order != NULL ? order[i] : i, slot, copy ? &tb : NULL, mid, acc);
            }
        }
        free(mid);
        free(index);
    }
    return failed ? -1 : 0;
}

/* Returns 0, -1 when a buffer could not be allocated, -2 for a slot index >= num_slots. */
int hydrant_lora_bgmv_f32(
    const float *x, int64_t x_t, float *y, int64_t y_t, const float *a, int64_t a_s,
    int64_t a_r, const float *b, int64_t b_s, int64_t b_n, int64_t b_r,
    const float *scales, const int32_t *token_slots, int64_t rows, int num_slots, int k,
    int n, int r, int num_threads) {
    const LoraArgs p = {x, y, a, b, scales, x_t, y_t, a_s, a_r, b_s, b_n, b_r, k, n, r};
    for (int64_t t = 0; t < rows; t++)
        if (token_slots[t] >= num_slots) return -2;
    /* a counting sort of the rows with an adapter by slot: slot s is segment s */
    int32_t *starts = calloc((size_t)num_slots + 1, sizeof(int32_t));
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)(num_slots > 0 ? num_slots : 1));
    int32_t *order = malloc(sizeof(int32_t) * (size_t)(rows > 0 ? rows : 1));
    int status = -1;
    if (starts != NULL && slots != NULL && order != NULL) {
        for (int64_t t = 0; t < rows; t++)
            if (token_slots[t] >= 0) starts[token_slots[t] + 1]++;
        for (int s = 0; s < num_slots; s++) {
            starts[s + 1] += starts[s];
            slots[s] = s;
        }
        for (int64_t t = 0; t < rows; t++) /* starts[s] walks to the segment's end... */
            if (token_slots[t] >= 0) order[starts[token_slots[t]]++] = (int32_t)t;
        for (int s = num_slots; s > 0; s--) starts[s] = starts[s - 1]; /* ...and back */
        starts[0] = 0;
        status = lora_rows(&p, order, starts, slots, num_slots, rows, num_threads);
    }
    free(starts);
    free(slots);
    free(order);
    return status;
}

/* Returns 0, -1 when a buffer could not be allocated, -2 for a slot index >= num_slots or a
 * segment outside the rows. */
int hydrant_lora_sgmv_f32(
    const float *x, int64_t x_t, float *y, int64_t y_t, const float *a, int64_t a_s,
    int64_t a_r, const float *b, int64_t b_s, int64_t b_n, int64_t b_r,
    const float *scales, const int32_t *seg_starts, const int32_t *seg_slots,
    int num_segments, int64_t rows, int num_slots, int k, int n, int r, int num_threads) {
    const LoraArgs p = {x, y, a, b, scales, x_t, y_t, a_s, a_r, b_s, b_n, b_r, k, n, r};
    for (int g = 0; g < num_segments; g++)
        if (seg_slots[g] >= num_slots || seg_starts[g] < 0 || seg_starts[g + 1] > rows) return -2;
    return lora_rows(&p, NULL, seg_starts, seg_slots, num_segments, rows, num_threads);
}
