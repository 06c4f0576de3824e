/* Layer normalization (Ba, Kiros and Hinton 2016) of float32 rows whose output goes straight to a bf16 product:
   the output is written in bf16 and the gradient read in bf16 (or float32), so the float32 output and its cast,
   and the cast of the gradient back, are never made (nmt/training/native_norm.py calls it through
   nmt/engine/native.py, which checks what it passes).

     forward   mean_r = sum_i x_ri / H,   rstd_r = 1 / sqrt(sum_i (x_ri - mean_r)^2 / H + eps)
               y_ri   = bf16((x_ri - mean_r) * rstd_r * w_i + b_i)
     backward  xhat_ri = (x_ri - mean_r) * rstd_r,   g_ri = dy_ri * w_i
               dx_ri   = rstd_r * (g_ri - sum_j g_rj / H - xhat_ri * sum_j g_rj xhat_rj / H)
               dw_i    = sum_r dy_ri xhat_ri,   db_i = sum_r dy_ri

   This is torch's layer_norm in float32 (two passes for the variance, as its CPU kernel's result), rounded to
   bf16 once at the end: the values torch's layer_norm followed by a cast give, to within float32 rounding of the
   sums. Rows are shared among torch's OpenMP threads; dw and db are summed per block of ROWS rows into `partial`
   (blocks, 2, H) and the blocks then added in order, so any thread count gives the same bits. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define LANES 16 /* independent partial sums per row: a vector's width of float32, without reordering by the compiler */
#define ROWS 64  /* rows per block of dw / db partial sums */

static inline float row_sum(const float *v, int64_t width) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= width; i += LANES)
        for (int l = 0; l < LANES; ++l) acc[l] += v[i + l];
    float s = 0.0f;
    for (int l = 0; l < LANES; ++l) s += acc[l];
    for (; i < width; ++i) s += v[i];
    return s;
}

static inline float row_sum_sq(const float *v, float mean, int64_t width) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= width; i += LANES)
        for (int l = 0; l < LANES; ++l) {
            float d = v[i + l] - mean;
            acc[l] += d * d;
        }
    float s = 0.0f;
    for (int l = 0; l < LANES; ++l) s += acc[l];
    for (; i < width; ++i) s += (v[i] - mean) * (v[i] - mean);
    return s;
}

int layer_norm_bf16_forward(const float *x, int64_t rows, int64_t width, const float *w, const float *b, float eps,
                            uint16_t *y, float *mean, float *rstd) {
    if (rows < 0 || width < 1 || !(eps >= 0.0f)) return NMT_OUT_OF_BOUNDS;
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 15))
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * width;
        const float m = row_sum(xr, width) / (float)width;
        const float s = 1.0f / sqrtf(row_sum_sq(xr, m, width) / (float)width + eps);
        uint16_t *yr = y + r * width;
        for (int64_t i = 0; i < width; ++i) yr[i] = float_to_bf16((xr[i] - m) * s * w[i] + b[i]);
        mean[r] = m;
        rstd[r] = s;
    }
    return NMT_DONE;
}

/* one row's dy as float32 into out */
static inline void widen(const void *dy, int bf16, int64_t offset, int64_t width, float *restrict out) {
    if (bf16) {
        const uint16_t *restrict d = (const uint16_t *)dy + offset;
        for (int64_t k = 0; k < width; ++k) out[k] = bf16_to_float(d[k]);
    } else {
        memcpy(out, (const float *)dy + offset, (size_t)width * sizeof(float));
    }
}

int layer_norm_bf16_backward(const float *x, const void *dy, int bf16, int64_t rows, int64_t width, const float *w,
                             const float *mean, const float *rstd, float *dx, float *partial, float *dw, float *db) {
    if (rows < 0 || width < 1) return NMT_OUT_OF_BOUNDS;
    const int64_t blocks = (rows + ROWS - 1) / ROWS;
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 15))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        float *restrict pw = partial + blk * 2 * width;
        float *restrict pb = pw + width;
        memset(pw, 0, (size_t)(2 * width) * sizeof(float));
        const int64_t end = (blk + 1) * ROWS < rows ? (blk + 1) * ROWS : rows;
        for (int64_t r = blk * ROWS; r < end; ++r) {
            const float *restrict xr = x + r * width;
            float *restrict dxr = dx + r * width; /* holds dy, then g = dy * w, before dx overwrites it */
            const float m = mean[r], s = rstd[r];
            widen(dy, bf16, r * width, width, dxr);
            for (int64_t k = 0; k < width; ++k) {
                const float d = dxr[k];
                pw[k] += d * ((xr[k] - m) * s);
                pb[k] += d;
                dxr[k] = d * w[k];
            }
            float ga[LANES] = {0}, gx[LANES] = {0};
            int64_t i = 0;
            for (; i + LANES <= width; i += LANES)
                for (int l = 0; l < LANES; ++l) {
                    const float g = dxr[i + l];
                    ga[l] += g;
                    gx[l] += g * ((xr[i + l] - m) * s);
                }
            float sg = 0.0f, sgx = 0.0f;
            for (int l = 0; l < LANES; ++l) {
                sg += ga[l];
                sgx += gx[l];
            }
            for (; i < width; ++i) {
                sg += dxr[i];
                sgx += dxr[i] * ((xr[i] - m) * s);
            }
            const float mg = sg / (float)width, mgx = sgx / (float)width;
            for (int64_t k = 0; k < width; ++k) dxr[k] = s * (dxr[k] - mg - ((xr[k] - m) * s) * mgx);
        }
    }
    memset(dw, 0, (size_t)width * sizeof(float));
    memset(db, 0, (size_t)width * sizeof(float));
    for (int64_t blk = 0; blk < blocks; ++blk) /* in block order, whatever thread made each */
        for (int64_t k = 0; k < width; ++k) {
            dw[k] += partial[blk * 2 * width + k];
            db[k] += partial[blk * 2 * width + width + k];
        }
    return NMT_DONE;
}
