/*
 * SIMD helpers shared by the CPU kernels (native_decode.c, native_lora.c).
 */
#ifndef HYDRANT_NATIVE_SIMD_H
#define HYDRANT_NATIVE_SIMD_H

/*
 * A dot product whose final reduction is a tree: `omp simd reduction` sums the
 * 16 lanes one after another (ordered), which cost more than the multiplies.
 */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline float dot(const float *restrict a, const float *restrict b, int n) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    float sum = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* Lane i of the result is the sum of the 16 lanes of v[i]: 16 dot products finished at once. */
static inline __m512 reduce16(const __m512 *v) {
    __m512 r[8], t[4], u[2];
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_ps(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                         _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
}
#elif defined(__AVX2__) && defined(__FMA__)
/*
 * AVX2+FMA (e.g. AMD EPYC before Zen 4): the same helpers on 8 lanes. No masked
 * loads or stores of any width, so a tail takes a lane mask (maskload/maskstore).
 */
#include <immintrin.h>

/* The 8 lanes summed as a tree: lane l + l+4, then + l+2, then + l+1 (the portable order). */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* All ones in lanes below n (0 <= n <= 8): the mask maskload/maskstore take. */
static inline __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = hsum8(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* Lane i of the result is the sum of the 8 lanes of v[i]: 8 dot products finished at once
   (reduce16's steps, the last one across the two 128-bit halves). */
static inline __m256 reduce8(const __m256 *v) {
    __m256 r[4], t[2];
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        t[i] = _mm256_add_ps(_mm256_shuffle_ps(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_permute2f128_ps(t[0], t[1], 0x20),
                         _mm256_permute2f128_ps(t[0], t[1], 0x31));
}
#else
static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) part[l] += a[i + l] * b[i + l];
    for (int w = 4; w > 0; w /= 2)
        for (int l = 0; l < w; l++) part[l] += part[l + w];
    float sum = part[0];
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}
#endif

#endif
