/* Vector math shared by nmt's C sources (kernels.c, loss.c): exp of non-positive numbers and a row's maximum, each
   with an AVX-512 version whose lanes compute what the scalar one computes, bit for bit. */
#ifndef NMT_VMATH_H
#define NMT_VMATH_H

#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* exp(x) for x <= 0 (scores minus their maximum), vectorizable: Cephes' expf polynomial with 2^n from the exponent
   bits; within 2 ulp of expf, and exactly 0 below -87 (where expf is below 1.7e-38), -inf included. */
static inline float exp_nonpositive(float x) {
    float y = x < -87.0f ? -87.0f : x;
    float n = rintf(y * 1.44269504088896341f);
    float r = y - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    float e = p * two_n.f;
    return x < -87.0f ? 0.0f : e;
}

#ifdef __AVX512F__
/* exp_nonpositive of 16 values at once: the same operations in the same order on each lane (rint as the round to
   nearest even, 2^n from the exponent bits), so each lane equals exp_nonpositive of its value bit for bit. */
static inline __m512 exp16_nonpositive(__m512 x) {
    __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __m512 y = _mm512_mask_mov_ps(x, under, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(y, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
    return _mm512_mask_mov_ps(e, under, _mm512_setzero_ps());
}
#endif

/* The largest value of a row (exact in any order). */
static inline float row_max(const float *x, int64_t width) {
    float m = -INFINITY;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 lanes = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= width; i += 16) lanes = _mm512_max_ps(lanes, _mm512_loadu_ps(x + i));
    m = _mm512_reduce_max_ps(lanes);
#endif
    for (; i < width; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

#endif /* NMT_VMATH_H */
