/*
 * The small per-layer ops of a step in one call each: RMSNorm with its residual add,
 * neox RoPE of q and k, SiLU-and-mul, and the K/V write into the block pool.
 *
 * Why C: at decode batch sizes these ops touch a few KiB, and in PyTorch each is
 * several tensor ops (RMSNorm: add, pow, mean, add, rsqrt, mul, mul; RoPE: a gather,
 * then per tensor four slices, four products, a negation, two sums and a cat; the K/V
 * write: a min for padding slots, then two index_copy), each a few microseconds of
 * dispatch. On the demo model that was about 30 % of a decode step at batch 1. Here
 * each is one call over the rows. Large calls (prefill chunks) split the rows over
 * OpenMP threads; small ones never start a team.
 *
 * All float32, rows `stride` floats apart with contiguous elements; outputs contiguous.
 * The arithmetic follows elementwise.py's order; only sums may round differently
 * (vector lanes).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

/* below this many floats a call stays on the caller's thread: a team costs more */
#define PARALLEL_MIN_FLOATS 65536

static inline int threads_for(int64_t floats, int num_threads) {
    return floats >= PARALLEL_MIN_FLOATS && num_threads > 1 ? num_threads : 1;
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

static void rms_norm_rows(const float *x, int64_t x_stride, const float *residual,
                          int64_t r_stride, const float *restrict weight, float eps,
                          float *out, float *sum, int first, int last, int hidden) {
    for (int r = first; r < last; r++) {
        const float *h = x + (int64_t)r * x_stride;
        if (residual != NULL) {
            const float *restrict xr = h;
            const float *restrict rr = residual + (int64_t)r * r_stride;
            float *restrict s = sum + (int64_t)r * hidden;
#pragma omp simd
            for (int d = 0; d < hidden; d++) s[d] = xr[d] + rr[d];
            h = s;
        }
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int d = 0; d < hidden; d++) squares += h[d] * h[d];
        const float inv = 1.0f / sqrtf(squares / (float)hidden + eps);
        float *restrict o = out + (int64_t)r * hidden;
#pragma omp simd
        for (int d = 0; d < hidden; d++) o[d] = h[d] * inv * weight[d];
    }
}

/* out = s * rsqrt(mean(s^2) + eps) * weight with s = x + residual (written to `sum`),
   or s = x when residual is NULL (`sum` unused). */
void hydrant_rms_norm_f32(const float *x, int64_t x_stride, const float *residual,
                          int64_t r_stride, const float *weight, float eps, float *out,
                          float *sum, int rows, int hidden, int num_threads) {
    const int threads = threads_for((int64_t)rows * hidden, num_threads);
    if (threads == 1) {
        rms_norm_rows(x, x_stride, residual, r_stride, weight, eps, out, sum, 0, rows, hidden);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int first = (int)((int64_t)rows * t / n), last = (int)((int64_t)rows * (t + 1) / n);
        rms_norm_rows(x, x_stride, residual, r_stride, weight, eps, out, sum, first, last, hidden);
    }
}

/* ---- RoPE (neox: the two halves of a head rotate together) -------------------------- */

static inline void rotate_heads(const float *x, int64_t head_stride, int heads, int head_dim,
                                const float *restrict cos, const float *restrict sin,
                                float *restrict out) {
    const int half = head_dim / 2;
    for (int h = 0; h < heads; h++) {
        const float *restrict x1 = x + (int64_t)h * head_stride;
        const float *restrict x2 = x1 + half;
        float *restrict o = out + (int64_t)h * head_dim;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            o[i] = x1[i] * cos[i] + (-x2[i]) * sin[i];
            o[half + i] = x2[i] * cos[i] + x1[i] * sin[i];
        }
    }
}

static void rope_rows(const int64_t *positions, const float *cos_sin, const float *q,
                      int64_t q_stride, int num_heads, const float *k, int64_t k_stride,
                      int num_kv_heads, int head_dim, float *q_out, float *k_out, int first,
                      int last) {
    const int half = head_dim / 2;
    for (int t = first; t < last; t++) {
        const float *cos = cos_sin + positions[t] * head_dim;
        rotate_heads(q + (int64_t)t * q_stride, head_dim, num_heads, head_dim, cos, cos + half,
                     q_out + (int64_t)t * num_heads * head_dim);
        rotate_heads(k + (int64_t)t * k_stride, head_dim, num_kv_heads, head_dim, cos,
                     cos + half, k_out + (int64_t)t * num_kv_heads * head_dim);
    }
}

/* q [tokens, num_heads, head_dim] and k [.., num_kv_heads, ..] (tokens `*_stride` floats
   apart, heads adjacent) rotated by the table's row [cos | sin] at each position, into
   contiguous q_out and k_out. Returns -1, writing nothing, when a position is outside
   the table's `positions_in_table` rows. */
int hydrant_rope_neox_f32(const int64_t *positions, const float *cos_sin,
                          int64_t positions_in_table, const float *q, int64_t q_stride,
                          int num_heads, const float *k, int64_t k_stride, int num_kv_heads,
                          int head_dim, float *q_out, float *k_out, int tokens,
                          int num_threads) {
    for (int t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= positions_in_table) return -1;
    const int64_t floats = (int64_t)tokens * (num_heads + num_kv_heads) * head_dim;
    const int threads = threads_for(floats, num_threads);
    if (threads == 1) {
        rope_rows(positions, cos_sin, q, q_stride, num_heads, k, k_stride, num_kv_heads,
                  head_dim, q_out, k_out, 0, tokens);
        return 0;
    }
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        rope_rows(positions, cos_sin, q, q_stride, num_heads, k, k_stride, num_kv_heads,
                  head_dim, q_out, k_out, (int)((int64_t)tokens * t / n),
                  (int)((int64_t)tokens * (t + 1) / n));
    }
    return 0;
}

/* ---- SiLU and mul ------------------------------------------------------------------- */

/*
 * out[r] = silu(gate) * up over a fused [gate | up] row, silu(g) = g / (1 + e^-g).
 * libm's expf is a call per element, slower than PyTorch's vectorised SiLU beyond a few
 * hundred elements, so with AVX-512 or AVX2 e^-g is computed in vector lanes: -g = k ln2
 * + f with |f| <= ln2/2, a degree-6 polynomial for e^f (as native_decode.c's softmax),
 * 2^k in the exponent bits. -g is clamped to [-87, 88], where k + 127 stays a normal
 * exponent; beyond that 1 + e^-g rounds to 1, or the quotient to 0, in float32 anyway.
 */
#if defined(__AVX512F__)
#include <immintrin.h>
#define SILU_LANES 16
typedef __m512 vfloat;
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_DIV _mm512_div_ps
#define V_MIN _mm512_min_ps
#define V_MAX _mm512_max_ps
#define V_FMA _mm512_fmadd_ps
#define V_FNMA _mm512_fnmadd_ps
#define V_ROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(k) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SILU_LANES 8
typedef __m256 vfloat;
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_DIV _mm256_div_ps
#define V_MIN _mm256_min_ps
#define V_MAX _mm256_max_ps
#define V_FMA _mm256_fmadd_ps
#define V_FNMA _mm256_fnmadd_ps
#define V_ROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(k) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23))
#endif

#ifdef SILU_LANES
static inline vfloat silu_lanes(vfloat g) {
    const vfloat one = V_SET1(1.0f);
    const vfloat x = V_MIN(V_MAX(V_SUB(V_SET1(0.0f), g), V_SET1(-87.0f)), V_SET1(88.0f));
    const vfloat k = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    vfloat f = V_FNMA(k, V_SET1(0.693359375f), x);
    f = V_FNMA(k, V_SET1(-2.12194440e-4f), f);
    vfloat p = V_FMA(V_SET1(1.0f / 720), f, V_SET1(1.0f / 120));
    p = V_FMA(p, f, V_SET1(1.0f / 24));
    p = V_FMA(p, f, V_SET1(1.0f / 6));
    p = V_FMA(p, f, V_SET1(1.0f / 2));
    p = V_FMA(p, f, one);
    p = V_FMA(p, f, one);
    return V_DIV(g, V_ADD(one, V_MUL(p, V_POW2(k))));
}
#endif

/* The lanes SiLU computes at once here; 0: one libm expf per element. */
int hydrant_silu_lanes(void) {
#ifdef SILU_LANES
    return SILU_LANES;
#else
    return 0;
#endif
}

static void silu_rows(const float *x, int64_t x_stride, float *out, int first, int last,
                      int inter) {
    for (int r = first; r < last; r++) {
        const float *restrict gate = x + (int64_t)r * x_stride;
        const float *restrict up = gate + inter;
        float *restrict o = out + (int64_t)r * inter;
        int i = 0;
#ifdef SILU_LANES
        for (; i + SILU_LANES <= inter; i += SILU_LANES)
            V_STORE(o + i, V_MUL(silu_lanes(V_LOAD(gate + i)), V_LOAD(up + i)));
#endif
        for (; i < inter; i++) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

void hydrant_silu_and_mul_f32(const float *x, int64_t x_stride, float *out, int rows,
                              int inter, int num_threads) {
    const int threads = threads_for((int64_t)rows * inter, num_threads);
    if (threads == 1) {
        silu_rows(x, x_stride, out, 0, rows, inter);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        silu_rows(x, x_stride, out, (int)((int64_t)rows * t / n),
                  (int)((int64_t)rows * (t + 1) / n), inter);
    }
}

/* ---- K/V write ---------------------------------------------------------------------- */

/* Each token's K and V row (`row_floats` = kv heads x head_dim) copied to its slot of the
   caches; a negative slot is skipped (padding). Returns -1, writing nothing, when a slot
   is at or past `num_slots`. */
int hydrant_write_kv_f32(const float *key, int64_t key_stride, const float *value,
                         int64_t value_stride, float *k_cache, float *v_cache,
                         const int64_t *slots, int64_t num_slots, int tokens, int row_floats) {
    for (int t = 0; t < tokens; t++)
        if (slots[t] >= num_slots) return -1;
    const size_t bytes = sizeof(float) * (size_t)row_floats;
    for (int t = 0; t < tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        memcpy(k_cache + slot * row_floats, key + (int64_t)t * key_stride, bytes);
        memcpy(v_cache + slot * row_floats, value + (int64_t)t * value_stride, bytes);
    }
    return 0;
}
