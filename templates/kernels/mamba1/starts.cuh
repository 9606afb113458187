// starts.cuh: episode-start flags as bit words, for the Mamba-1 kernels
// that take a start mask (the ST instances of the conv and scan kernels,
// doc/math.md §9). Shared by NAME_kernels.cu, NAME_backward.cu and the
// scan's tune candidates (which inline it before scan_body.cuh); #included
// inside the anonymous namespace, so it includes nothing itself.

// Episode starts as one word (the ST kernels, doc/math.md §9): bit i is set
// when a start lies at t = t_lo + i, for i < n (n <= 32) and 0 <= t < t_hi
// (sp: the sequence's row of the [batch][seqlen] mask). Lane i loads flag i
// (start_flag) and the warp ballots (start_word), so every lane of the
// calling warp must be present, and every lane gets the word; a kernel that
// stages other inputs issues the flag's load first and ballots after its
// own loads, so that the flag's latency hides behind theirs. Why a word:
// the step loops then test a register bit instead of loading a flag per
// step (a load whose latency sat on the recurrence), and a window without a
// start can take the maskless code.
__device__ __forceinline__ bool start_flag(const unsigned char *__restrict__ sp, int t_lo, int n, int t_hi)
{
    const int i = (int)(threadIdx.x & 31);
    const int t = t_lo + i;
    return i < n && t >= 0 && t < t_hi && sp[t] != 0;
}
__device__ __forceinline__ unsigned start_word(bool flag) { return __ballot_sync(0xffffffffu, flag); }
__device__ __forceinline__ unsigned start_bits(const unsigned char *__restrict__ sp, int t_lo, int n, int t_hi)
{
    return start_word(start_flag(sp, t_lo, n, t_hi));
}
// Bit i of a start word (i a compile-time constant where the loops unroll).
__device__ __forceinline__ bool start_at(unsigned w, int i) { return (w >> i) & 1u; }
