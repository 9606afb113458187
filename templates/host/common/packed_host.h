/* packed_host.h (emitted as mg_packed_host.h): the host side of packed
 * variable-length sequences (cu_seqlens; doc/math.md §9), shared by the
 * model (NAME_prefill_packed) and the trainer (NAME_forward_train_packed):
 * the checks of cu_seqlens, all on the host before any launch, and the
 * upload of the offsets and the gather into the padded batch. A packed
 * call of nseq sequences runs as a batch of nseq rows of maxlen (the
 * longest) tokens, each sequence right-aligned in its row, zeros before it,
 * with a start mask at the row's first real token (mg_packed.cuh): from
 * zero initial states, that batch's outputs at the real tokens and its
 * final states are the packed call's. It costs nseq x maxlen tokens of
 * compute. Included once by mg_model_host.h and by mg_train_host.h; needs
 * MODEL_NAME, MAX_BATCH-like limits passed in, and MG_LAUNCH. Plain C11. */

/* The shape of a packed call. */
typedef struct packed_shape {
    int nseq, maxlen, total;
} packed_shape;

/* Checks nseq and cu_seqlens (host memory, nseq + 1 entries) against the
 * limits; fn names the caller. MG_ERR_INVALID_ARG naming the entry and the
 * rule for: cu_seqlens NULL, nseq outside 1..max_batch, cu_seqlens[0] != 0,
 * an entry not above the one before it (an empty sequence), a sequence
 * longer than max_seq_len, a total above max_batch * max_seq_len. */
static mg_status packed_check(const char *fn, int nseq, const int32_t *cu, int max_batch, int max_seq_len,
                              packed_shape *ps)
{
    if (!cu) return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens is NULL", fn);
    if (nseq < 1 || nseq > max_batch)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: nseq = %d is out of range 1..%d (MAX_BATCH)", fn, nseq, max_batch);
    if (cu[0] != 0)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens[0] = %ld (must be 0)", fn, (long)cu[0]);
    int maxlen = 0;
    for (int i = 1; i <= nseq; ++i) {
        if (cu[i] <= cu[i - 1])
            return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens[%d] = %ld is not above cu_seqlens[%d] = %ld "
                           "(the entries must increase strictly: sequence %d would be %s)", fn, i, (long)cu[i],
                           i - 1, (long)cu[i - 1], i - 1, cu[i] == cu[i - 1] ? "empty" : "of negative length");
        const long len = (long)cu[i] - (long)cu[i - 1];
        if (len > max_seq_len)
            return mg_fail(MG_ERR_INVALID_ARG, "%s: sequence %d (cu_seqlens[%d..%d] = %ld..%ld) has %ld tokens, "
                           "more than MAX_SEQ_LEN = %d", fn, i - 1, i - 1, i, (long)cu[i - 1], (long)cu[i], len,
                           max_seq_len);
        if (len > maxlen) maxlen = (int)len;
    }
    if ((long)cu[nseq] > (long)max_batch * max_seq_len)
        return mg_fail(MG_ERR_INVALID_ARG, "%s: cu_seqlens[%d] = %ld tokens in all, more than MAX_BATCH x "
                       "MAX_SEQ_LEN = %ld", fn, nseq, (long)cu[nseq], (long)max_batch * max_seq_len);
    ps->nseq = nseq;
    ps->maxlen = maxlen;
    ps->total = (int)cu[nseq];
    return MG_OK;
}

/* Uploads cu_seqlens to d_off (nseq + 1 int32, device) on st, then gathers
 * u [total][width] into pu [nseq][maxlen][width] and writes the start mask
 * [nseq][maxlen]. The host copy is staged by CUDA before the call returns,
 * so cu_seqlens may be reused at once. */
static mg_status packed_gather(const packed_shape *ps, const int32_t *cu, int *d_off, const float *u, float *pu,
                               int width, unsigned char *start, cudaStream_t st)
{
    MG_CUDA(cudaMemcpyAsync(d_off, cu, (size_t)(ps->nseq + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    MG_CUDA(MG_LAUNCH(pack_rows)(u, pu, width, d_off, ps->nseq, ps->maxlen, start, st));
    return MG_OK;
}

/* Zeroes the n given state buffers (sizes in floats; NULL entries skipped):
 * a packed call starts every sequence from zero states. */
static mg_status packed_zero_states(float *const *sp, const size_t *floats, int n, cudaStream_t st)
{
    for (int i = 0; i < n; ++i)
        if (sp[i]) MG_CUDA(cudaMemsetAsync(sp[i], 0, floats[i] * sizeof(float), st));
    return MG_OK;
}
