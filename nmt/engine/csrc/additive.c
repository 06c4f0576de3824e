/* The additive attention score of Bahdanau, Cho and Bengio 2014 (appendix A.1.2) for one decoder step of bf16
   training, and its backward, each in one pass over the (B, S, A) products that torch makes ten passes of
   (nmt/models/fused_loop.py calls them through nmt/engine/native.py, which checks what it passes):

     forward   e_bs = sum_a v_a tanh(q_ba + k_bsa)                   q (B, A) and k (B, S, A) bf16, v (A) float32
     backward  u_bsa = g_bs (1 - tanh(q_ba + k_bsa)^2)               g = dL/de (B, S) float32
               dq_ba = sum_s u_bsa v_a          (written)
               dk_bsa += u_bsa v_a              (added: the keys' gradient sums over the decoder's steps)
               dv_ba += sum_s g_bs tanh(q_ba + k_bsa)   (added: one row per sentence; the caller sums the rows once)

   q + k and the tanh are computed in float32 from the bf16 inputs (torch's bf16 autocast rounds q + k and the tanh
   to bf16: these values are the exact ones those round). The backward recomputes the tanh instead of keeping the
   (B, S, A) tensor. Sentences are shared among torch's OpenMP threads; each sentence's rows of dq, dk and dv are
   its thread's alone, so any thread count gives the same bits. A key whose g is 0 (padding: its weight is 0) adds
   nothing and is skipped. `q_stride` is the distance between q's rows (q may be the first A columns of a wider
   product). */
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"
#include "vmath.h"

#define LANES 16 /* independent partial sums of a score: a vector's width of float32 */
#define SMALL 0.0625f /* below this |x|, tanh's odd series (to x^7) instead of (1 - e) / (1 + e) */

/* tanh x from exp(-2|x|) (vmath.h's exp_nonpositive), and the series near 0 where 1 - e would cancel: within a
   few float32 ulp of tanhf. */
static inline float tanh_float(float x) {
    float ax = fabsf(x);
    float t;
    if (ax < SMALL) {
        float x2 = x * x;
        t = ax * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
    } else {
        float e = exp_nonpositive(-2.0f * ax);
        t = (1.0f - e) / (1.0f + e);
    }
    return x < 0.0f ? -t : t;
}

#ifdef __AVX512F__
#include <immintrin.h>

/* tanh_float of 16 values: the same operations on each lane (both branches computed, the lane's one kept). */
static inline __m512 tanh16(__m512 x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp16_nonpositive(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_add_ps(_mm512_mul_ps(x2, _mm512_set1_ps(-17.0f / 315.0f)), _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_add_ps(_mm512_mul_ps(x2, p), _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_add_ps(_mm512_mul_ps(x2, p), one);
    __m512 small = _mm512_mul_ps(ax, p);
    __mmask16 near0 = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(SMALL), _CMP_LT_OQ);
    __m512 t = _mm512_mask_mov_ps(big, near0, small);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(sign, _mm512_castps_si512(x))));
}

static inline __m512 load16_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

int additive_scores_forward(const uint16_t *q, int64_t q_stride, const uint16_t *keys, const float *v, int64_t batch,
                            int64_t length, int64_t width, float *scores) {
    if (batch < 0 || length < 0 || width < 1 || q_stride < width) return NMT_OUT_OF_BOUNDS;
#pragma omp parallel for schedule(static) if (batch * length * width >= (1 << 15))
    for (int64_t b = 0; b < batch; ++b) {
        const uint16_t *qb = q + b * q_stride;
        for (int64_t s = 0; s < length; ++s) {
            const uint16_t *k = keys + (b * length + s) * width;
            float sum = 0.0f;
            int64_t a = 0;
#ifdef __AVX512F__
            __m512 acc = _mm512_setzero_ps();
            for (; a + 16 <= width; a += 16) {
                __m512 h = tanh16(_mm512_add_ps(load16_bf16(qb + a), load16_bf16(k + a)));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(h, _mm512_loadu_ps(v + a)));
            }
            sum = _mm512_reduce_add_ps(acc);
#else
            float acc[LANES] = {0};
            for (; a + LANES <= width; a += LANES)
                for (int l = 0; l < LANES; ++l)
                    acc[l] += tanh_float(bf16_to_float(qb[a + l]) + bf16_to_float(k[a + l])) * v[a + l];
            for (int l = 0; l < LANES; ++l) sum += acc[l];
#endif
            for (; a < width; ++a) sum += tanh_float(bf16_to_float(qb[a]) + bf16_to_float(k[a])) * v[a];
            scores[b * length + s] = sum;
        }
    }
    return NMT_DONE;
}

int additive_scores_backward(const uint16_t *q, int64_t q_stride, const uint16_t *keys, const float *v,
                             const float *grad, int64_t batch, int64_t length, int64_t width, float *dq, float *dkeys,
                             float *dv_rows) {
    if (batch < 0 || length < 0 || width < 1 || q_stride < width) return NMT_OUT_OF_BOUNDS;
#pragma omp parallel for schedule(static) if (batch * length * width >= (1 << 15))
    for (int64_t b = 0; b < batch; ++b) {
        const uint16_t *qb = q + b * q_stride;
        float *dqb = dq + b * width, *dvb = dv_rows + b * width;
        for (int64_t a = 0; a < width; ++a) dqb[a] = 0.0f;
        for (int64_t s = 0; s < length; ++s) {
            const float g = grad[b * length + s];
            if (g == 0.0f) continue;
            const uint16_t *k = keys + (b * length + s) * width;
            float *dk = dkeys + (b * length + s) * width;
            int64_t a = 0;
#ifdef __AVX512F__
            const __m512 gv = _mm512_set1_ps(g), one = _mm512_set1_ps(1.0f);
            for (; a + 16 <= width; a += 16) {
                __m512 h = tanh16(_mm512_add_ps(load16_bf16(qb + a), load16_bf16(k + a)));
                __m512 u = _mm512_mul_ps(_mm512_mul_ps(gv, _mm512_sub_ps(one, _mm512_mul_ps(h, h))), _mm512_loadu_ps(v + a));
                _mm512_storeu_ps(dqb + a, _mm512_add_ps(_mm512_loadu_ps(dqb + a), u));
                _mm512_storeu_ps(dk + a, _mm512_add_ps(_mm512_loadu_ps(dk + a), u));
                _mm512_storeu_ps(dvb + a, _mm512_add_ps(_mm512_loadu_ps(dvb + a), _mm512_mul_ps(gv, h)));
            }
#endif
            for (; a < width; ++a) {
                const float h = tanh_float(bf16_to_float(qb[a]) + bf16_to_float(k[a]));
                const float u = g * (1.0f - h * h) * v[a];
                dqb[a] += u;
                dk[a] += u;
                dvb[a] += g * h;
            }
        }
    }
    return NMT_DONE;
}
