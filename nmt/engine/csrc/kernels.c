/* nmt's decoding kernels: see kernels.h for what Python calls, and nmt/engine/native.py for how they are built,
   checked and called. */
#include <math.h>
#include <stdlib.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "vmath.h"

/* max |x_i| over a row, in 16 lanes so that it vectorizes (max is exact in any order). */
static float row_amax(const float *x, int64_t width) {
    float lane[16] = {0.0f};
    int64_t i = 0;
    for (; i + 16 <= width; i += 16)
        for (int k = 0; k < 16; ++k) {
            float a = fabsf(x[i + k]);
            lane[k] = a > lane[k] ? a : lane[k];
        }
    float amax = 0.0f;
    for (int k = 0; k < 16; ++k) amax = lane[k] > amax ? lane[k] : amax;
    for (; i < width; ++i) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

#if defined(__AVX512F__) && (defined(__AVX512VNNI__) || (defined(__AMX_INT8__) && defined(__AMX_TILE__)))
/* (only the VNNI and AMX products use it) */
/* Rows of x (R, I) quantized as by quantize_rows into q (padded, I) bytes, plus `shift` (0: int8 as it is; 128:
   the unsigned q + 128 that vpdpbusd takes), their scales into rs; rows past R are the zero row (q = shift,
   scale 0). */
static void quantize_padded(const float *x, int64_t rows, int64_t padded, int64_t in, uint8_t *q, float *rs,
                            int32_t shift) {
    for (int64_t r = 0; r < padded; ++r) {
        uint8_t *qr = q + r * in;
        if (r >= rows) {
            for (int64_t i = 0; i < in; ++i) qr[i] = (uint8_t)shift;
            rs[r] = 0.0f;
            continue;
        }
        const float *xr = x + r * in;
        float amax = row_amax(xr, in);
        float sc = (amax > 1e-12f ? amax : 1e-12f) / 127.0f;
        rs[r] = sc;
        for (int64_t i = 0; i < in; ++i) qr[i] = (uint8_t)((int32_t)nearbyintf(xr[i] / sc) + shift);
    }
}
#endif

static inline float dot(const float *a, const float *b, int64_t dim) {
    float lane[16] = {0.0f};
    int64_t d = 0;
    for (; d + 16 <= dim; d += 16)
        for (int k = 0; k < 16; ++k) lane[k] += a[d + k] * b[d + k];
    float sum = 0.0f;
    for (; d < dim; ++d) sum += a[d] * b[d];
    for (int k = 0; k < 16; ++k) sum += lane[k];
    return sum;
}

#ifdef __AVX512F__
/* Lane i of the result: the sum of the 16 lanes of a[i] (16 keys' partial products at once, 45 shuffles and adds
   where one horizontal sum per key takes 8). */
static inline __m512 sum16(__m512 *a) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; ++i)  /* per 128-bit chunk: (x0+x2, y0+y2, x1+x3, y1+y3) */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {  /* per chunk: one partial sum of each of 4 keys */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 g = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 h = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(g, h, 0x88), _mm512_shuffle_f32x4(g, h, 0xDD));
}
#endif

/* Attention of one query per (row, head) over `len` keys: q (r, n, :) at q + r * q_stride + n * dim; the keys and
   values of row r are those of kv-row b = r / group, (b, n, j, :) at k + b * kv_stride + n * head_stride + j * ks;
   bias (b, j) at bias + b * bias_stride is added to the scores (0 or -inf) where given. out (R, N * dim) contiguous
   gets softmax(scale * q.k_j + bias_j) . v_j; weights (R, N, len), where given, the softmax. With AVX-512 and dim a
   multiple of 16 up to 256 everything runs on 16-float vectors, the scores 16 keys at a time; elsewhere in plain
   loops. */
#ifdef __AVX512F__
/* attend_head's vector body for dim = 16 * blocks; always inlined with a constant `blocks`, so that its
   accumulators stay in registers (with a variable count GCC keeps them on the stack). */
static inline __attribute__((always_inline)) void attend_head16(const float *qv, const float *kb, const float *vb,
                                                                const int64_t blocks, int64_t len, int64_t ks,
                                                                const int64_t *slots, int64_t slot_stride,
                                                                const float *bias, float scale, float *s, float *o) {
    {
        __m512 top = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
        for (int64_t j0 = 0; j0 < len; j0 += 16) {
            int64_t n = len - j0 < 16 ? len - j0 : 16;
            __mmask16 live = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            __m512 acc[16];
            for (int64_t i = 0; i < 16; ++i) {  /* past the last key, the last again (its lanes masked below) */
                int64_t j = j0 + (i < n ? i : n - 1);
                const float *kj = kb + (slots ? slots[j] * slot_stride : 0) + j * ks;
                __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qv), _mm512_loadu_ps(kj));
                for (int64_t c = 1; c < blocks; ++c)
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * c), _mm512_loadu_ps(kj + 16 * c), a);
                acc[i] = a;
            }
            __m512 x = _mm512_mul_ps(sum16(acc), sc);
            if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(live, bias + j0));
            x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, x);
            top = _mm512_max_ps(top, x);
            _mm512_mask_storeu_ps(s + j0, live, x);
        }
        float m = _mm512_reduce_max_ps(top);
        __m512 mv = _mm512_set1_ps(m == -INFINITY ? 0.0f : m), total = _mm512_setzero_ps();
        for (int64_t j0 = 0; j0 < len; j0 += 16) {
            int64_t n = len - j0 < 16 ? len - j0 : 16;
            __mmask16 live = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + j0), mv));
            e = _mm512_maskz_mov_ps(live, e);
            total = _mm512_add_ps(total, e);
            _mm512_mask_storeu_ps(s + j0, live, e);
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
        for (int64_t j0 = 0; j0 < len; j0 += 16) {
            int64_t n = len - j0 < 16 ? len - j0 : 16;
            __mmask16 live = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            _mm512_mask_storeu_ps(s + j0, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, s + j0), inv));
        }
        __m512 even[16], odd[16];  /* two sets of sums: half the chain of dependent adds */
        for (int64_t c = 0; c < blocks; ++c) even[c] = odd[c] = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 2 <= len; j += 2) {
            __m512 w0 = _mm512_set1_ps(s[j]), w1 = _mm512_set1_ps(s[j + 1]);
            const float *v0 = vb + (slots ? slots[j] * slot_stride : 0) + j * ks;
            const float *v1 = vb + (slots ? slots[j + 1] * slot_stride : 0) + (j + 1) * ks;
            for (int64_t c = 0; c < blocks; ++c) {
                even[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 16 * c), even[c]);
                odd[c] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v1 + 16 * c), odd[c]);
            }
        }
        if (j < len) {
            __m512 w0 = _mm512_set1_ps(s[j]);
            const float *v0 = vb + (slots ? slots[j] * slot_stride : 0) + j * ks;
            for (int64_t c = 0; c < blocks; ++c) even[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v0 + 16 * c), even[c]);
        }
        for (int64_t c = 0; c < blocks; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_add_ps(even[c], odd[c]));
    }
}
#endif

static void attend_head(const float *qv, const float *kb, const float *vb, int64_t dim, int64_t len, int64_t ks,
                        const int64_t *slots, int64_t slot_stride, const float *bias, float scale, float *s, float *o) {
#ifdef __AVX512F__
    switch (dim) {
    case 64: attend_head16(qv, kb, vb, 4, len, ks, slots, slot_stride, bias, scale, s, o); return;
    case 32: attend_head16(qv, kb, vb, 2, len, ks, slots, slot_stride, bias, scale, s, o); return;
    case 128: attend_head16(qv, kb, vb, 8, len, ks, slots, slot_stride, bias, scale, s, o); return;
    case 16: attend_head16(qv, kb, vb, 1, len, ks, slots, slot_stride, bias, scale, s, o); return;
    default:
        if (dim % 16 == 0 && dim <= 256) {
            attend_head16(qv, kb, vb, dim / 16, len, ks, slots, slot_stride, bias, scale, s, o);
            return;
        }
    }
#endif
    float m = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
        float x = dot(qv, kb + (slots ? slots[j] * slot_stride : 0) + j * ks, dim) * scale;
        if (bias) x += bias[j];
        s[j] = x;
        m = x > m ? x : m;
    }
    if (m == -INFINITY) m = 0.0f;
    float total = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
        s[j] = exp_nonpositive(s[j] - m);
        total += s[j];
    }
    float inv = 1.0f / total;
    for (int64_t j = 0; j < len; ++j) s[j] *= inv;
    for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
        const float *vj = vb + (slots ? slots[j] * slot_stride : 0) + j * ks;
        for (int64_t d = 0; d < dim; ++d) o[d] += s[j] * vj[d];
    }
}

int attend(const float *q, int64_t rows, int64_t heads, int64_t dim, int64_t q_stride, int64_t group,
            const float *k, const float *v, int64_t kv_stride, int64_t head_stride, int64_t key_stride, int64_t len,
            const float *bias, int64_t bias_stride, float scale, float *out, float *weights, const int64_t *kv_slots) {
    /* the (row, head) pairs shared among torch's threads where there is enough work (each computed as by one);
       with kv_slots, kv-row b's keys and values are those at index kv_slots[b] (bias stays at b) */
    int failed = 0;
#pragma omp parallel if (rows * heads * len * dim >= (1 << 18))
    {
        /* one score row per thread, on the heap (its length is the caller's: never a stack array) */
        float *scratch = weights ? 0 : (float *)malloc((size_t)(len > 0 ? len : 1) * sizeof(float));
        if (!weights && !scratch) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; ++r) {
                int64_t b = r / group, kb = kv_slots ? kv_slots[b] : b;
                for (int64_t n = 0; n < heads; ++n) {
                    float *s = weights ? weights + (r * heads + n) * len : scratch;
                    attend_head(q + r * q_stride + n * dim, k + kb * kv_stride + n * head_stride,
                                v + kb * kv_stride + n * head_stride, dim, len, key_stride, 0, 0,
                                bias ? bias + b * bias_stride : 0, scale, s, out + (r * heads + n) * dim);
                }
            }
        }
        free(scratch);
    }
    return failed ? NMT_NO_MEMORY : NMT_DONE;
}

/* A decoder step's self-attention: qkv (R, 3, N, dim) rows of the fused projection (q_stride apart); its key and
   value are written at position t of slot r of the caches (slots, N, room, dim) (row_stride, head_stride apart),
   then its query attends over positions 0..t: position j of slot anc[r * anc_stride + j] (the row's ancestor at
   step j: the caches are never reordered, see TransformerDecoder.step), or of slot r where anc is NULL. */
int self_attend(const float *qkv, int64_t rows, int64_t heads, int64_t dim, int64_t q_stride, float *k, float *v,
                 int64_t row_stride, int64_t head_stride, int64_t t, float scale, float *out, const int64_t *anc,
                 int64_t anc_stride) {
    int64_t width = heads * dim;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < heads; ++n) {
            const float *src = qkv + r * q_stride + n * dim;
            float *kd = k + r * row_stride + n * head_stride + t * dim;
            float *vd = v + r * row_stride + n * head_stride + t * dim;
            for (int64_t d = 0; d < dim; ++d) {
                kd[d] = src[width + d];
                vd[d] = src[2 * width + d];
            }
        }
    int failed = 0;
#pragma omp parallel if (rows * heads * (t + 1) * dim >= (1 << 18))
    {
        float *scratch = (float *)malloc((size_t)(t + 1) * sizeof(float)); /* one score row per thread */
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t *slots = anc ? anc + r * anc_stride : 0;
                int64_t base = anc ? 0 : r * row_stride;
                for (int64_t n = 0; n < heads; ++n)
                    attend_head(qkv + r * q_stride + n * dim, k + base + n * head_stride,
                                v + base + n * head_stride, dim, t + 1, dim, slots, row_stride, 0, scale, scratch,
                                out + (r * heads + n) * dim);
            }
        }
        free(scratch);
    }
    return failed ? NMT_NO_MEMORY : NMT_DONE;
}

/* q (R, I) int8 and scale (R,) of x (R, I) fp32, as torch's
   s = max(amax(|x_r|), 1e-12) / 127;  q = round(x / s)  (round half to even; |x / s| <= 127 so no clamp). */
void quantize_rows(const float *x, int64_t rows, int64_t width, int8_t *q, float *scale) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * width;
        int8_t *qr = q + r * width;
        float amax = row_amax(xr, width);
        float s = (amax > 1e-12f ? amax : 1e-12f) / 127.0f;
        scale[r] = s;
        for (int64_t i = 0; i < width; ++i) qr[i] = (int8_t)nearbyintf(xr[i] / s);
    }
}

/* The int8 products' portable reference: set by nmt_int8_reference (NMT_INT8_REFERENCE=1 at load, for the tests),
   the int8 kernels of a build without VNNI (vnni_linear, layer_step, encoder_forward, decoder_step) run through
   qlinear_ref instead of returning 0, so that a CPU without VNNI still tests everything around the product:
   the packing, the column sums, the scaling, the layers' and the step's int8 paths. Off by default: in scalar C
   it is slower than torch's int8 path, which a build without VNNI uses. */
static int int8_reference = 0;

int nmt_int8_reference(int on) {
    int before = int8_reference;
    int8_reference = on != 0;
    return before;
}

#if !(defined(__AVX512VNNI__) && defined(__AVX512F__))  /* (a VNNI build has qlinear itself) */
/* qlinear's arithmetic one output at a time, in portable C: each row quantized as by quantize_rows (shifted to
   q + 128 as vpdpbusd reads it), its int32 sums with the packed weights less 128 * colsum (exact), then the float
   operations of qstore in its order, so y equals qlinear's (and quantize_rows + torch._int_mm + dequantize) bit for
   bit. Returns NMT_DONE; NMT_NO_MEMORY (y all NaN, so that no caller reads it as a result) when a row of more
   than 4,096 inputs finds no memory for its buffer. */
static int qlinear_ref(const float *x, int64_t rows, int64_t in, int64_t out, const int8_t *packed,
                       const int32_t *colsum, const float *col_scale, const float *bias, float *y, int relu,
                       const float *residual) {
    int32_t row[4096];
    int32_t *q = in <= 4096 ? row : (int32_t *)malloc((size_t)in * sizeof(int32_t));
    if (!q) {
        for (int64_t i = 0; i < rows * out; ++i) y[i] = NAN;
        return NMT_NO_MEMORY;
    }
    int64_t groups = in / 4;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * in;
        float amax = row_amax(xr, in);
        float sc = (amax > 1e-12f ? amax : 1e-12f) / 127.0f;
        for (int64_t i = 0; i < in; ++i) q[i] = (int32_t)nearbyintf(xr[i] / sc) + 128;
        for (int64_t o = 0; o < out; ++o) {
            const int8_t *w = packed + (o / 16) * groups * 64 + (o % 16) * 4;  /* [o / 16][i / 4][o % 16][i % 4] */
            int32_t sum = 0;
            for (int64_t i = 0; i < in; ++i) sum += q[i] * (int32_t)w[(i / 4) * 64 + i % 4];
            float v = (float)(sum - colsum[o] * 128);
            v = v * sc;
            v = v * col_scale[o];
            if (bias) v = v + bias[o];
            if (relu) v = v > 0.0f ? v : 0.0f;
            if (residual) v = residual[r * out + o] + v;
            y[r * out + o] = v;
        }
    }
    if (q != row) free(q);
    return NMT_DONE;
}
#endif

/* The whole of Int8Linear for a few rows with AVX-512 VNNI: each row of x (R, I) quantized as by quantize_rows (to
   q + 128, an unsigned byte, which vpdpbusd takes), multiplied by the packed int8 weight, the product corrected by
   128 * colsum (exact: int32 arithmetic), and scaled as by dequantize (the same float operations in the same order),
   so y equals quantize_rows + torch._int_mm + dequantize bit for bit. packed: (O / 16, I / 4, 16, 4) int8 (output
   unit o, input i at [o / 16][i / 4][o % 16][i % 4]); colsum (O,) int32 the weight's column sums. Needs I % 4 == 0,
   O % 64 == 0 and I <= 4096; returns 0 (doing nothing) where this build has no VNNI and the int8 reference is off,
   else 1 (NMT_DONE; the reference: NMT_NO_MEMORY when it found no memory). */
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512F__)
#include <sys/syscall.h>
#include <unistd.h>
/* Whether this process may use AMX tiles (Linux asks each process to request them once). */
static int amx_allowed(void) {
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* qlinear on AMX: the rows quantized to int8 (as quantize_rows) in blocks of 16, each block times two 16-unit
   output blocks of the packed weight per tile product (signed x signed int8, exact int32), then scaled as by
   dequantize. Needs in % 64 == 0 and out % 32 == 0. */
static void amx_qlinear(const float *x, int64_t rows, int64_t in, int64_t out, const int8_t *packed,
                        const float *col_scale, const float *bias, float *y, int relu, const float *residual) {
    int64_t blocks = (rows + 15) / 16, groups = in / 4;
    int8_t small[32 * 1024] __attribute__((aligned(64)));
    int8_t *q = blocks * 16 * in <= (int64_t)sizeof small ? small : (int8_t *)aligned_alloc(64, blocks * 16 * in);
    float rs_small[32];
    float *rs = blocks * 16 <= 32 ? rs_small : (float *)malloc(blocks * 16 * sizeof(float));
    quantize_padded(x, rows, blocks * 16, in, (uint8_t *)q, rs, 0);
    TileConfig cfg = {0};
    cfg.palette = 1;
    for (int t = 0; t < 5; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
    _tile_loadconfig(&cfg);
    int32_t c[2][16][16] __attribute__((aligned(64)));
    for (int64_t ob = 0; ob < out / 16; ob += 2) {
        const int8_t *w0 = packed + ob * groups * 64, *w1 = w0 + groups * 64;
        __m512 cs[2], bs[2];
        for (int j = 0; j < 2; ++j) {
            cs[j] = _mm512_loadu_ps(col_scale + (ob + j) * 16);
            bs[j] = bias ? _mm512_loadu_ps(bias + (ob + j) * 16) : _mm512_setzero_ps();
        }
        for (int64_t m = 0; m < blocks; ++m) {
            _tile_zero(0);
            _tile_zero(1);
            const int8_t *a = q + m * 16 * in;
            for (int64_t k = 0; k < in / 64; ++k) {
                _tile_loadd(2, a + k * 64, in);
                _tile_loadd(3, w0 + k * 16 * 64, 64);
                _tile_loadd(4, w1 + k * 16 * 64, 64);
                _tile_dpbssd(0, 2, 3);
                _tile_dpbssd(1, 2, 4);
            }
            _tile_stored(0, c[0], 64);
            _tile_stored(1, c[1], 64);
            int64_t rb = rows - m * 16 < 16 ? rows - m * 16 : 16;
            for (int64_t r = 0; r < rb; ++r) {
                int64_t row = m * 16 + r;
                for (int j = 0; j < 2; ++j) {
                    int64_t o = (ob + j) * 16;
                    __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)c[j][r]));
                    v = _mm512_mul_ps(v, _mm512_set1_ps(rs[row]));
                    v = _mm512_mul_ps(v, cs[j]);
                    if (bias) v = _mm512_add_ps(v, bs[j]);
                    if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
                    if (residual) v = _mm512_add_ps(_mm512_loadu_ps(residual + row * out + o), v);
                    _mm512_storeu_ps(y + row * out + o, v);
                }
            }
        }
    }
    _tile_release();
    if (q != small) free(q);
    if (rs != rs_small) free(rs);
}
#define HAVE_AMX 1
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
/* The int32 sums of 6 quantized rows (q0 on, `in` bytes apart) by 64 output units (weights at w0, qlinear's
   packing) into tile (6, 64): 24 accumulators, each a named variable (an array of them the compiler spills to
   the stack at every step: 0.5x the speed). */
static void qsums6(const uint8_t *q0, int64_t in, const int8_t *w0, int32_t *tile) {
    int64_t groups = in / 4;
    const int8_t *w1 = w0 + groups * 64, *w2 = w1 + groups * 64, *w3 = w2 + groups * 64;
    const uint8_t *x0 = q0, *x1 = q0 + in, *x2 = q0 + 2 * in, *x3 = q0 + 3 * in, *x4 = q0 + 4 * in,
                  *x5 = q0 + 5 * in;
#define QZ(r) __m512i a##r##0 = _mm512_setzero_si512(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0;
    QZ(0) QZ(1) QZ(2) QZ(3) QZ(4) QZ(5)
    for (int64_t g = 0; g < groups; ++g) {
        __m512i v0 = _mm512_loadu_si512((const void *)(w0 + g * 64));
        __m512i v1 = _mm512_loadu_si512((const void *)(w1 + g * 64));
        __m512i v2 = _mm512_loadu_si512((const void *)(w2 + g * 64));
        __m512i v3 = _mm512_loadu_si512((const void *)(w3 + g * 64));
#define QR(r)                                                    \
    {                                                            \
        int32_t four;                                            \
        __builtin_memcpy(&four, x##r + 4 * g, 4);                \
        __m512i b = _mm512_set1_epi32(four);                     \
        a##r##0 = _mm512_dpbusd_epi32(a##r##0, b, v0);           \
        a##r##1 = _mm512_dpbusd_epi32(a##r##1, b, v1);           \
        a##r##2 = _mm512_dpbusd_epi32(a##r##2, b, v2);           \
        a##r##3 = _mm512_dpbusd_epi32(a##r##3, b, v3);           \
    }
        QR(0) QR(1) QR(2) QR(3) QR(4) QR(5)
    }
#define QS(r)                                                              \
    _mm512_store_si512((void *)(tile + r * 64), a##r##0);                  \
    _mm512_store_si512((void *)(tile + r * 64 + 16), a##r##1);             \
    _mm512_store_si512((void *)(tile + r * 64 + 32), a##r##2);             \
    _mm512_store_si512((void *)(tile + r * 64 + 48), a##r##3);
    QS(0) QS(1) QS(2) QS(3) QS(4) QS(5)
#undef QZ
#undef QR
#undef QS
}

/* y[at..at + 16) = 16 int32 sums (q + 128 times the weights) scaled as by dequantize: the 128 * column sums (comp)
   taken off, times the row's and the columns' scales, plus the bias (if any); then relu, residual as qlinear. */
static inline void qstore(__m512i sums, __m512i comp, float row_scale, __m512 col_scale, const __m512 *bias,
                          int relu, const float *residual, int64_t at, float *y) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, comp));
    v = _mm512_mul_ps(v, _mm512_set1_ps(row_scale));
    v = _mm512_mul_ps(v, col_scale);
    if (bias) v = _mm512_add_ps(v, *bias);
    if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
    if (residual) v = _mm512_add_ps(_mm512_loadu_ps(residual + at), v);
    _mm512_storeu_ps(y + at, v);
}

/* vnni_linear's work; relu: max(y, 0); residual (may be y itself): y = residual + that. */
static void qlinear(const float *x, int64_t rows, int64_t in, int64_t out, const int8_t *packed,
                    const int32_t *colsum, const float *col_scale, const float *bias, float *y, int relu,
                    const float *residual) {
#ifdef HAVE_AMX
    if (in % 64 == 0 && out % 32 == 0 && amx_allowed()) {
        amx_qlinear(x, rows, in, out, packed, col_scale, bias, y, relu, residual);
        return;
    }
#endif
    /* every row quantized first (q + 128 in a buffer padded for whole 4-row blocks after the 6-row ones), then
       each block of 64 output units against all rows, so that its weights (in * 64 bytes) are read from memory
       once: 6 rows at a time (qsums6: measured 1.35x 4 rows at a time on Zen 4), the last 0-5 in blocks of 4 */
    int64_t blocks = (rows + 6) / 4, groups = in / 4;
    uint8_t small[16 * 4096] __attribute__((aligned(64)));
    uint8_t *qu = blocks * 4 * in <= (int64_t)sizeof small ? small : (uint8_t *)malloc(blocks * 4 * in);
    float rs_small[16];
    float *rs = blocks * 4 <= 16 ? rs_small : (float *)malloc(blocks * 4 * sizeof(float));
    quantize_padded(x, rows, blocks * 4, in, qu, rs, 128);
    /* the output blocks shared among torch's threads where the product is large enough (as f32linear) */
#pragma omp parallel for schedule(static) if (rows * in * out >= (1 << 20))
    for (int64_t ob = 0; ob < out / 16; ob += 4) {
        const int8_t *w0 = packed + ob * groups * 64;
        __m512i comp[4];
        __m512 cs[4], bs[4];
        for (int j = 0; j < 4; ++j) {
            int64_t o = (ob + j) * 16;
            comp[j] = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(colsum + o)), 7);
            cs[j] = _mm512_loadu_ps(col_scale + o);
            bs[j] = bias ? _mm512_loadu_ps(bias + o) : _mm512_setzero_ps();
        }
        int64_t r0 = 0;
        int32_t tile[6 * 64] __attribute__((aligned(64)));
        for (; r0 + 6 <= rows; r0 += 6) {
            qsums6(qu + r0 * in, in, w0, tile);
            for (int j = 0; j < 4; ++j) {
                int64_t o = (ob + j) * 16;
                for (int64_t r = 0; r < 6; ++r) {
                    __m512i sums = _mm512_load_si512((const void *)(tile + r * 64 + j * 16));
                    qstore(sums, comp[j], rs[r0 + r], cs[j], bias ? &bs[j] : 0, relu, residual, (r0 + r) * out + o,
                           y);
                }
            }
        }
        for (; r0 < rows; r0 += 4) {
            int64_t rb = rows - r0 < 4 ? rows - r0 : 4;
            const uint8_t *q0 = qu + r0 * in;
            __m512i acc[4][4];
            for (int r = 0; r < 4; ++r)
                for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
            for (int64_t g = 0; g < groups; ++g) {
                __m512i w[4];
                for (int j = 0; j < 4; ++j) w[j] = _mm512_loadu_si512((const void *)(w0 + (j * groups + g) * 64));
                for (int r = 0; r < 4; ++r) {
                    int32_t four;
                    __builtin_memcpy(&four, q0 + r * in + 4 * g, 4);
                    __m512i a = _mm512_set1_epi32(four);
                    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], a, w[j]);
                }
            }
            for (int j = 0; j < 4; ++j) {
                int64_t o = (ob + j) * 16;
                for (int64_t r = 0; r < rb; ++r)
                    qstore(acc[r][j], comp[j], rs[r0 + r], cs[j], bias ? &bs[j] : 0, relu, residual,
                           (r0 + r) * out + o, y);
            }
        }
    }
    if (qu != small) free(qu);
    if (rs != rs_small) free(rs);
}
#endif

/* Whether qlinear runs on AMX here (built with it, and the process allowed to use it). */
int has_amx(void) {
#ifdef HAVE_AMX
    return amx_allowed();
#else
    return 0;
#endif
}

int vnni_linear(const float *x, int64_t rows, int64_t in, int64_t out, const int8_t *packed, const int32_t *colsum,
                const float *col_scale, const float *bias, float *y) {
    if (in % 4 || out % 64 || in > 4096) return 0;
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    qlinear(x, rows, in, out, packed, colsum, col_scale, bias, y, 0, 0);
    return 1;
#else
    if (!int8_reference) return 0;
    return qlinear_ref(x, rows, in, out, packed, colsum, col_scale, bias, y, 0, 0);
#endif
}

#ifdef __AVX512F__
/* One block of f32linear: `mr` rows (r0 on) by 64 outputs (block ob on); mr a constant where it is inlined. */
static inline __attribute__((always_inline)) void f32block(int mr, const float *x, int64_t r0, int64_t in,
                                                           int64_t out, const float *w0, int64_t ob, const __m512 *bs,
                                                           float *y, int relu, const float *residual) {
    enum { NR = 4 };
    __m512 acc[6][NR];
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
    const float *xr = x + r0 * in;
    for (int64_t k = 0; k < in; ++k) {
        __m512 w[NR];
        for (int j = 0; j < NR; ++j) w[j] = _mm512_loadu_ps(w0 + (j * in + k) * 16);
        for (int r = 0; r < mr; ++r) {
            __m512 a = _mm512_set1_ps(xr[r * in + k]);
            for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_fmadd_ps(a, w[j], acc[r][j]);
        }
    }
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < NR; ++j) {
            int64_t o = (ob + j) * 16, at = (r0 + r) * out + o;
            __m512 v = _mm512_add_ps(acc[r][j], bs[j]);
            if (relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
            if (residual) v = _mm512_add_ps(_mm512_loadu_ps(residual + at), v);
            _mm512_storeu_ps(y + at, v);
        }
}

/* fp32 y (R, O) = x (R, I) W^T + bias (relu: max(., 0); residual (may be y itself): y = residual + that) with
   AVX-512: packed (O / 16, I, 16) holds W^T in panels of 16 output units (`pack_f32`). Blocks of up to 6 rows by
   64 outputs (24 accumulators), each output's sum over i in order, one fused multiply-add per term: a row's
   result does not depend on the other rows. Needs O % 64 == 0. */
static void f32linear(const float *x, int64_t rows, int64_t in, int64_t out, const float *packed,
                      const float *bias, float *y, int relu, const float *residual) {
    /* the output blocks shared among torch's OpenMP threads (the library is linked to torch's own runtime) where
       the product is large enough to pay for it: every output is computed as by one thread, so the result is the
       same at any number of threads */
#pragma omp parallel for schedule(static) if (rows * in * out >= (1 << 20))
    for (int64_t ob = 0; ob < out / 16; ob += 4) {
        const float *w0 = packed + ob * in * 16;
        __m512 bs[4];
        for (int j = 0; j < 4; ++j) bs[j] = bias ? _mm512_loadu_ps(bias + (ob + j) * 16) : _mm512_setzero_ps();
        for (int64_t r0 = 0; r0 < rows; r0 += 6) {
            switch (rows - r0 < 6 ? rows - r0 : 6) {
                case 1: f32block(1, x, r0, in, out, w0, ob, bs, y, relu, residual); break;
                case 2: f32block(2, x, r0, in, out, w0, ob, bs, y, relu, residual); break;
                case 3: f32block(3, x, r0, in, out, w0, ob, bs, y, relu, residual); break;
                case 4: f32block(4, x, r0, in, out, w0, ob, bs, y, relu, residual); break;
                case 5: f32block(5, x, r0, in, out, w0, ob, bs, y, relu, residual); break;
                default: f32block(6, x, r0, in, out, w0, ob, bs, y, relu, residual);
            }
        }
    }
}
#endif

/* f32linear (no relu, no residual); returns 0 (doing nothing) where this build has no AVX-512 or O % 64. */
int fp32_linear(const float *x, int64_t rows, int64_t in, int64_t out, const float *packed, const float *bias,
                float *y) {
#ifdef __AVX512F__
    if (out % 64) return 0;
    f32linear(x, rows, in, out, packed, bias, y, 0, 0);
    return 1;
#else
    (void)x; (void)rows; (void)in; (void)out; (void)packed; (void)bias; (void)y;
    return 0;
#endif
}


/* nn.LayerNorm of each row of x (R, H) into y: (x - mean) / sqrt(var + eps) * w + b, the biased variance. */
static void layer_norm(const float *x, int64_t rows, int64_t dim, const float *w, const float *b, float eps, float *y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float sum = 0.0f, sq = 0.0f;
        int64_t i0 = 0;
#ifdef __AVX512F__
        /* both sums in 16 lanes (a sequential sum waits on every add: 3-7% of a decoding step measured) */
        __m512 lanes = _mm512_setzero_ps();
        for (; i0 + 16 <= dim; i0 += 16) lanes = _mm512_add_ps(lanes, _mm512_loadu_ps(xr + i0));
        sum = _mm512_reduce_add_ps(lanes);
#endif
        for (int64_t i = i0; i < dim; ++i) sum += xr[i];
        float mean = sum / (float)dim;
        i0 = 0;
#ifdef __AVX512F__
        __m512 squares = _mm512_setzero_ps(), mv = _mm512_set1_ps(mean);
        for (; i0 + 16 <= dim; i0 += 16) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(xr + i0), mv);
            squares = _mm512_add_ps(squares, _mm512_mul_ps(d, d));
        }
        sq = _mm512_reduce_add_ps(squares);
#endif
        for (int64_t i = i0; i < dim; ++i) {
            float d = xr[i] - mean;
            sq += d * d;
        }
        float rstd = 1.0f / sqrtf(sq / (float)dim + eps);
        for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
    }
}


/* Linear `which` of a fused layer: y = x W^T + b (relu: max(., 0)); residual: y += that instead (tmp: scratch of
   R * out floats where the product needs one). */
typedef void (*LayerLinear)(const void *layer, int which, const float *x, int64_t rows, float *y, int relu,
                            int residual, float *tmp);

/* fp32: f32linear where the layer has no MKL function (compute NULL), else MKL's packed product, the bias as C
   and beta 1 (as PackedLinear). */
static void linear32(const void *layer, int which, const float *x, int64_t rows, float *y, int relu, int residual,
                     float *tmp) {
    const Layer32 *L = (const Layer32 *)layer;
    const Linear32 *l = &L->linear[which];
#ifdef __AVX512F__
    if (!L->compute) {  /* no MKL: the weights are pack_f32's */
        f32linear(x, rows, l->in, l->out, (const float *)l->packed, l->bias, y, relu, residual ? y : 0);
        return;
    }
#endif
    float *c = residual ? tmp : y;
    for (int64_t r = 0; r < rows; ++r) __builtin_memcpy(c + r * l->out, l->bias, l->out * sizeof(float));
    L->compute(101, 111, 151, rows, l->out, l->in, x, l->in, l->packed, l->in, 1.0f, c, l->out);
    int64_t n = rows * l->out;
    if (relu)
        for (int64_t i = 0; i < n; ++i) c[i] = c[i] > 0.0f ? c[i] : 0.0f;
    if (residual)
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] + c[i];
}

/* int8: qlinear (VNNI or AMX), the residual added in its last pass; without VNNI, the reference (only reached with
   int8_reference set: the callers return 0 otherwise). */
static void linear8(const void *layer, int which, const float *x, int64_t rows, float *y, int relu, int residual,
                    float *tmp) {
    (void)tmp;
    const Linear8 *l = &((const Layer8 *)layer)->linear[which];
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    qlinear(x, rows, l->in, l->out, l->packed, l->colsum, l->scale, l->bias, y, relu, residual ? y : 0);
#else
    qlinear_ref(x, rows, l->in, l->out, l->packed, l->colsum, l->scale, l->bias, y, relu, residual ? y : 0);
#endif
}

/* DecoderLayer.step_one in one call: x (R, H) updated in place; the caches and cross-attention as for
   self_attend / attend (cross keys (B, N, W, D) contiguous, bias (B, W)); weights (R, N, W) or NULL. scratch: at
   least R * (3H + max(3H, ffn)) floats. */
static int layer_body(const LayerHead *L, LayerLinear linear, const void *layer, float *x, int64_t rows,
                       float *keys, float *values, int64_t row_stride, int64_t head_stride, int64_t t,
                       const float *ck, const float *cv, int64_t width, const float *cbias, int64_t sentences,
                       float *weights, float *scratch, const int64_t *anc, int64_t anc_stride,
                       const int64_t *cslots) {
    int64_t H = L->dim, N = L->heads, D = L->head_dim, group = rows / sentences;
    float *h = scratch, *att = h + rows * H, *tmp = att + rows * H, *big = tmp + rows * H;
    for (int block = 0; block < 3; ++block) {
        const float *in = x;
        if (L->pre) {
            layer_norm(x, rows, H, L->norm_w[block], L->norm_b[block], L->eps[block], h);
            in = h;
        }
        if (block == 0) {
            linear(layer, 0, in, rows, big, 0, 0, tmp);
            if (self_attend(big, rows, N, D, 3 * H, keys, values, row_stride, head_stride, t, L->self_scale, att,
                            anc, anc_stride) != NMT_DONE)
                return NMT_NO_MEMORY;
            linear(layer, 1, att, rows, x, 0, 1, tmp);
        } else if (block == 1) {
            linear(layer, 2, in, rows, big, 0, 0, tmp);
            if (attend(big, rows, N, D, H, group, ck, cv, N * width * D, width * D, D, width, cbias, width,
                       L->cross_scale, att, weights, cslots) != NMT_DONE)
                return NMT_NO_MEMORY;
            linear(layer, 3, att, rows, x, 0, 1, tmp);
        } else {
            linear(layer, 4, in, rows, big, 1, 0, tmp);
            linear(layer, 5, big, rows, x, 0, 1, tmp);
        }
        if (!L->pre) layer_norm(x, rows, H, L->norm_w[block], L->norm_b[block], L->eps[block], x);
    }
    return NMT_DONE;
}

int layer_step32(const Layer32 *L, float *x, int64_t rows, float *keys, float *values, int64_t row_stride,
                  int64_t head_stride, int64_t t, const float *ck, const float *cv, int64_t width, const float *cbias,
                  int64_t sentences, float *weights, float *scratch, const int64_t *anc, int64_t anc_stride,
                  const int64_t *cslots) {
    return layer_body(&L->head, linear32, L, x, rows, keys, values, row_stride, head_stride, t, ck, cv, width,
                      cbias, sentences, weights, scratch, anc, anc_stride, cslots);
}

/* layer_body for an int8 decoding copy; returns 0 (doing nothing) where this build has no VNNI and the int8
   reference is off. */
int layer_step(const Layer8 *L, float *x, int64_t rows, float *keys, float *values, int64_t row_stride,
               int64_t head_stride, int64_t t, const float *ck, const float *cv, int64_t width, const float *cbias,
               int64_t sentences, float *weights, float *scratch, const int64_t *anc, int64_t anc_stride,
               const int64_t *cslots) {
#if !(defined(__AVX512VNNI__) && defined(__AVX512F__))
    if (!int8_reference) return 0;
#endif
    return layer_body(&L->head, linear8, L, x, rows, keys, values, row_stride, head_stride, t, ck, cv, width,
                      cbias, sentences, weights, scratch, anc, anc_stride, cslots);
}

/* Rows of a (R, width) matrix moved between the padded layout (row keep[i] of R) and the packed one (row i, the
   first n), in place: keep ascending, so keep[i] >= i and packing reads ahead of where it writes, unpacking (from
   the last row back) writes ahead of where it reads. Unpacking sets the padded rows to zero. */
static void pack_rows(float *m, int64_t width, const int64_t *keep, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (keep[i] != i) __builtin_memcpy(m + i * width, m + keep[i] * width, width * sizeof(float));
}

static void unpack_rows(float *m, int64_t width, const int64_t *keep, int64_t n, int64_t rows) {
    int64_t next = rows;  /* rows from here on are placed */
    for (int64_t i = n - 1; i >= 0; --i) {
        for (int64_t r = keep[i] + 1; r < next; ++r) __builtin_memset(m + r * width, 0, width * sizeof(float));
        if (keep[i] != i) __builtin_memcpy(m + keep[i] * width, m + i * width, width * sizeof(float));
        next = keep[i];
    }
    for (int64_t r = 0; r < next; ++r) __builtin_memset(m + r * width, 0, width * sizeof(float));
}

/* EncoderLayer.forward of a decoding copy on the n real positions of a padded batch: x (n, H) packed (row i is
   position keep[i] of the (B * L) padded rows), updated in place; bias (B, L) 0 where a key may be attended, -inf
   at padding; the layer's linears are linear[0] (qkv), [1] (out), [4] and [5] (feed-forward), its norms [0] and
   [2] (`encoder8`, `encoder32`). scratch as layer_body's for B * L rows. Every product, norm and residual reads
   and writes the n real rows only (padding's rows are never an output, and each row's numbers do not depend on
   the rows beside it); attention alone takes the padded layout, its keys and values at padding zero (masked by
   bias). keep NULL: no padding, n = B * L. */
static int encoder_body(const LayerHead *L, LayerLinear linear, const void *layer, float *x, int64_t n,
                         const int64_t *keep, int64_t sentences, int64_t length, const float *bias, float *scratch) {
    int64_t H = L->dim, N = L->heads, D = L->head_dim, rows = sentences * length;
    float *h = scratch, *att = h + rows * H, *tmp = att + rows * H, *big = tmp + rows * H;
    for (int block = 0; block < 3; block += 2) {
        const float *in = x;
        if (L->pre) {
            layer_norm(x, n, H, L->norm_w[block], L->norm_b[block], L->eps[block], h);
            in = h;
        }
        if (block == 0) {
            linear(layer, 0, in, n, big, 0, 0, tmp);  /* (n, 3H), then (B * L, 3H): each sentence's keys read in place */
            if (keep) unpack_rows(big, 3 * H, keep, n, rows);
            if (attend(big, rows, N, D, 3 * H, length, big + H, big + 2 * H, length * 3 * H, D, 3 * H, length,
                       bias, length, L->self_scale, att, 0, 0) != NMT_DONE)
                return NMT_NO_MEMORY;
            if (keep) pack_rows(att, H, keep, n);
            linear(layer, 1, att, n, x, 0, 1, tmp);
        } else {
            linear(layer, 4, in, n, big, 1, 0, tmp);
            linear(layer, 5, big, n, x, 0, 1, tmp);
        }
        if (!L->pre) layer_norm(x, n, H, L->norm_w[block], L->norm_b[block], L->eps[block], x);
    }
    return NMT_DONE;
}

/* Each row of x (R, H) = embed[tokens[r]] * scale + pe[r % length] (Embedding's order of operations); -1 for a
   token outside [0, vocab), else 0. */
static int embed_rows(const int64_t *tokens, int64_t rows, const float *embed, int64_t vocab, int64_t H, float scale,
                      const float *pe, int64_t length, float *x) {
    for (int64_t r = 0; r < rows; ++r)
        if (tokens[r] < 0 || tokens[r] >= vocab) return -1;
    for (int64_t r = 0; r < rows; ++r) {
        const float *e = embed + tokens[r] * H, *p = pe + (length ? r % length : 0) * H;
        float *xr = x + r * H;
        for (int64_t i = 0; i < H; ++i) xr[i] = e[i] * scale + p[i];  /* the product rounded, then the sum */
    }
    return 0;
}

/* TransformerEncoder.forward of a decoding copy in one call: tokens (B, L) -> x (B * L, H), embedded (pe: (L, H)),
   through the n layers (encoder_body; linear8's products where int8 is set), then the final norm (norm_w NULL:
   none). A batch's padding (bias -inf) is taken out of every layer's products: its positions' rows of x are
   zero. Returns 1; 0 where this build has no int8 kernel and the int8 reference is off (doing nothing); -1 for a
   token outside [0, vocab); NMT_NO_MEMORY. */
int encoder_forward(const void *const *layers, int64_t n, int int8, const int64_t *tokens, const float *embed,
                    int64_t vocab, float scale, const float *pe, float *x, int64_t sentences, int64_t length,
                    const float *bias, float *scratch, const float *norm_w, const float *norm_b, float norm_eps) {
    LayerLinear linear = linear32;
    if (int8) {
#if !(defined(__AVX512VNNI__) && defined(__AVX512F__))
        if (!int8_reference) return 0;
#endif
        linear = linear8;
    }
    const LayerHead *head = (const LayerHead *)layers[0];
    int64_t H = head->dim, rows = sentences * length, real = 0;
    if (embed_rows(tokens, rows, embed, vocab, H, scale, pe, length, x)) return -1;
    for (int64_t r = 0; r < rows; ++r) real += bias[r] > -INFINITY;
    int64_t *keep = 0;
    if (real < rows) {
        keep = (int64_t *)malloc((size_t)(real > 0 ? real : 1) * sizeof(int64_t));
        if (!keep) return NMT_NO_MEMORY;
        for (int64_t r = 0, i = 0; r < rows; ++r)
            if (bias[r] > -INFINITY) keep[i++] = r;
        pack_rows(x, H, keep, real);
    }
    int code = 1;
    for (int64_t l = 0; l < n && code == 1; ++l)
        if (encoder_body((const LayerHead *)layers[l], linear, layers[l], x, real, keep, sentences, length, bias,
                         scratch) != NMT_DONE)
            code = NMT_NO_MEMORY;
    if (code == 1 && norm_w) layer_norm(x, real, H, norm_w, norm_b, norm_eps, x);
    if (keep) {
        if (code == 1) unpack_rows(x, H, keep, real, rows);
        free(keep);
    }
    return code;
}

/* TransformerDecoder.prefill of one position per row with every layer in one call (`decoder_step`): x (R, H) = each
   token's embedding row times `scale` plus the position's encoding pe (H,), then each of the n layers (layer_body;
   linear8's products where int8 is set, else linear32's), then the final norm (norm_w NULL: none), in place. The
   caches and cross-attention keys/values: one pointer per layer, the rest as layer_step; the last layer's cross
   weights go to weights (R, N, W) and their mean over heads to attn (R, S), S <= W. Returns 1; 0 where this build
   has no int8 kernel and the int8 reference is off (doing nothing); -1 for a token outside [0, vocab). */
int decoder_step(const void *const *layers, int64_t n, int int8, const int64_t *tokens, const float *embed,
                 int64_t vocab, float scale, const float *pe, float *x, int64_t rows, float *const *keys,
                 float *const *values, int64_t row_stride, int64_t head_stride, int64_t t, const float *const *ck,
                 const float *const *cv, int64_t width, const float *cbias, int64_t sentences, float *weights,
                 float *scratch, const int64_t *anc, int64_t anc_stride, const int64_t *cslots, const float *norm_w,
                 const float *norm_b, float norm_eps, float *attn, int64_t src_width) {
    LayerLinear linear = linear32;
    if (int8) {
#if !(defined(__AVX512VNNI__) && defined(__AVX512F__))
        if (!int8_reference) return 0;
#endif
        linear = linear8;
    }
    const LayerHead *head = (const LayerHead *)layers[0];  /* the first member of Layer8 and Layer32 */
    int64_t H = head->dim, N = head->heads;
    if (embed_rows(tokens, rows, embed, vocab, H, scale, pe, 0, x)) return -1;
    for (int64_t l = 0; l < n; ++l)
        if (layer_body((const LayerHead *)layers[l], linear, layers[l], x, rows, keys[l], values[l], row_stride,
                       head_stride, t, ck[l], cv[l], width, cbias, sentences, l == n - 1 ? weights : 0, scratch,
                       anc, anc_stride, cslots) != NMT_DONE)
            return NMT_NO_MEMORY;
    if (norm_w) layer_norm(x, rows, H, norm_w, norm_b, norm_eps, x);
    for (int64_t r = 0; r < rows; ++r) {
        const float *w = weights + r * N * width;
        float *a = attn + r * src_width;
        for (int64_t s = 0; s < src_width; ++s) {
            float sum = 0.0f;
            for (int64_t h = 0; h < N; ++h) sum += w[h * width + s];
            a[s] = sum / (float)N;
        }
    }
    return 1;
}

/* max x_i over a row (-inf for none; rows without NaN). */
/* Whether token i is one of the nbanned in `banned`. */
static inline int is_banned(int64_t i, const int64_t *banned, int64_t nbanned) {
    for (int64_t b = 0; b < nbanned; ++b)
        if (banned[b] == i) return 1;
    return 0;
}

/* out (R,) int64: each row's index of its first largest value with the tokens in `banned` (nbanned of them, each in
   [0, width)) taken as -inf: torch's argmax of the row after x[:, banned] = -inf, for rows without NaN, without
   writing the row. One vector pass finds the row's maximum and its first place; only where that place is banned
   (the model's best token is one no output may hold) or the row is all -inf does a second pass read the row token by
   token. Returns NMT_OUT_OF_BOUNDS (writing nothing) for a banned token outside the row, else NMT_DONE. */
int row_argmax(const float *x, int64_t rows, int64_t width, const int64_t *banned, int64_t nbanned, int64_t *out) {
    if (width < 1 || nbanned < 0) return NMT_OUT_OF_BOUNDS;
    for (int64_t b = 0; b < nbanned; ++b)
        if (banned[b] < 0 || banned[b] >= width) return NMT_OUT_OF_BOUNDS;
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 18))
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * width;
        float m = row_max(xr, width);
        int64_t at = 0;
#ifdef __AVX512F__
        __m512 target = _mm512_set1_ps(m);
        for (; at + 16 <= width; at += 16) {
            __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(xr + at), target, _CMP_EQ_OQ);
            if (hit) break;
        }
#endif
        while (at < width && !(xr[at] == m)) ++at;
        if (at < width && m > -INFINITY && !is_banned(at, banned, nbanned)) {
            out[r] = at;  /* the first place of the row's maximum, and not banned: the masked row's first maximum */
            continue;
        }
        /* the masked row token by token: its first largest value (index 0 where every value is -inf, as argmax) */
        int64_t best = 0;
        float top = is_banned(0, banned, nbanned) ? -INFINITY : xr[0];
        for (int64_t i = 1; i < width; ++i) {
            float v = is_banned(i, banned, nbanned) ? -INFINITY : xr[i];
            if (v > top) {
                top = v;
                best = i;
            }
        }
        out[r] = best;
    }
    return NMT_DONE;
}

/* Each row's k best log-probabilities and their tokens, without writing the row's log-softmax: values (R, k) =
   (x_j - max) - log(sum exp(x - max)) (torch's log_softmax, over every token) for the k largest x_j outside
   `banned` (tokens no output may hold), best first, ties in token order; index (R, k) int64. Needs at least k
   tokens outside `banned`. */
int log_softmax_topk(const float *x, int64_t rows, int64_t width, int64_t k, const int64_t *banned,
                      int64_t nbanned, float *values, int64_t *index) {
    if (k < 1 || k > NMT_TOPK_MAX || k > width) return NMT_OUT_OF_BOUNDS;
    for (int64_t b = 0; b < nbanned; ++b)
        if (banned[b] < 0 || banned[b] >= width) return NMT_OUT_OF_BOUNDS;
    int short_row = 0;  /* a row with fewer than k tokens outside `banned` */
    /* rows shared among torch's threads where there are enough (each computed as by one thread) */
#pragma omp parallel for schedule(static) if (rows * width >= (1 << 18))
    for (int64_t r = 0; r < rows; ++r) {
        float best[NMT_TOPK_MAX];
        int64_t at[NMT_TOPK_MAX] = {0};  /* set to -1 up to k below (the initializer: for the compiler) */
        const float *xr = x + r * width;
        float m = row_max(xr, width);
        int64_t i = 0;
        float lane[16] = {0.0f};
#ifdef __AVX512F__
        __m512 lanes = _mm512_setzero_ps(), mv = _mm512_set1_ps(m);
        for (; i + 16 <= width; i += 16)
            lanes = _mm512_add_ps(lanes, exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(xr + i), mv)));
        _mm512_storeu_ps(lane, lanes);
#endif
        for (; i + 16 <= width; i += 16)
            for (int c = 0; c < 16; ++c) lane[c] += exp_nonpositive(xr[i + c] - m);
        float total = 0.0f;
        for (; i < width; ++i) total += exp_nonpositive(xr[i] - m);
        for (int c = 0; c < 16; ++c) total += lane[c];
        float lse = logf(total);
        for (int64_t j = 0; j < k; ++j) { best[j] = -INFINITY; at[j] = -1; }
        for (i = 0; i < width; ++i) {
#ifdef __AVX512F__
            if (at[k - 1] >= 0 && i % 16 == 0 && i + 16 <= width) {  /* skip 16 tokens none of which enters */
                __mmask16 over = _mm512_cmp_ps_mask(_mm512_loadu_ps(xr + i), _mm512_set1_ps(best[k - 1]), _CMP_GT_OQ);
                if (!over) {
                    i += 15;
                    continue;
                }
            }
#endif
            float v = xr[i];
            if (!(v > best[k - 1]) && at[k - 1] >= 0) continue;
            int skip = 0;
            for (int64_t b = 0; b < nbanned; ++b) skip |= banned[b] == i;
            if (skip) continue;
            int64_t j = k - 1;
            while (j > 0 && (v > best[j - 1] || at[j - 1] < 0)) {
                best[j] = best[j - 1];
                at[j] = at[j - 1];
                --j;
            }
            best[j] = v;
            at[j] = i;
        }
        if (at[k - 1] < 0) {
#pragma omp atomic write
            short_row = 1;
        }
        for (int64_t j = 0; j < k; ++j) {
            values[r * k + j] = (best[j] - m) - lse;
            index[r * k + j] = at[j];
        }
    }
    return short_row ? NMT_OUT_OF_BOUNDS : NMT_DONE;
}

/* y (R, O) = ((float)p * row_scale[r]) * col_scale[o] (+ bias[o]), each product rounded to fp32 in that order,
   as torch's mul(p, row_scale).mul_(col_scale).add_(bias). */
void dequantize(const int32_t *p, int64_t rows, int64_t width, const float *row_scale, const float *col_scale,
                const float *bias, float *y) {
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *pr = p + r * width;
        float *yr = y + r * width;
        float s = row_scale[r];
        if (bias) {
            for (int64_t o = 0; o < width; ++o) {
                float v = (float)pr[o] * s;
                v = v * col_scale[o];
                yr[o] = v + bias[o];
            }
        } else {
            for (int64_t o = 0; o < width; ++o) {
                float v = (float)pr[o] * s;
                yr[o] = v * col_scale[o];
            }
        }
    }
}

/* out (R + 1, I): each row of x divided by its largest |value| (clamped to 1e-12), which goes to scale (R,), and a
   last row of 1, 0, ..., 0, -1: the input of onednn_linear (nmt.engine.quantize). */
void unit_rows_pinned(const float *x, int64_t rows, int64_t width, float *out, float *scale) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * width;
        float *orow = out + r * width;
        float amax = row_amax(xr, width);
        float s = amax > 1e-12f ? amax : 1e-12f;
        scale[r] = s;
        for (int64_t i = 0; i < width; ++i) orow[i] = xr[i] / s;
    }
    float *pin = out + rows * width;
    for (int64_t i = 0; i < width; ++i) pin[i] = 0.0f;
    pin[0] = 1.0f;
    pin[width - 1] = -1.0f;
}

/* The structs' sizes and field offsets, in the order of nmt.engine.native.LAYOUT, into out (n slots); returns how
   many it has (a caller with fewer slots gets the first n). */
int64_t nmt_layout(int64_t *out, int64_t n) {
    const int64_t layout[] = {
        sizeof(Linear8), offsetof(Linear8, packed), offsetof(Linear8, colsum), offsetof(Linear8, scale),
        offsetof(Linear8, bias), offsetof(Linear8, in), offsetof(Linear8, out),
#define HEAD_FIELDS(T)                                                                                           \
        offsetof(T, head.dim), offsetof(T, head.heads), offsetof(T, head.head_dim), offsetof(T, head.pre),      \
        offsetof(T, head.norm_w), offsetof(T, head.norm_b), offsetof(T, head.eps), offsetof(T, head.self_scale), \
        offsetof(T, head.cross_scale)
#define LINEARS(T)                                                                                           \
        offsetof(T, linear[0]), offsetof(T, linear[1]), offsetof(T, linear[2]), offsetof(T, linear[3]),     \
        offsetof(T, linear[4]), offsetof(T, linear[5])
        sizeof(Layer8), HEAD_FIELDS(Layer8), LINEARS(Layer8),
        sizeof(Linear32), offsetof(Linear32, packed), offsetof(Linear32, bias), offsetof(Linear32, in),
        offsetof(Linear32, out),
        sizeof(Layer32), HEAD_FIELDS(Layer32), offsetof(Layer32, compute), LINEARS(Layer32),
#undef HEAD_FIELDS
#undef LINEARS
    };
    int64_t count = (int64_t)(sizeof layout / sizeof layout[0]);
    for (int64_t i = 0; i < count && i < n; ++i) out[i] = layout[i];
    return count;
}

/* Whether every entry of x (rows, cols; rows `stride` apart) lies in [0, size): the wrappers' check of an index
   tensor (a row's ancestors, a sentence's cross-attention slot) before a kernel reads memory by it. */
int nmt_indices_within(const int64_t *x, int64_t rows, int64_t cols, int64_t stride, int64_t size) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            if (x[r * stride + c] < 0 || x[r * stride + c] >= size) return 0;
    return 1;
}
