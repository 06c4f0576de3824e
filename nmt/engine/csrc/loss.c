/* The training loss's kernels: label-smoothed cross-entropy over rows of logits, forward and backward, in one pass
   over each row (nmt/training/loss.py calls them through nmt/engine/native.py, which checks what it passes).

     loss_r = (1 - eps) (lse_r - x_{r,y_r}) + eps (lse_r - mean_v x_{r,v}),   lse_r = log sum_v exp(x_{r,v})
     d loss_r / d x_{r,v} = exp(x_{r,v} - lse_r) - eps / V - (1 - eps) [v == y_r]

   Logits are float32 or bf16 (the raw 16 bits; a bf16 row is widened into a float32 buffer first, exactly), the
   gradient is written in the logits' dtype (bf16 rounded to nearest even, as torch rounds). Sums run in 16 lanes and
   exp is vmath.h's (within 2 ulp of expf), so results differ from torch's log_softmax in the last bits. Rows are
   shared among torch's OpenMP threads; each is computed from itself alone. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"
#include "vmath.h"

/* Row r of x as float32: the row itself, or (bf16) widened into buf. */
static inline const float *row_of(const void *x, int bf16, int64_t r, int64_t width, float *buf) {
    if (!bf16) return (const float *)x + r * width;
    const uint16_t *h = (const uint16_t *)x + r * width;
    for (int64_t i = 0; i < width; ++i) buf[i] = bf16_to_float(h[i]);
    return buf;
}

/* sum exp(x - m) and sum x over a row, each in 16 lanes */
static void row_sums(const float *x, int64_t width, float m, float *sum_exp, float *sum_x) {
    float le[16] = {0.0f}, lx[16] = {0.0f};
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 e = _mm512_setzero_ps(), s = _mm512_setzero_ps(), mv = _mm512_set1_ps(m);
    for (; i + 16 <= width; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        e = _mm512_add_ps(e, exp16_nonpositive(_mm512_sub_ps(v, mv)));
        s = _mm512_add_ps(s, v);
    }
    _mm512_storeu_ps(le, e);
    _mm512_storeu_ps(lx, s);
#endif
    for (; i + 16 <= width; i += 16)
        for (int c = 0; c < 16; ++c) {
            le[c] += exp_nonpositive(x[i + c] - m);
            lx[c] += x[i + c];
        }
    float te = 0.0f, tx = 0.0f;
    for (; i < width; ++i) {
        te += exp_nonpositive(x[i] - m);
        tx += x[i];
    }
    for (int c = 0; c < 16; ++c) {
        te += le[c];
        tx += lx[c];
    }
    *sum_exp = te;
    *sum_x = tx;
}

int xent_forward(const void *x, int bf16, int64_t rows, int64_t width, const int64_t *target, float eps,
                 float *loss, float *lse) {
    if (rows < 0 || width < 1 || !(eps >= 0.0f && eps <= 1.0f)) return NMT_OUT_OF_BOUNDS;
    for (int64_t r = 0; r < rows; ++r)
        if (target[r] < 0 || target[r] >= width) return NMT_OUT_OF_BOUNDS;
    int failed = 0;
#pragma omp parallel if (rows * width >= (1 << 18))
    {
        float *buf = bf16 ? malloc((size_t)width * sizeof(float)) : NULL;
        if (bf16 && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (bf16 && !buf) continue;
            const float *xr = row_of(x, bf16, r, width, buf);
            float m = row_max(xr, width), sum_exp, sum_x;
            row_sums(xr, width, m, &sum_exp, &sum_x);
            float l = m + logf(sum_exp);
            lse[r] = l;
            float smoothed = eps > 0.0f ? eps * (l - sum_x / (float)width) : 0.0f;  /* (no 0 * inf without eps) */
            loss[r] = (1.0f - eps) * (l - xr[target[r]]) + smoothed;
        }
        free(buf);
    }
    return failed ? NMT_NO_MEMORY : NMT_DONE;
}

int xent_backward(const void *x, int bf16, int64_t rows, int64_t width, const int64_t *target, float eps,
                  const float *lse, float g, void *grad) {
    if (rows < 0 || width < 1 || !(eps >= 0.0f && eps <= 1.0f)) return NMT_OUT_OF_BOUNDS;
    for (int64_t r = 0; r < rows; ++r)
        if (target[r] < 0 || target[r] >= width) return NMT_OUT_OF_BOUNDS;
    const float smooth = eps / (float)width * g;
    int failed = 0;
#pragma omp parallel if (rows * width >= (1 << 18))
    {
        float *buf = bf16 ? malloc((size_t)width * sizeof(float)) : NULL;
        if (bf16 && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (bf16 && !buf) continue;
            const float *xr = row_of(x, bf16, r, width, buf);
            float l = lse[r];
            float *out = bf16 ? buf : (float *)grad + r * width;  /* bf16: the row's gradient in buf, then rounded */
            int64_t i = 0;
#ifdef __AVX512F__
            __m512 lv = _mm512_set1_ps(l), gv = _mm512_set1_ps(g), sv = _mm512_set1_ps(smooth);
            for (; i + 16 <= width; i += 16) {
                __m512 p = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(xr + i), lv));
                _mm512_storeu_ps(out + i, _mm512_sub_ps(_mm512_mul_ps(p, gv), sv));
            }
#endif
            for (; i < width; ++i) out[i] = exp_nonpositive(xr[i] - l) * g - smooth;
            out[target[r]] -= (1.0f - eps) * g;
            if (bf16) {
                uint16_t *h = (uint16_t *)grad + r * width;
                for (i = 0; i < width; ++i) h[i] = float_to_bf16(out[i]);
            }
        }
        free(buf);
    }
    return failed ? NMT_NO_MEMORY : NMT_DONE;
}
