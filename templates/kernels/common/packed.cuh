// mg_packed.cuh: the gather and scatter of packed variable-length sequences
// (cu_seqlens; doc/math.md §9), the same for every arch. A packed call of
// nseq sequences runs as a batch of nseq rows of maxlen tokens, each
// sequence right-aligned in its row (left padding): row b holds sequence b,
// tokens [off[b], off[b+1]) of the stream, at t = pad_b .. maxlen-1 with
// pad_b = maxlen - (off[b+1] - off[b]), and zeros before it. The start mask
// of that batch marks t = pad_b of every row, so the pads' states are
// discarded and the state after the row's last token is the sequence's.
// Plain copies (no arithmetic): deterministic. Packed calls from given
// initial states (NAME_prefill_packed_from) run the sequences of one
// length at a time as a batch without padding: group_rows_kernel and
// group_states_kernel gather those sequences' tokens and state rows, and
// scatter the outputs and final states back. Included by NAME_kernels.cu
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

// Rows of len tokens for the k sequences idx[0..k) of the stream (idx
// NULL: sequences 0..k-1), each sequence left-aligned in its row:
// NAME_prefill_packed_from's groups of one length (every row full), and
// the trainer's packed forward from given states (rows of the longest
// length). scatter = 0: dst [k][len][width] <- the sequences' rows of src
// [total][width], zeros past a sequence's end; scatter = 1: the inverse,
// a sequence's own tokens only. One block per batch row (grid-stride).
__global__ void group_rows_kernel(const float *__restrict__ src, float *__restrict__ dst, int width,
                                  const int *__restrict__ off, const int *__restrict__ idx, int len, int nrows,
                                  int scatter)
{
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const int i = r / len, t = r - i * len;
        const int q = idx ? idx[i] : i;
        const bool real = t < off[q + 1] - off[q];
        if (scatter && !real) continue;
        const size_t srow = (size_t)off[q] + t;   // the token's row in the stream
        float *d = dst + (scatter ? srow : (size_t)r) * width;
        if (!real) {
            for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = 0.0f;
            continue;
        }
        const float *s = src + (scatter ? (size_t)r : srow) * width;
        for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
    }
}

// The state rows of that group: states are [n_layers][rows][per] floats.
// scatter = 0: dst [n_layers][k][per] <- rows idx[0..k) of src
// [n_layers][nseq][per]; scatter = 1: the inverse. One block per (layer,
// row) (grid-stride).
__global__ void group_states_kernel(const float *__restrict__ src, float *__restrict__ dst, size_t per,
                                    const int *__restrict__ idx, int k, int nseq, int nrows, int scatter)
{
    for (int r = blockIdx.x; r < nrows; r += gridDim.x) {
        const int l = r / k, i = r - l * k;
        const size_t full = (size_t)l * nseq + idx[i], part = (size_t)r;
        const float *s = src + (scatter ? part : full) * per;
        float *d = dst + (scatter ? full : part) * per;
        for (size_t c = threadIdx.x; c < per; c += blockDim.x) d[c] = s[c];
    }
}
