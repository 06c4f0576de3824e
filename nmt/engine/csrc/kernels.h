/* nmt's decoding kernels (nmt/engine/native.py builds kernels.c with the machine's C compiler and calls these
   functions through ctypes): the structs Python fills, and every function it calls.

   The structs' layouts are checked at load: nmt_layout() reports their sizes and field offsets, and Python
   compares them with its ctypes.Structure copies (nmt.engine.native.LAYOUT); a mismatch disables the kernels.
   Return codes: 1 done, 0 not in this build (no VNNI), -1 a token outside the vocabulary, -2 out of memory,
   -3 an argument out of its bounds (log_softmax_topk's k). */
#ifndef NMT_KERNELS_H
#define NMT_KERNELS_H

#include <stdint.h>

#define NMT_DONE 1
#define NMT_NOT_BUILT 0
#define NMT_BAD_TOKEN (-1)
#define NMT_NO_MEMORY (-2)
#define NMT_OUT_OF_BOUNDS (-3)

/* The most hypotheses log_softmax_topk keeps per row (its best-first list lives on the stack). */
#define NMT_TOPK_MAX 64

/* One int8 linear of a fused layer (`pack_vnni`'s weights, Int8Linear's scales and bias). */
typedef struct {
    const int8_t *packed;
    const int32_t *colsum;
    const float *scale;
    const float *bias;
    int64_t in, out;
} Linear8;

/* What every fused decoder layer holds besides its linears. */
typedef struct {
    int64_t dim, heads, head_dim, pre;
    const float *norm_w[3], *norm_b[3];
    float eps[3], self_scale, cross_scale;
} LayerHead;

/* A Transformer decoder layer's weights for `layer_step`; linears: qkv, self_out, cross_q, cross_out, ffn_in,
   ffn_out. */
typedef struct {
    LayerHead head;
    Linear8 linear[6];
} Layer8;

/* MKL's cblas_sgemm_compute (torch's own MKL, found by the caller), for layer_step32. */
typedef void (*SgemmCompute)(int, int, int, int64_t, int64_t, int64_t, const float *, int64_t, const void *,
                             int64_t, float, float *, int64_t);

/* One fp32 linear of a fused layer: MKL's packed weight (nmt.engine.packed) or pack_f32's, and the bias. */
typedef struct {
    const void *packed;
    const float *bias;
    int64_t in, out;
} Linear32;

typedef struct {
    LayerHead head;
    SgemmCompute compute;
    Linear32 linear[6];
} Layer32;

/* The functions Python calls (their ctypes signatures: nmt.engine.native.SIGNATURES). */
int attend(const float *q, int64_t rows, int64_t heads, int64_t dim, int64_t q_stride, int64_t group,
            const float *k, const float *v, int64_t kv_stride, int64_t head_stride, int64_t key_stride, int64_t len,
            const float *bias, int64_t bias_stride, float scale, float *out, float *weights, const int64_t *kv_slots);
int self_attend(const float *qkv, int64_t rows, int64_t heads, int64_t dim, int64_t q_stride, float *k, float *v,
                 int64_t row_stride, int64_t head_stride, int64_t t, float scale, float *out, const int64_t *anc,
                 int64_t anc_stride);
void quantize_rows(const float *x, int64_t rows, int64_t width, int8_t *q, float *scale);
int has_amx(void);
/* The int8 kernels through a portable C reference where the build has no VNNI (on != 0; tests only: slower than
   torch's int8 path); returns the setting before. */
int nmt_int8_reference(int on);
int vnni_linear(const float *x, int64_t rows, int64_t in, int64_t out, const int8_t *packed, const int32_t *colsum,
                const float *col_scale, const float *bias, float *y);
int fp32_linear(const float *x, int64_t rows, int64_t in, int64_t out, const float *packed, const float *bias,
                float *y);
int layer_step32(const Layer32 *L, float *x, int64_t rows, float *keys, float *values, int64_t row_stride,
                  int64_t head_stride, int64_t t, const float *ck, const float *cv, int64_t width, const float *cbias,
                  int64_t sentences, float *weights, float *scratch, const int64_t *anc, int64_t anc_stride,
                  const int64_t *cslots);
int layer_step(const Layer8 *L, float *x, int64_t rows, float *keys, float *values, int64_t row_stride,
               int64_t head_stride, int64_t t, const float *ck, const float *cv, int64_t width, const float *cbias,
               int64_t sentences, float *weights, float *scratch, const int64_t *anc, int64_t anc_stride,
               const int64_t *cslots);
int encoder_forward(const void *const *layers, int64_t n, int int8, const int64_t *tokens, const float *embed,
                    int64_t vocab, float scale, const float *pe, float *x, int64_t sentences, int64_t length,
                    const float *bias, float *scratch, const float *norm_w, const float *norm_b, float norm_eps);
int decoder_step(const void *const *layers, int64_t n, int int8, const int64_t *tokens, const float *embed,
                 int64_t vocab, float scale, const float *pe, float *x, int64_t rows, float *const *keys,
                 float *const *values, int64_t row_stride, int64_t head_stride, int64_t t, const float *const *ck,
                 const float *const *cv, int64_t width, const float *cbias, int64_t sentences, float *weights,
                 float *scratch, const int64_t *anc, int64_t anc_stride, const int64_t *cslots, const float *norm_w,
                 const float *norm_b, float norm_eps, float *attn, int64_t src_width);
int row_argmax(const float *x, int64_t rows, int64_t width, const int64_t *banned, int64_t nbanned, int64_t *out);
int log_softmax_topk(const float *x, int64_t rows, int64_t width, int64_t k, const int64_t *banned,
                      int64_t nbanned, float *values, int64_t *index);
void dequantize(const int32_t *p, int64_t rows, int64_t width, const float *row_scale, const float *col_scale,
                const float *bias, float *y);
void unit_rows_pinned(const float *x, int64_t rows, int64_t width, float *out, float *scale);
int64_t nmt_layout(int64_t *out, int64_t n);
/* loss.c: label-smoothed cross-entropy of rows of logits x (rows, width), float32 (bf16 = 0) or bf16 (bf16 = 1,
   raw 16 bits), against target (rows,) in [0, width): forward writes loss (rows,) and lse (rows,); backward writes
   grad (rows, width) in x's dtype, times g. NMT_OUT_OF_BOUNDS (writing nothing) for a target out of range or eps
   outside [0, 1]; NMT_NO_MEMORY if a bf16 row's buffer cannot be had. */
int xent_forward(const void *x, int bf16, int64_t rows, int64_t width, const int64_t *target, float eps,
                 float *loss, float *lse);
int xent_backward(const void *x, int bf16, int64_t rows, int64_t width, const int64_t *target, float eps,
                  const float *lse, float g, void *grad);
/* dropout.c: out = x * scale where draw i (a 16-bit counter-based draw from seed, see dropout.c) >= dropped, else 0;
   x and out (n,) float32 (bf16 = 0) or bf16 (raw 16 bits; out may be x). NMT_OUT_OF_BOUNDS (writing nothing) for
   dropped outside [0, 65536] or a negative scale. */
int dropout_apply(const void *x, int bf16, int64_t n, uint64_t seed, int32_t dropped, float scale, void *out);
/* layernorm.c: layer normalization of float32 rows x (rows, width) with weight w and bias b (width,): forward writes
   y (rows, width) in bf16 (raw 16 bits) and each row's mean and 1 / std (rows,); backward reads the output's
   gradient dy in bf16 (bf16 = 1) or float32 and writes dx (rows, width), dw and db (width,) in float32, with
   partial (ceil(rows / 64), 2, width) as scratch. NMT_OUT_OF_BOUNDS (writing nothing) for width < 1 or eps < 0. */
int layer_norm_bf16_forward(const float *x, int64_t rows, int64_t width, const float *w, const float *b, float eps,
                            uint16_t *y, float *mean, float *rstd);
int layer_norm_bf16_backward(const float *x, const void *dy, int bf16, int64_t rows, int64_t width, const float *w,
                             const float *mean, const float *rstd, float *dx, float *partial, float *dw, float *db);
int nmt_indices_within(const int64_t *x, int64_t rows, int64_t cols, int64_t stride, int64_t size);

/* Bahdanau's additive score for one decoder step of bf16 training, and its backward (additive.c). */
int additive_scores_forward(const uint16_t *q, int64_t q_stride, const uint16_t *keys, const float *v, int64_t batch,
                            int64_t length, int64_t width, float *scores);
int additive_scores_backward(const uint16_t *q, int64_t q_stride, const uint16_t *keys, const float *v,
                             const float *grad, int64_t batch, int64_t length, int64_t width, float *dq, float *dkeys,
                             float *dv_rows);

#endif /* NMT_KERNELS_H */
