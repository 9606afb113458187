// mg_packed.cuh: the gather and scatter of packed variable-length sequences
// (cu_seqlens; doc/math.md §9), the same for every arch. A packed call of
// nseq sequences runs as a batch of nseq rows of maxlen tokens, each
// sequence right-aligned in its row (left padding): row b holds sequence b,
// tokens [off[b], off[b+1]) of the stream, at t = pad_b .. maxlen-1 with
// pad_b = maxlen - (off[b+1] - off[b]), and zeros before it. The start mask
// of that batch marks t = pad_b of every row, so the pads' states are
// discarded and the state after the row's last token is the sequence's.
// Plain copies (no arithmetic): deterministic. Included by NAME_kernels.cu
// inside its anonymous namespace; includes nothing.

// dst [nseq][maxlen][width] <- src [total][width] (pads: 0); start (if not
// NULL) [nseq][maxlen] <- 1 at each row's first real token, else 0. One
// block per padded row (grid-stride).
__global__ void pack_rows_kernel(const float *__restrict__ src, float *__restrict__ dst, int width,
                                 const int *__restrict__ off, int maxlen, int nrows,
                                 unsigned char *__restrict__ start)
{
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const int b = r / maxlen, t = r - b * maxlen;
        const int o = off[b], pad = maxlen - (off[b + 1] - o);
        float *d = dst + (size_t)r * width;
        if (t < pad) {
            for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = 0.0f;
        } else {
            const float *s = src + (size_t)(o + t - pad) * width;
            for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
        }
        if (start && threadIdx.x == 0) start[r] = (unsigned char)(t == pad);
    }
}

// dst [total][width] <- the real tokens of src [nseq][maxlen][width] (the
// inverse of pack_rows_kernel; pads are not read).
__global__ void unpack_rows_kernel(const float *__restrict__ src, float *__restrict__ dst, int width,
                                   const int *__restrict__ off, int maxlen, int nrows)
{
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const int b = r / maxlen, t = r - b * maxlen;
        const int o = off[b], pad = maxlen - (off[b + 1] - o);
        if (t < pad) continue;
        const float *s = src + (size_t)r * width;
        float *d = dst + (size_t)(o + t - pad) * width;
        for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
    }
}
