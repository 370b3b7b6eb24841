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
