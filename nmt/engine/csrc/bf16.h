/* bf16 <-> float32 as torch converts: widening is exact; narrowing rounds to nearest even and keeps a NaN a quiet
   NaN. Shared by the training kernels (loss.c, dropout.c). */
#ifndef NMT_BF16_H
#define NMT_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif /* NMT_BF16_H */
