/* What the compiled modules share about bytes: CRC-32C (Castagnoli, the crc32c package's) and
 * big-endian loads and stores. Each module that includes this calls crc_init() once. */
#ifndef ORBIT_BYTES_H
#define ORBIT_BYTES_H
#include <stdint.h>
#include <string.h>

/* ---- CRC-32C (Castagnoli), same as the crc32c package -------------------------------- */
static uint32_t crc_table[8][256];
#define CRC_LANE 128 /* bytes in each of crc_hw's three parallel lanes (a multiple of 8) */
static uint32_t crc_shift[4][256];
static int have_sse42 = 0;

static inline uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = crc_table[7][v & 0xFF] ^ crc_table[6][(v >> 8) & 0xFF] ^ crc_table[5][(v >> 16) & 0xFF] ^
              crc_table[4][(v >> 24) & 0xFF] ^ crc_table[3][(v >> 32) & 0xFF] ^
              crc_table[2][(v >> 40) & 0xFF] ^ crc_table[1][(v >> 48) & 0xFF] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

static inline void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    /* crc_shift[k][b]: the register b << 8k after CRC_LANE zero bytes. The register is linear
       in its start value, so four lookups move any register past a lane without reading it. */
    static const unsigned char zeros[CRC_LANE];
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) crc_shift[k][b] = crc_sw(b << (8 * k), zeros, CRC_LANE);
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint64_t crc_hw_run(uint64_t c, const unsigned char *p, size_t n8) {
    for (size_t i = 0; i < n8; i++) {
        uint64_t v;
        memcpy(&v, p + 8 * i, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    return c;
}

static inline uint32_t crc_shift_lane(uint32_t c) {
    return crc_shift[0][c & 0xFF] ^ crc_shift[1][(c >> 8) & 0xFF] ^ crc_shift[2][(c >> 16) & 0xFF] ^
           crc_shift[3][c >> 24];
}

/* The crc32 instruction takes three cycles and issues one a cycle: three lanes of CRC_LANE bytes
   run side by side, the first two then moved past the lanes that follow them (crc_shift). */
__attribute__((target("sse4.2"))) static inline uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n >= 3 * CRC_LANE) {
        uint64_t a = c, b = 0, d = 0;
        for (size_t i = 0; i < CRC_LANE / 8; i++) {
            uint64_t va, vb, vd;
            memcpy(&va, p + 8 * i, 8);
            memcpy(&vb, p + CRC_LANE + 8 * i, 8);
            memcpy(&vd, p + 2 * CRC_LANE + 8 * i, 8);
            a = __builtin_ia32_crc32di(a, va);
            b = __builtin_ia32_crc32di(b, vb);
            d = __builtin_ia32_crc32di(d, vd);
        }
        c = crc_shift_lane(crc_shift_lane((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
        p += 3 * CRC_LANE;
        n -= 3 * CRC_LANE;
    }
    c = crc_hw_run(c, p, n / 8);
    p += n & ~(size_t)7;
    n &= 7;
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

/* crc is the running (not inverted) register; start with 0xFFFFFFFF, finish with ~crc */
static inline uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n) {
#if defined(__x86_64__)
    if (have_sse42) return crc_hw(crc, p, n);
#endif
    return crc_sw(crc, p, n);
}

/* ---- big-endian stores ---------------------------------------------------------------- */
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}
static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t get64(const unsigned char *p) {
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

#endif
