/* Dropout (Srivastava et al. 2014) in one pass: the mask is drawn and applied together, and never stored
   (nmt/training/native_dropout.py calls it through nmt/engine/native.py, which checks what it passes).

     out_i = x_i * scale   if u_i >= dropped,   else 0
     u_i   = 16-bit lane (i mod 4) of mix64(seed + (floor(i / 4) + 1) * 0x9E3779B97F4A7C15)

   mix64 is splitmix64's output function (Steele, Lea and Flood 2014), so u_i is a counter-based draw: element i's
   keep decision depends only on (seed, i). An element is kept with probability (65536 - dropped) / 65536, the
   16-bit resolution of nmt/models/dropout.py, and the backward pass is this same function applied to the gradient
   with the same seed (d out_i / d x_i is scale or 0). Values are float32 or bf16 (the raw 16 bits, widened exactly,
   multiplied in float32, rounded to nearest even as torch rounds). Elements are shared among torch's OpenMP threads
   in blocks of 64; each depends on itself alone, so any thread count gives the same output. */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define GOLDEN 0x9E3779B97F4A7C15ull
#define BLOCK 64 /* elements per block: 16 words of four 16-bit draws */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* the 64 draws of block b, lane order as the 16-bit halves of a little-endian word (element 4w + j = bits 16j..) */
static inline void block_draws(uint64_t seed, int64_t b, uint16_t draws[BLOCK]) {
    for (int w = 0; w < BLOCK / 4; ++w) {
        uint64_t bits = mix64(seed + ((uint64_t)b * (BLOCK / 4) + (uint64_t)w + 1u) * GOLDEN);
        for (int j = 0; j < 4; ++j) draws[4 * w + j] = (uint16_t)(bits >> (16 * j));
    }
}

int dropout_apply(const void *x, int bf16, int64_t n, uint64_t seed, int32_t dropped, float scale, void *out) {
    if (n < 0 || dropped < 0 || dropped > 65536 || !(scale >= 0.0f)) return NMT_OUT_OF_BOUNDS;
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t b = 0; b < blocks; ++b) {
        uint16_t draws[BLOCK];
        block_draws(seed, b, draws);
        const int64_t start = b * BLOCK, count = n - start < BLOCK ? n - start : BLOCK;
        if (bf16) {
            const uint16_t *xb = (const uint16_t *)x + start;
            uint16_t *ob = (uint16_t *)out + start;
            for (int64_t i = 0; i < count; ++i)
                ob[i] = float_to_bf16(bf16_to_float(xb[i]) * ((int32_t)draws[i] >= dropped ? scale : 0.0f));
        } else {
            const float *xb = (const float *)x + start;
            float *ob = (float *)out + start;
            for (int64_t i = 0; i < count; ++i) ob[i] = xb[i] * ((int32_t)draws[i] >= dropped ? scale : 0.0f);
        }
    }
    return NMT_DONE;
}
