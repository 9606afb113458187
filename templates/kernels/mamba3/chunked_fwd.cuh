// mg_m3_chunked_fwd.cuh: the chunked SSM scan kernel of the Mamba-3 SISO
// forward (inference, and the forward for training with ckpt): the body of
// mg_m3_chunked_body.cuh with the dims policy of this model (every member a
// constant of NAME_common.cuh, or of the CK_* shape in scope).
// Included inside the anonymous namespace of the package's .cu files, after
// mg_m3_chunked_body.cuh: it includes nothing itself.

struct ck_dims_fixed {
    static constexpr bool FIXED = true;
    static constexpr int N = ::N, P = ::P, H = ::H, E = ::E, NP = ::NP, OFF_X = ::OFF_X;
    static constexpr int nw = CK_NW, pw = CK_PW, ny = CK_NY, ldn = CK_LDN;
    static constexpr int NW_MAX = CK_NW, PW_MAX = CK_PW;
};

// STARTS: start [batch][seqlen] (mg_m3_chunked_body.cuh, "Episode starts").
// k, q: the per-head k', q' rows, ck_kq_t (f32, NAME_common.cuh). (The
// training's chunked path builds them in the stage instead: the kernel
// below, whose row pointers are null.)
template <bool STARTS>
__global__ void __launch_bounds__(CK_THREADS, CK_MIN_BLOCKS)
scan_chunked_kernel(int seqlen, const act_t *__restrict__ proj, const ck_kq_t *__restrict__ k,
                    const ck_kq_t *__restrict__ q, const float *__restrict__ dt,
                    const float *__restrict__ adt, const float *__restrict__ lam,
                    const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
                    const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                    float *__restrict__ y, float *__restrict__ ckpt, int ckpt_step, int ckpt_slots,
                    const unsigned char *__restrict__ start)
{
    ck_fwd_body<STARTS>(seqlen, proj, k, q, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in, ssm_out, kp_out, vp_out, y,
                        ckpt, ckpt_step, ckpt_slots, ck_dims_fixed(), start);
}

// The forward for training's chunked scan with k', q' built in the stage
// from the in_proj rows (Bld: kq_build, mg_m3_prep_rot.cuh) instead of read
// from per-head rows: launched by NAME_backward.cu only (a template, so
// that the inference file, which has no kq_build, compiles none of it).
template <bool STARTS, class Bld>
__global__ void __launch_bounds__(CK_THREADS, CK_MIN_BLOCKS)
scan_chunked_built_kernel(int seqlen, const Bld bld, const float *__restrict__ dt,
                          const float *__restrict__ adt, const float *__restrict__ lam,
                          const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
                          const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                          float *__restrict__ y, float *__restrict__ ckpt, int ckpt_step, int ckpt_slots,
                          const unsigned char *__restrict__ start)
{
    ck_fwd_body<STARTS>(seqlen, bld.proj, static_cast<const ck_kq_t *>(nullptr), static_cast<const ck_kq_t *>(nullptr),
                        dt, adt, lam, Dskip, ssm_in, kp_in, vp_in, ssm_out, kp_out, vp_out, y, ckpt, ckpt_step,
                        ckpt_slots, ck_dims_fixed(), start, bld);
}
