/* gen/sha256.c: SHA-256 (FIPS 180-4). Straightforward portable code: the
 * inputs are specs (<= 1 MiB) and template text, so speed does not matter,
 * correctness and byte-order independence do. */
#include "sha256.h"

#include <string.h>

static const uint32_t sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u,
    0x923f82a4u, 0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u,
    0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u,
    0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u,
    0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u,
    0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au,
    0x5b9cca4fu, 0x682e6ff3u, 0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u,
    0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

static uint32_t sha256_rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32u - n));
}

/* Hashes one 64-byte block into the state. Bytes are read big-endian
 * explicitly so the result does not depend on the host byte order. */
static void sha256_block(sha256_ctx *ctx, const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = sha256_rotr(w[i - 15], 7) ^ sha256_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = sha256_rotr(w[i - 2], 17) ^ sha256_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = ctx->h[0], b = ctx->h[1], c = ctx->h[2], d = ctx->h[3];
    uint32_t e = ctx->h[4], f = ctx->h[5], g = ctx->h[6], h = ctx->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^ sha256_rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = h + S1 + ch + sha256_k[i] + w[i];
        uint32_t S0 = sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^ sha256_rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        h = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    ctx->h[0] += a; ctx->h[1] += b; ctx->h[2] += c; ctx->h[3] += d;
    ctx->h[4] += e; ctx->h[5] += f; ctx->h[6] += g; ctx->h[7] += h;
}

void sha256_init(sha256_ctx *ctx)
{
    static const uint32_t iv[8] = {
        0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
        0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
    };
    memcpy(ctx->h, iv, sizeof iv);
    ctx->nbytes = 0;
    ctx->nbuf = 0;
}

void sha256_update(sha256_ctx *ctx, const void *data, size_t len)
{
    const unsigned char *p = data;
    ctx->nbytes += len;
    if (ctx->nbuf > 0) {
        size_t take = 64 - ctx->nbuf;
        if (take > len)
            take = len;
        memcpy(ctx->buf + ctx->nbuf, p, take);
        ctx->nbuf += take;
        p += take;
        len -= take;
        if (ctx->nbuf < 64)
            return;
        sha256_block(ctx, ctx->buf);
        ctx->nbuf = 0;
    }
    while (len >= 64) {
        sha256_block(ctx, p);
        p += 64;
        len -= 64;
    }
    memcpy(ctx->buf, p, len);
    ctx->nbuf = len;
}

void sha256_final(sha256_ctx *ctx, unsigned char out[SHA256_DIGEST_SIZE])
{
    uint64_t bits = ctx->nbytes * 8u;
    /* Padding: 0x80, zeros up to 56 mod 64, then the bit length big-endian. */
    ctx->buf[ctx->nbuf++] = 0x80;
    if (ctx->nbuf > 56) {
        memset(ctx->buf + ctx->nbuf, 0, 64 - ctx->nbuf);
        sha256_block(ctx, ctx->buf);
        ctx->nbuf = 0;
    }
    memset(ctx->buf + ctx->nbuf, 0, 56 - ctx->nbuf);
    for (int i = 0; i < 8; i++)
        ctx->buf[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_block(ctx, ctx->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(ctx->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(ctx->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(ctx->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)ctx->h[i];
    }
}

void sha256_hex(const void *data, size_t len, char out[SHA256_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char d[SHA256_DIGEST_SIZE];
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, data, len);
    sha256_final(&ctx, d);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[64] = '\0';
}
