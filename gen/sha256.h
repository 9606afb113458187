/* gen/sha256.h: SHA-256 (FIPS 180-4), written here so the generator needs no
 * crypto library. Used for the spec hash in provenance lines and for cache
 * keys (mg.sha256 in Lua). */
#ifndef MG_SHA256_H
#define MG_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_SIZE 32
#define SHA256_HEX_SIZE 65 /* 64 hex digits + NUL */

/* Incremental state: init, update any number of times, final once. */
typedef struct {
    uint32_t h[8];
    uint64_t nbytes;        /* total bytes hashed so far */
    unsigned char buf[64];  /* partial block */
    size_t nbuf;
} sha256_ctx;

void sha256_init(sha256_ctx *ctx);
void sha256_update(sha256_ctx *ctx, const void *data, size_t len);
void sha256_final(sha256_ctx *ctx, unsigned char out[SHA256_DIGEST_SIZE]);

/* One-shot: digest of DATA[0..LEN) as 64 lowercase hex digits + NUL. */
void sha256_hex(const void *data, size_t len, char out[SHA256_HEX_SIZE]);

#endif
