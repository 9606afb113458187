// mg_m3_train_fwd.cuh: the Mamba-3 SISO forward for training, where it differs
// from inference: the sequential scan that saves a state checkpoint every
// CKPT_STRIDE steps. (The bias rows and the RMSNorm that saves 1/rms are
// mg_train_norm.cuh; prep, angles and the gate are the inference kernels:
// mg_m3_prep.cuh, mg_m3_angles.cuh, mg_m3_gate.cuh.)
// Included inside the anonymous namespace of NAME_backward.cu, after
// NAME_common.cuh (whose constants it uses) and mg_m3_scan.cuh (scan_walk):
// it includes nothing itself.

// The SSM forward for training (doc/math.md steps 8-10), one block per (head,
// sequence): the inference scan's walk (scan_walk, mg_m3_scan.cuh) in the
// training's block shape (BL, BNPT, BRPT, BRG, BTHREADS), with k', q' in
// kq_t and the state saved at the start of every CKPT_STRIDE-step chunk into
// ckpt [b][h][nck][P][N] (nck = ceil(seqlen/CKPT_STRIDE); chunk 0 = the initial
// state). y [tok][E] f32. States: NULL in = zeros, NULL out = not written;
// out may alias in (each entry is read and written by its owner only).
// STARTS: start [batch][seqlen] as in scan_kernel (alpha = beta = 0 at a
// start token; no state in for a stream starting at t = 0).
using TrainScan = ScanShape<BL, BNPT, BRPT, BRG, BTHREADS, CKPT_STRIDE, BMASK>;
template <bool STARTS>
__global__ void __launch_bounds__(BTHREADS)
scan_fwd_kernel(int seqlen, const act_t *__restrict__ proj, const kq_t *__restrict__ k,
                const kq_t *__restrict__ q, const float *__restrict__ dt,
                const float *__restrict__ adt, const float *__restrict__ lam,
                const float *__restrict__ Dskip, const float *ssm_in, const float *kp_in,
                const float *vp_in, float *ssm_out, float *kp_out, float *vp_out,
                float *__restrict__ ckpt, float *__restrict__ y, const unsigned char *__restrict__ start)
{
    __shared__ float sk[CKPT_STRIDE][N];
    __shared__ float sq[CKPT_STRIDE][N];
    __shared__ float sv[CKPT_STRIDE][P];
    __shared__ float sc[CKPT_STRIDE][4];   // alpha, beta, gamma, (pad)
    scan_walk<TrainScan, STARTS, true>(seqlen, proj, k, q, dt, adt, lam, Dskip, ssm_in, kp_in, vp_in, ssm_out,
                                       kp_out, vp_out, ckpt, y, nullptr, start, sk, sq, sv, sc);
}
