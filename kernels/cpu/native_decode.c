/*
 * Paged decode attention for the CPU, reading K/V where they lie in the block pool.
 *
 * Why C: the PyTorch path gathers each sequence's blocks into a padded
 * contiguous tensor and then runs SDPA over it, so K/V cross memory three
 * times (read, write, read) plus padding. Decode attention is bound by that
 * traffic; this kernel reads each cached K and V row once, in place.
 *
 * Layout (all float32, contiguous):
 *   q            [batch, num_heads, head_dim]
 *   k/v cache    [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables [batch, table_stride] int32, context_lens [batch] int32
 *   out          [batch, num_heads, head_dim]
 * One work item is a sequence (OpenMP, dynamic: context lengths differ): a pass
 * over its K rows gives every head's scores, an exact softmax per head (all
 * scores kept, float32), then a pass over its V rows. With AVX-512 and head
 * sizes 32/64/128, the K pass scores 16 tokens of a head (or 8 of two heads
 * sharing the K loads) at once and sums them with one transposing reduction,
 * the V pass walks the blocks once through register tiles (accumulators kept
 * in `out` between blocks), and both passes prefetch blocks ahead into L2 (the
 * blocks are scattered, so the hardware prefetcher stops at every block edge).
 * AVX2+FMA (EPYCs before Zen 4) does the same on 8 lanes: 8 tokens per head,
 * V tiles sized to its 16 registers, the same prefetch distance and a vector
 * row max. Otherwise portable loops do the same arithmetic (with libm's expf).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "native_simd.h"

/*
 * s[t] = exp(s[t] - m) in place, returning the sum. A decode step takes one
 * exp per head per context token (millions per step), so libm's scalar expf
 * would cost as much as reading the cache: with AVX-512 (or AVX2+FMA, below)
 * this is a degree-6 polynomial on the reduced argument scaled by 2^n
 * (vscalefps), ~1 ulp.
 */
#if defined(__AVX512F__)
/* exp(x) for x <= 0 on 16 lanes, 0 below -87 (lanes flushed, not denormal). */
static inline __m512 exp_nonpositive16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
    const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    const __m512 lowest = _mm512_set1_ps(-87.0f);
    const __m512 c2 = _mm512_set1_ps(1.0f / 2), c3 = _mm512_set1_ps(1.0f / 6);
    const __m512 c4 = _mm512_set1_ps(1.0f / 24), c5 = _mm512_set1_ps(1.0f / 120);
    const __m512 c6 = _mm512_set1_ps(1.0f / 720), one = _mm512_set1_ps(1.0f);
    const __mmask16 kept = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
    x = _mm512_max_ps(x, lowest);
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT);
    __m512 f = _mm512_fnmadd_ps(k, ln2_hi, x);
    f = _mm512_fnmadd_ps(k, ln2_lo, f);
    __m512 p = _mm512_fmadd_ps(c6, f, c5);
    p = _mm512_fmadd_ps(p, f, c4);
    p = _mm512_fmadd_ps(p, f, c3);
    p = _mm512_fmadd_ps(p, f, c2);
    p = _mm512_fmadd_ps(p, f, one);
    p = _mm512_fmadd_ps(p, f, one);
    return _mm512_maskz_mov_ps(kept, _mm512_scalef_ps(p, k));
}

static inline float exp_shifted(float *restrict s, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 total = _mm512_setzero_ps();
    int t = 0;
    for (; t + 16 <= n; t += 16) {
        const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(s + t), vm));
        _mm512_storeu_ps(s + t, e);
        total = _mm512_add_ps(total, e);
    }
    if (t < n) { /* the tail only: a mask on every load and store cost ~10% of the pass */
        const __mmask16 lanes = (__mmask16)((1u << (n - t)) - 1);
        const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + t), vm);
        const __m512 e = _mm512_maskz_mov_ps(lanes, exp_nonpositive16(x));
        _mm512_mask_storeu_ps(s + t, lanes, e);
        total = _mm512_add_ps(total, e);
    }
    return _mm512_reduce_add_ps(total);
}

/* The largest of s[0, n): a vector max (the scalar `s[t] > m ? s[t] : m` loop does not
   vectorise without -ffinite-math-only, and cost as much as the exps at head size 32). */
static inline float row_max(const float *restrict s, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 16 <= n; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + t));
    if (t < n) /* lanes past n keep m: no read past the row */
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, (__mmask16)((1u << (n - t)) - 1), s + t));
    return _mm512_reduce_max_ps(m);
}
#elif defined(__AVX2__) && defined(__FMA__)
/*
 * exp(x) for x <= 0 on 8 lanes, 0 below -87: the AVX-512 polynomial, but AVX2 has no
 * vscalefps, so 2^k is built in the exponent bits. x = s - max <= 0 clamped at -87 puts
 * k in [-126, 0], where k + 127 is a valid biased exponent (2^k a normal float).
 */
static inline __m256 exp_nonpositive8(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
    const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    const __m256 lowest = _mm256_set1_ps(-87.0f);
    const __m256 c2 = _mm256_set1_ps(1.0f / 2), c3 = _mm256_set1_ps(1.0f / 6);
    const __m256 c4 = _mm256_set1_ps(1.0f / 24), c5 = _mm256_set1_ps(1.0f / 120);
    const __m256 c6 = _mm256_set1_ps(1.0f / 720), one = _mm256_set1_ps(1.0f);
    const __m256 kept = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lowest);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, log2e),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(k, ln2_hi, x);
    f = _mm256_fnmadd_ps(k, ln2_lo, f);
    __m256 p = _mm256_fmadd_ps(c6, f, c5);
    p = _mm256_fmadd_ps(p, f, c4);
    p = _mm256_fmadd_ps(p, f, c3);
    p = _mm256_fmadd_ps(p, f, c2);
    p = _mm256_fmadd_ps(p, f, one);
    p = _mm256_fmadd_ps(p, f, one);
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
    const __m256 two_k = _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
    return _mm256_and_ps(kept, _mm256_mul_ps(p, two_k));
}

static inline float exp_shifted(float *restrict s, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 total = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        total = _mm256_add_ps(total, e);
    }
    if (t < n) { /* masked only here: maskstore is slow on AMD, so not in the loop */
        const __m256i lanes = lanes_below(n - t);
        __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_maskload_ps(s + t, lanes), vm));
        e = _mm256_and_ps(_mm256_castsi256_ps(lanes), e); /* lanes past n: exp(-m), dropped */
        _mm256_maskstore_ps(s + t, lanes, e);
        total = _mm256_add_ps(total, e);
    }
    return hsum8(total);
}

/* The largest of s[0, n) on 8 lanes (the scalar loop does not vectorise; as on AVX-512). */
static inline float row_max(const float *restrict s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
    if (t < n) { /* lanes past n keep m: no read past the row */
        const __m256i lanes = lanes_below(n - t);
        m = _mm256_max_ps(m, _mm256_blendv_ps(m, _mm256_maskload_ps(s + t, lanes),
                                              _mm256_castsi256_ps(lanes)));
    }
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#else
static inline float exp_shifted(float *restrict s, int n, float m) {
    float sum = 0.0f;
    for (int t = 0; t < n; t++) {
        s[t] = expf(s[t] - m);
        sum += s[t];
    }
    return sum;
}
#endif

#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
static inline float row_max(const float *restrict s, int n) {
    float m = -INFINITY;
    for (int t = 0; t < n; t++) m = s[t] > m ? s[t] : m;
    return m;
}
#endif

/* Each head's row of scores [num_heads][ctx] becomes its softmax, in place. */
static inline void softmax_rows(float *restrict scores, int ctx, int num_heads) {
    for (int h = 0; h < num_heads; h++) {
        float *s = scores + (int64_t)h * ctx;
        const float inv = 1.0f / exp_shifted(s, ctx, row_max(s, ctx));
        for (int t = 0; t < ctx; t++) s[t] *= inv;
    }
}

/* Blocks are scattered, so the hardware prefetcher stalls at each block edge:
   fetch the next block's row while this block's is used. Into L2 (locality 2), not L1:
   a block's worth of L1 prefetches holds the few L1 miss buffers the loads of the block
   in use need (at batch 128 the AVX2 path took 1.5-2x as long, the portable one 1.4x at
   head size 128). */
static inline void prefetch_row(const float *row, int64_t floats) {
    for (int64_t l = 0; l < floats; l += 16) __builtin_prefetch(row + l, 0, 2);
}

/*
 * One sequence: scores for every head over the context, softmax, then the V pass.
 * `head_dim` is a compile-time constant in the specialised copies below (64 and
 * 128, the common sizes), which lets the compiler unroll the row loops fully.
 */
static inline __attribute__((always_inline)) void attend_sequence(
    const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
    const int32_t *restrict table, int ctx, float *restrict out, float *restrict scores,
    float *restrict acc, int num_heads, int num_kv_heads, const int head_dim, int block_size,
    float scale) {
    const int group = num_heads / num_kv_heads;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    const int64_t block_stride = token_stride * block_size;
    const int num_blocks = (ctx + block_size - 1) / block_size;
    for (int j = 0; j < num_blocks; j++) {
        const float *block = k_cache + (int64_t)table[j] * block_stride;
        const int first = j * block_size;
        const int n = ctx - first < block_size ? ctx - first : block_size;
        const float *next = j + 1 < num_blocks ? k_cache + (int64_t)table[j + 1] * block_stride : NULL;
        for (int i = 0; i < n; i++) {
            const float *kv_row = block + (int64_t)i * token_stride;
            float *s = scores + first + i;
            if (next != NULL) prefetch_row(next + (int64_t)i * token_stride, token_stride);
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const float *krow = kv_row + (int64_t)kh * head_dim;
                for (int g = 0; g < group; g++) {
                    const int h = kh * group + g;
                    s[(int64_t)h * ctx] = scale * dot(q + (int64_t)h * head_dim, krow, head_dim);
                }
            }
        }
    }
    softmax_rows(scores, ctx, num_heads);
    memset(acc, 0, sizeof(float) * (size_t)num_heads * (size_t)head_dim);
    for (int j = 0; j < num_blocks; j++) {
        const float *block = v_cache + (int64_t)table[j] * block_stride;
        const int first = j * block_size;
        const int n = ctx - first < block_size ? ctx - first : block_size;
        const float *next = j + 1 < num_blocks ? v_cache + (int64_t)table[j + 1] * block_stride : NULL;
        for (int i = 0; i < n; i++) {
            const float *kv_row = block + (int64_t)i * token_stride;
            const float *s = scores + first + i;
            if (next != NULL) prefetch_row(next + (int64_t)i * token_stride, token_stride);
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const float *restrict vrow = kv_row + (int64_t)kh * head_dim;
                for (int g = 0; g < group; g++) {
                    const int h = kh * group + g;
                    const float w = s[(int64_t)h * ctx];
                    float *restrict a = acc + (int64_t)h * head_dim;
#pragma omp simd
                    for (int d = 0; d < head_dim; d++) a[d] += w * vrow[d];
                }
            }
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)num_heads * (size_t)head_dim);
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/*
 * Blocks to prefetch ahead: at least 16 KiB. One block ahead is too close when blocks are
 * small: at head size 32 with 2 KV heads a block (4 KiB) is scored in less time than the
 * next one takes to arrive (16 KiB ahead: a sixth less time at batch 128), while a 32 KiB
 * block (4 KV heads of 128) is work enough to hide the next.
 */
static inline int blocks_ahead(int64_t block_stride) {
    const int64_t blocks = 4096 / block_stride; /* 16 KiB of floats */
    return blocks > 1 ? (int)blocks : 1;
}

/* Block j of a sequence in one cache: its rows, its first position, the positions it
   holds, and the rows of the block `dist` ahead that it prefetches (NULL past the last). */
typedef struct {
    const float *rows;
    const float *ahead;
    int first;
    int n;
} SeqBlock;

static inline SeqBlock seq_block(const float *cache, const int32_t *table, int j, int dist,
                                 int num_blocks, int ctx, int block_size, int64_t block_stride) {
    const int first = j * block_size;
    const SeqBlock b = {
        .rows = cache + (int64_t)table[j] * block_stride,
        .ahead = j + dist < num_blocks ? cache + (int64_t)table[j + dist] * block_stride : NULL,
        .first = first,
        .n = ctx - first < block_size ? ctx - first : block_size,
    };
    return b;
}

/* Blocks 1 .. dist-1 of a sequence: the ones no earlier block prefetches. */
static inline void prefetch_leading_blocks(const float *cache, const int32_t *table, int dist,
                                           int num_blocks, int64_t block_stride) {
    for (int j = 1; j < dist && j < num_blocks; j++)
        prefetch_row(cache + (int64_t)table[j] * block_stride, block_stride);
}
#endif

#if defined(__AVX512F__)
/*
 * Scores of `heads` heads of one KV head (1 or 2) for up to 16 / heads tokens:
 * s[g * ctx + t] = scale * q_g . k_t, with `q` and `s` at the first head. Their 16
 * accumulators (head-major, K loads folded into the multiply-adds) end in one transposing
 * reduction (reduce16), lanes [g * tokens, (g + 1) * tokens) being head g's scores. Two heads
 * of a group share each K load: with K in cache the loads bound this pass, and 2 heads x 8
 * tokens took ~0.95x the time of 1 x 16 (whole calls, batch 8, head sizes 64 and 128), 4 x 4
 * 1.2x. `row` holds the tokens' offsets from `rows`, `lanes` the tokens stored.
 */
static inline __attribute__((always_inline)) void score_heads16(
    const float *restrict q, const float *restrict rows, const int64_t *restrict row,
    __mmask16 lanes, float *restrict scores, int ctx, const int head_dim, float scale,
    const int heads) {
    const int vecs = head_dim / 16;
    const int tokens = 16 / heads;
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < vecs; d++) {
        __m512 qv[2];
        for (int g = 0; g < heads; g++) qv[g] = _mm512_loadu_ps(q + (int64_t)g * head_dim + 16 * d);
        for (int u = 0; u < tokens; u++) {
            const __m512 kv = _mm512_loadu_ps(rows + row[u] + 16 * d);
            for (int g = 0; g < heads; g++)
                acc[g * tokens + u] = _mm512_fmadd_ps(qv[g], kv, acc[g * tokens + u]);
        }
    }
    const __m512 s = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));
    _mm512_mask_storeu_ps(scores, lanes, s);
    if (heads == 2) /* the second head's lanes, the upper half, down to lane 0 */
        _mm512_mask_storeu_ps(scores + ctx, lanes, _mm512_shuffle_f32x4(s, s, 0x4E));
}

/*
 * out[j][g][0, 16 * cvecs) += sum_i p[j][g][i] v_i[j][0, 16 * cvecs) over one block's n rows,
 * for `heads` heads of each of `kvs` adjacent KV heads (j); `rows`, `probs` and `out` point at
 * the tile, KV head j's heads `group` heads further on. kvs * heads * cvecs <= 16 accumulators
 * and a weight per head fit the 32 registers. As on AVX2 the accumulators live in `out`
 * between blocks (a load and a store per block), so V crosses memory once, block by block,
 * where accumulating over the whole context per head group read it once per group (1.1-1.3x
 * as long in all at batch 128). With `next` (the tile's place in the block ahead), each row
 * also prefetches its row there, all kvs KV heads' worth.
 */
static inline __attribute__((always_inline)) void value_tile16(
    const float *restrict rows, int n, int64_t token_stride, const float *restrict probs,
    int ctx, float *restrict out, const float *next, int head_dim, int group, const int kvs,
    const int heads, const int cvecs) {
    __m512 acc[16];
    for (int j = 0; j < kvs; j++)
        for (int g = 0; g < heads; g++)
            for (int d = 0; d < cvecs; d++)
                acc[(j * heads + g) * cvecs + d] =
                    _mm512_loadu_ps(out + (int64_t)(j * group + g) * head_dim + 16 * d);
    for (int i = 0; i < n; i++) {
        const float *row = rows + (int64_t)i * token_stride;
        if (next != NULL) prefetch_row(next + (int64_t)i * token_stride, (int64_t)kvs * head_dim);
        for (int j = 0; j < kvs; j++) {
            __m512 w[8];
            for (int g = 0; g < heads; g++)
                w[g] = _mm512_set1_ps(probs[(int64_t)(j * group + g) * ctx + i]);
            for (int d = 0; d < cvecs; d++) {
                const __m512 vv = _mm512_loadu_ps(row + (int64_t)j * head_dim + 16 * d);
                for (int g = 0; g < heads; g++)
                    acc[(j * heads + g) * cvecs + d] =
                        _mm512_fmadd_ps(w[g], vv, acc[(j * heads + g) * cvecs + d]);
            }
        }
    }
    for (int j = 0; j < kvs; j++)
        for (int g = 0; g < heads; g++)
            for (int d = 0; d < cvecs; d++)
                _mm512_storeu_ps(out + (int64_t)(j * group + g) * head_dim + 16 * d,
                                 acc[(j * heads + g) * cvecs + d]);
}

static inline __attribute__((always_inline)) void attend_sequence_avx512(
    const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
    const int32_t *restrict table, int ctx, float *restrict out, float *restrict scores,
    int num_heads, int num_kv_heads, const int head_dim, int block_size, float scale) {
    const int group = num_heads / num_kv_heads;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    const int64_t block_stride = token_stride * block_size;
    const int num_blocks = (ctx + block_size - 1) / block_size;
    const int dist = blocks_ahead(block_stride);
    /* heads of a group scored together (score_heads16); at head size 32 the reduction, not
       the loads, bounds the pass, and 2 heads were no faster than 1 */
    const int kheads = group % 2 == 0 && head_dim >= 64 ? 2 : 1;
    const int tokens = 16 / kheads;
    /*
     * Every 16 rows scored prefetch the same rows of the block `dist` ahead, each call its
     * `share` (floats, whole lines): spread over the calls, the prefetches leave the loads in
     * use the miss buffers they need (a chunk's all at once: the K pass took up to 1.8x as
     * long), and one line at a time from a counter keeps the per-call cost to the
     * prefetches themselves (with K in cache they compete with its loads).
     */
    const int chunk = block_size < 16 ? block_size : 16;
    const int calls = num_kv_heads * ((chunk + tokens - 1) / tokens) * (group / kheads);
    const int64_t share = ((chunk * token_stride + 15) / 16 + calls - 1) / calls * 16;
    prefetch_leading_blocks(k_cache, table, dist, num_blocks, block_stride);
    for (int j = 0; j < num_blocks; j++) {
        const SeqBlock b =
            seq_block(k_cache, table, j, dist, num_blocks, ctx, block_size, block_stride);
        for (int i = 0; i < b.n; i += 16) {
            const float *ahead = b.ahead != NULL ? b.ahead + (int64_t)i * token_stride : NULL;
            const int64_t ahead_floats =
                (int64_t)(block_size - i < 16 ? block_size - i : 16) * token_stride;
            int64_t at = 0; /* floats of `ahead` prefetched */
            for (int t = i; t < i + 16 && t < b.n; t += tokens) {
                const int m = b.n - t < tokens ? b.n - t : tokens;
                const __mmask16 lanes = (__mmask16)((1u << m) - 1);
                /* rows past b.n read row t again (valid memory) and are not stored: no branch
                   per token */
                int64_t row[16];
                for (int u = 0; u < tokens; u++) row[u] = (t + (u < m ? u : 0)) * token_stride;
                for (int kh = 0; kh < num_kv_heads; kh++) {
                    for (int g = 0; g < group; g += kheads) {
                        if (ahead != NULL) {
                            const int64_t end =
                                at + share < ahead_floats ? at + share : ahead_floats;
                            for (; at < end; at += 16) __builtin_prefetch(ahead + at, 0, 2);
                        }
                        const int h = kh * group + g;
                        const float *qh = q + (int64_t)h * head_dim;
                        const float *rows = b.rows + (int64_t)kh * head_dim;
                        float *s = scores + (int64_t)h * ctx + b.first + t;
                        if (kheads == 2)
                            score_heads16(qh, rows, row, lanes, s, ctx, head_dim, scale, 2);
                        else
                            score_heads16(qh, rows, row, lanes, s, ctx, head_dim, scale, 1);
                    }
                }
            }
        }
    }
    softmax_rows(scores, ctx, num_heads);
    /*
     * V per block through register tiles. A group of up to 8 accumulators (e.g. 2 heads of
     * 32) shares a tile with the next KV head's, for 16 FMA chains per row instead of 8
     * (~5% at head size 32). Otherwise a KV head's heads go in balanced passes of up to
     * 16 accumulators, through column tiles of 4 vectors (8 for a lone head of 128).
     */
    const int vecs = head_dim / 16;
    const int kvs = group * vecs <= 8 && num_kv_heads > 1 ? 2 : 1;
    const int cvecs = vecs <= 4 ? vecs : (group == 1 ? 8 : 4);
    const int max_heads = 16 / cvecs;
    const int passes = (group + max_heads - 1) / max_heads;
    const int per_pass = (group + passes - 1) / passes;
    memset(out, 0, sizeof(float) * (size_t)num_heads * (size_t)head_dim);
    prefetch_leading_blocks(v_cache, table, dist, num_blocks, block_stride);
    for (int j = 0; j < num_blocks; j++) {
        const SeqBlock b =
            seq_block(v_cache, table, j, dist, num_blocks, ctx, block_size, block_stride);
        for (int kh = 0; kh < num_kv_heads; kh += kvs) {
            const int pair = kvs == 2 && kh + 1 < num_kv_heads;
            for (int g0 = 0; g0 < group; g0 += per_pass) {
                const int heads = group - g0 < per_pass ? group - g0 : per_pass;
                const int h = kh * group + g0;
                const float *probs = scores + (int64_t)h * ctx + b.first;
                for (int c = 0; c < vecs; c += cvecs) {
                    const float *rows = b.rows + (int64_t)kh * head_dim + 16 * c;
                    float *o = out + (int64_t)h * head_dim + 16 * c;
                    /* the first tile of a KV head (or pair) fetches its rows in `b.ahead` */
                    const float *ahead = b.ahead != NULL && g0 == 0 && c == 0
                                             ? b.ahead + (int64_t)kh * head_dim
                                             : NULL;
#define VALUE_TILE(K, H, C) \
    value_tile16(rows, b.n, token_stride, probs, ctx, o, ahead, head_dim, group, K, H, C)
                    if (pair) { /* group * vecs <= 8: one pass, one column tile */
                        switch (group * 16 + vecs) {
                            case 16 + 2: VALUE_TILE(2, 1, 2); break;
                            case 16 + 4: VALUE_TILE(2, 1, 4); break;
                            case 16 + 8: VALUE_TILE(2, 1, 8); break;
                            case 32 + 2: VALUE_TILE(2, 2, 2); break;
                            case 32 + 4: VALUE_TILE(2, 2, 4); break;
                            case 48 + 2: VALUE_TILE(2, 3, 2); break;
                            default: VALUE_TILE(2, 4, 2); break;
                        }
                    } else if (cvecs == 8) {
                        VALUE_TILE(1, 1, 8); /* group == 1 */
                    } else if (cvecs == 4) {
                        switch (heads) {
                            case 1: VALUE_TILE(1, 1, 4); break;
                            case 2: VALUE_TILE(1, 2, 4); break;
                            case 3: VALUE_TILE(1, 3, 4); break;
                            default: VALUE_TILE(1, 4, 4); break;
                        }
                    } else {
                        switch (heads) {
                            case 1: VALUE_TILE(1, 1, 2); break;
                            case 2: VALUE_TILE(1, 2, 2); break;
                            case 3: VALUE_TILE(1, 3, 2); break;
                            case 4: VALUE_TILE(1, 4, 2); break;
                            case 5: VALUE_TILE(1, 5, 2); break;
                            case 6: VALUE_TILE(1, 6, 2); break;
                            case 7: VALUE_TILE(1, 7, 2); break;
                            default: VALUE_TILE(1, 8, 2); break;
                        }
                    }
#undef VALUE_TILE
                }
            }
        }
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
/*
 * Scores of every head for up to 8 tokens of one block: s[h * ctx + t] = scale * q_h . k_t.
 * 8 accumulators (one per token) and the q vector fit AVX2's 16 registers at any head size,
 * with K loads folded into the multiply-adds; one transposing reduction (reduce8) sums them.
 */
static inline __attribute__((always_inline)) void score_tokens8(
    const float *restrict q, const float *restrict rows, int64_t token_stride, int n,
    float *restrict scores, int ctx, int num_heads, int group, const int head_dim, float scale,
    const float *ahead, int64_t ahead_floats, int64_t share) {
    const int vecs = head_dim / 8;
    int64_t at = 0; /* floats of `ahead` prefetched, `share` more before each head */
    const __m256 vscale = _mm256_set1_ps(scale);
    /* rows past n read row 0 again (valid memory) and are not stored: no branch per token */
    int64_t row[8];
    for (int u = 0; u < 8; u++) row[u] = (u < n ? u : 0) * token_stride;
    for (int h = 0; h < num_heads; h++) {
        if (ahead != NULL) {
            const int64_t end = at + share < ahead_floats ? at + share : ahead_floats;
            for (; at < end; at += 16) __builtin_prefetch(ahead + at, 0, 2);
        }
        const float *qh = q + (int64_t)h * head_dim;
        const float *kh = rows + (int64_t)(h / group) * head_dim;
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
        for (int d = 0; d < vecs; d++) {
            const __m256 qv = _mm256_loadu_ps(qh + 8 * d);
            for (int u = 0; u < 8; u++)
                acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kh + row[u] + 8 * d), acc[u]);
        }
        const __m256 s = _mm256_mul_ps(reduce8(acc), vscale);
        if (n >= 8)
            _mm256_storeu_ps(scores + (int64_t)h * ctx, s);
        else
            _mm256_maskstore_ps(scores + (int64_t)h * ctx, lanes_below(n), s);
    }
}

/*
 * out[g][0, 8 * cvecs) += sum_i p[g][i] v_i[0, 8 * cvecs) over one block's n rows, for `heads`
 * heads of one KV head; `rows`, `probs` and `out` point at the tile. heads * cvecs <= 12
 * accumulators, a weight per head and the V vector: at most 16 registers. The accumulators
 * live in `out` between blocks (a load and a store per block, next to 16 tokens of FMAs),
 * so every tile of a block reads its rows from L1 and V crosses memory once.
 */
static inline __attribute__((always_inline)) void value_tile(
    const float *restrict rows, int n, int64_t token_stride, const float *restrict probs,
    int ctx, float *restrict out, const float *next, int head_dim, const int heads,
    const int cvecs) {
    __m256 acc[12];
    for (int g = 0; g < heads; g++)
        for (int d = 0; d < cvecs; d++)
            acc[g * cvecs + d] = _mm256_loadu_ps(out + (int64_t)g * head_dim + 8 * d);
    for (int i = 0; i < n; i++) {
        const float *row = rows + (int64_t)i * token_stride;
        if (next != NULL) prefetch_row(next + (int64_t)i * token_stride, head_dim);
        __m256 w[3];
        for (int g = 0; g < heads; g++) w[g] = _mm256_set1_ps(probs[(int64_t)g * ctx + i]);
        for (int d = 0; d < cvecs; d++) {
            const __m256 vv = _mm256_loadu_ps(row + 8 * d);
            for (int g = 0; g < heads; g++)
                acc[g * cvecs + d] = _mm256_fmadd_ps(w[g], vv, acc[g * cvecs + d]);
        }
    }
    for (int g = 0; g < heads; g++)
        for (int d = 0; d < cvecs; d++)
            _mm256_storeu_ps(out + (int64_t)g * head_dim + 8 * d, acc[g * cvecs + d]);
}

static inline __attribute__((always_inline)) void attend_sequence_avx2(
    const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
    const int32_t *restrict table, int ctx, float *restrict out, float *restrict scores,
    int num_heads, int num_kv_heads, const int head_dim, int block_size, float scale) {
    const int group = num_heads / num_kv_heads;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    const int64_t block_stride = token_stride * block_size;
    const int num_blocks = (ctx + block_size - 1) / block_size;
    const int dist = blocks_ahead(block_stride);
    /* Every 8 rows scored prefetch the same rows of the block `dist` ahead, `share` floats
       (whole lines) before each head: spread over the heads as on AVX-512 (all at once,
       the prefetches hold the miss buffers the loads in use need) */
    const int64_t share = ((8 * token_stride + 15) / 16 + num_heads - 1) / num_heads * 16;
    prefetch_leading_blocks(k_cache, table, dist, num_blocks, block_stride);
    for (int j = 0; j < num_blocks; j++) {
        const SeqBlock b =
            seq_block(k_cache, table, j, dist, num_blocks, ctx, block_size, block_stride);
        for (int i = 0; i < b.n; i += 8) {
            const float *ahead = b.ahead != NULL ? b.ahead + (int64_t)i * token_stride : NULL;
            const int64_t ahead_floats =
                (int64_t)(block_size - i < 8 ? block_size - i : 8) * token_stride;
            score_tokens8(q, b.rows + (int64_t)i * token_stride, token_stride,
                          b.n - i < 8 ? b.n - i : 8, scores + b.first + i, ctx, num_heads,
                          group, head_dim, scale, ahead, ahead_floats, share);
        }
    }
    softmax_rows(scores, ctx, num_heads);
    /*
     * A head's row does not fit 12 accumulators past head size 96, so each block of V goes
     * through column tiles. Heads of a group share each V row, so a group takes tiles of 4
     * vectors (32 floats) for up to 3 heads at once, heads balanced (4 heads: 2 + 2); a lone
     * head (no GQA) takes 8 vectors, half the tiles at the same 8 FMA chains.
     */
    const int vecs = head_dim / 8;
    const int cvecs = group == 1 && vecs >= 8 ? 8 : 4;
    const int passes = (group + 2) / 3;
    const int per_pass = (group + passes - 1) / passes;
    memset(out, 0, sizeof(float) * (size_t)num_heads * (size_t)head_dim);
    prefetch_leading_blocks(v_cache, table, dist, num_blocks, block_stride);
    for (int j = 0; j < num_blocks; j++) {
        const SeqBlock b =
            seq_block(v_cache, table, j, dist, num_blocks, ctx, block_size, block_stride);
        for (int kh = 0; kh < num_kv_heads; kh++) {
            for (int g0 = 0; g0 < group; g0 += per_pass) {
                const int heads = group - g0 < per_pass ? group - g0 : per_pass;
                const int h = kh * group + g0;
                const float *probs = scores + (int64_t)h * ctx + b.first;
                for (int c = 0; c < vecs; c += cvecs) {
                    const float *rows = b.rows + (int64_t)kh * head_dim + 8 * c;
                    float *o = out + (int64_t)h * head_dim + 8 * c;
                    /* a KV head's first tile fetches its rows in the block `dist` ahead */
                    const float *ahead = b.ahead != NULL && g0 == 0 && c == 0
                                             ? b.ahead + (int64_t)kh * head_dim
                                             : NULL;
#define VALUE_TILE(H, C) \
    value_tile(rows, b.n, token_stride, probs, ctx, o, ahead, head_dim, H, C)
                    if (cvecs == 8) {
                        VALUE_TILE(1, 8);
                    } else {
                        switch (heads) {
                            case 1: VALUE_TILE(1, 4); break;
                            case 2: VALUE_TILE(2, 4); break;
                            default: VALUE_TILE(3, 4); break;
                        }
                    }
#undef VALUE_TILE
                }
            }
        }
    }
}
#endif

static void attend_sequence_any(const float *q, const float *k_cache, const float *v_cache,
                                const int32_t *table, int ctx, float *out, float *scores,
                                float *acc, int num_heads, int num_kv_heads, int head_dim,
                                int block_size, float scale) {
#if defined(__AVX512F__)
#define ATTEND_SEQUENCE_SIMD attend_sequence_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define ATTEND_SEQUENCE_SIMD attend_sequence_avx2
#endif
#ifdef ATTEND_SEQUENCE_SIMD
    /* the SIMD path for the head sizes it specialises (a compile-time head_dim each) */
    switch (head_dim) {
        case 32:
            ATTEND_SEQUENCE_SIMD(q, k_cache, v_cache, table, ctx, out, scores, num_heads,
                                 num_kv_heads, 32, block_size, scale);
            return;
        case 64:
            ATTEND_SEQUENCE_SIMD(q, k_cache, v_cache, table, ctx, out, scores, num_heads,
                                 num_kv_heads, 64, block_size, scale);
            return;
        case 128:
            ATTEND_SEQUENCE_SIMD(q, k_cache, v_cache, table, ctx, out, scores, num_heads,
                                 num_kv_heads, 128, block_size, scale);
            return;
        default:
            break;
    }
#endif
    switch (head_dim) {
        case 64:
            attend_sequence(q, k_cache, v_cache, table, ctx, out, scores, acc, num_heads,
                            num_kv_heads, 64, block_size, scale);
            break;
        case 128:
            attend_sequence(q, k_cache, v_cache, table, ctx, out, scores, acc, num_heads,
                            num_kv_heads, 128, block_size, scale);
            break;
        default:
            attend_sequence(q, k_cache, v_cache, table, ctx, out, scores, acc, num_heads,
                            num_kv_heads, head_dim, block_size, scale);
    }
}

/*
 * Each row r (of q and out: row_index[r], or r where row_index is NULL) attends to the first
 * row_ctx[r] positions of the sequence whose block table is row row_seq[r] (row_seq NULL:
 * row r's own table). Decode is one row per sequence; a
 * prefill gives every prompt position a row of its own, its context ending at itself
 * (causal), so a short prompt's attention is this kernel over its rows instead of one
 * SDPA call per sequence (a gather of its blocks and a flash kernel whose fixed costs and
 * 32-row tiles dominate below a few hundred tokens).
 */
static int attend_rows(const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *block_tables, int64_t table_stride,
                       const int32_t *row_index, const int32_t *row_seq,
                       const int32_t *row_ctx, float *out, int rows, int num_heads,
                       int num_kv_heads, int head_dim, int block_size, int max_context,
                       float scale, int num_threads) {
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)num_heads * (size_t)max_context);
        float *acc = (float *)malloc(sizeof(float) * (size_t)num_heads * (size_t)head_dim);
        if (scores == NULL || acc == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < rows; b++) {
            const int64_t row = row_index == NULL ? b : row_index[b];
            const int64_t offset = row * num_heads * head_dim;
            if (scores == NULL || acc == NULL) continue;
            if (row_ctx[b] <= 0) {
                memset(out + offset, 0, sizeof(float) * (size_t)num_heads * (size_t)head_dim);
                continue;
            }
            const int64_t seq = row_seq == NULL ? b : row_seq[b];
            attend_sequence_any(q + offset, k_cache, v_cache, block_tables + seq * table_stride,
                                row_ctx[b], out + offset, scores, acc, num_heads, num_kv_heads,
                                head_dim, block_size, scale);
        }
        free(scores);
        free(acc);
    }
    return failed ? -1 : 0;
}

/*
 * Decode attention: sequence b's one new row attends to its first context_lens[b]
 * positions. Returns -2, writing nothing, when a context does not fit its block table (the
 * scheduler's invariant; max_context, the table's capacity, sizes the score buffers), -1
 * when a buffer cannot be allocated.
 */
int hydrant_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                             const int32_t *block_tables, int64_t table_stride,
                             const int32_t *context_lens, float *out, int batch, int num_heads,
                             int num_kv_heads, int head_dim, int block_size, int max_context,
                             float scale, int num_threads) {
    const int64_t capacity = table_stride * block_size;
    for (int b = 0; b < batch; b++) {
        if (context_lens[b] > capacity || context_lens[b] > max_context) return -2;
    }
    return attend_rows(q, k_cache, v_cache, block_tables, table_stride, NULL, NULL, context_lens,
                       out, batch, num_heads, num_kv_heads, head_dim, block_size, max_context,
                       scale, num_threads);
}

/*
 * Prefill attention as rows: every new position of sequence s (rows cu_seqlens[s] up to
 * cu_seqlens[s + 1]) attends to its context up to itself, context_lens[s] less the rows
 * after it. The rows' indices are derived here from the step's per-sequence tensors, so
 * each layer's call costs no index tensors in Python. Sequences with skip[s] set (skip
 * may be NULL) are left unwritten: the caller filled them by another path. Returns -2,
 * writing nothing, when a context does not fit its block table (the scheduler's
 * invariant), -1 when a buffer cannot be allocated.
 */
int hydrant_paged_prefill_f32(const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, int64_t table_stride,
                              const int32_t *cu_seqlens, const int32_t *context_lens,
                              const uint8_t *skip, float *out, int num_seqs, int num_heads,
                              int num_kv_heads, int head_dim, int block_size, float scale,
                              int num_threads) {
    const int total = cu_seqlens[num_seqs];
    if (total <= 0) return 0;
    int32_t *index = (int32_t *)malloc(sizeof(int32_t) * 3 * (size_t)total);
    if (index == NULL) return -1;
    int32_t *seq = index + total;
    int32_t *ctx = seq + total;
    const int64_t capacity = table_stride * block_size;
    int rows = 0;
    int max_context = 1;
    for (int s = 0; s < num_seqs; s++) {
        if (skip != NULL && skip[s]) continue;
        const int end = cu_seqlens[s + 1];
        for (int r = cu_seqlens[s]; r < end; r++) {
            const int context = context_lens[s] - (end - r - 1);
            if (context > capacity) {
                free(index);
                return -2;
            }
            index[rows] = r;
            seq[rows] = s;
            ctx[rows] = context;
            if (context > max_context) max_context = context;
            rows++;
        }
    }
    const int status = attend_rows(q, k_cache, v_cache, block_tables, table_stride, index, seq,
                                   ctx, out, rows, num_heads, num_kv_heads, head_dim, block_size,
                                   max_context, scale, num_threads);
    free(index);
    return status;
}
