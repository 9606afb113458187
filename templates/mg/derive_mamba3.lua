-- mg/derive_mamba3.lua: Mamba-3 SISO dims, the weights blob layout and the
-- launch shapes of the kernels. derive(spec, d) fills d (already holding the
-- common fields of mg/derive.lua) and returns it. Templates do no
-- arithmetic: every number they print comes from here.
--
-- Fields (HACKING.md "Template environment" is the contract; doc/math.md names):
--   dims     d.P (headdim), d.H (nheads = E/P), d.G (ngroups),
--            d.heads_per_group (H/G), d.S (n_angles = floor(N*rope_fraction)/2),
--            d.S2 (= 2S, rotated entries of k and q), d.GN (= G*N),
--            d.HN (= H*N), d.HS (= H*S), d.in_proj_out (NP = 2E+2GN+3H+S)
--            and the column offsets of its splits
--            d.split_{z,x,B,C,dd_dt,dd_A,trap,angles};
--            d.a_floor, d.a_activation ("heavy_tail" | "softplus"),
--            d.a_heavy_tail (boolean), d.outproj_norm (boolean)
--   state    floats per layer and sequence: d.ssm_state_per_seq (H*P*N),
--            d.k_prev_per_seq (H*N), d.v_prev_per_seq (H*P = E),
--            d.angle_per_seq (H*S)
--   weights  d.params, d.off, d.layer0, d.layer_stride, d.weights_total
--   launch   d.prep_threads, d.prep_warps, d.prep_n_per_lane,
--            d.angle_slices, d.angle_threads, d.angle_blocks (parallel angles,
--            forward and backward, inference and training),
--            d.scan_lanes, d.scan_npt, d.scan_rpt, d.scan_rowgroups,
--            d.scan_threads, d.scan_tchunk, d.scan_smem_bytes,
--            d.gate_threads, d.gate_warps, d.gate_vpl,
--            d.scan_kernel and the chunked scan (inference section below),
--            the single-token decode d.dec_* (decode section below)
--   tests    d.ref_macs_per_token (multiply-adds of the f64 reference per
--            token, to size the test cases)

local derive = require("mg.derive")

local M = {}

-- Layer tensors in blob order: key (in d.layer0), PyTorch suffix, shape.
-- The order is the contract with the reference (mg_ref_mamba3_layout,
-- HACKING.md "Weight blob layout (Mamba-3 SISO)").
local function layer_tensors(d)
  local t = {
    { "norm_w",      "norm.weight",           { d.D } },
    { "in_proj_w",   "mixer.in_proj.weight",  { d.in_proj_out, d.D } },
    { "dt_bias",     "mixer.dt_bias",         { d.H } },
    { "B_norm_w",    "mixer.B_norm.weight",   { d.N } },
    { "C_norm_w",    "mixer.C_norm.weight",   { d.N } },
    { "B_bias",      "mixer.B_bias",          { d.H, 1, d.N } },
    { "C_bias",      "mixer.C_bias",          { d.H, 1, d.N } },
    { "D",           "mixer.D",               { d.H } },
  }
  if d.outproj_norm then
    t[#t + 1] = { "norm_gate_w", "mixer.norm.weight", { d.E } }
  end
  t[#t + 1] = { "out_proj_w", "mixer.out_proj.weight", { d.D, d.E } }
  return t
end

function M.derive(spec, d)
  local m = spec.model
  d.P = m.headdim
  d.H = d.E // d.P
  d.G = m.ngroups
  d.heads_per_group = d.H // d.G
  d.S = math.floor(d.N * m.rope_fraction) // 2
  assert(d.S >= 1 and 2 * d.S <= d.N, "derive_mamba3: 1 <= n_angles <= d_state/2")
  d.S2 = 2 * d.S
  d.GN = d.G * d.N
  d.HN = d.H * d.N
  d.HS = d.H * d.S
  d.in_proj_out = 2 * d.E + 2 * d.G * d.N + 3 * d.H + d.S
  d.split_z = 0
  d.split_x = d.E
  d.split_B = 2 * d.E
  d.split_C = 2 * d.E + d.G * d.N
  d.split_dd_dt = 2 * d.E + 2 * d.G * d.N
  d.split_dd_A = d.split_dd_dt + d.H
  d.split_trap = d.split_dd_A + d.H
  d.split_angles = d.split_trap + d.H
  d.a_floor = m.a_floor
  d.a_activation = m.a_activation
  d.a_heavy_tail = m.a_activation == "heavy_tail"
  d.outproj_norm = m.outproj_norm

  d.ssm_state_per_seq = d.H * d.P * d.N
  d.k_prev_per_seq = d.H * d.N
  d.v_prev_per_seq = d.H * d.P
  d.angle_per_seq = d.H * d.S

  -- The weights blob; state_dict names without a prefix.
  d.params, d.off, d.layer0, d.layer_stride, d.weights_total =
    derive.blob_layout(d, layer_tensors(d), "")

  -- Prep (per token: BCNorm, per-head scalars, biased k and q for every
  -- head): one block of 128 threads (4 warps) per token. Warp w reduces the
  -- rms of groups w, w+4, ... (each lane prep_n_per_lane = ceil(N/32)
  -- entries, a fixed shuffle butterfly); then the block writes the H*N
  -- entries of k and q with consecutive threads on consecutive n
  -- (coalesced). 128 keeps several blocks resident per SM for any H*N.
  d.prep_threads = 128
  d.prep_warps = d.prep_threads // 32
  d.prep_n_per_lane = derive.ceil_div(d.N, 32)

  -- Angles + rotary, parallel over time: one block per (head, batch);
  -- thread (a, slice) owns angle a over one of angle_slices time slices
  -- (S is a power of two, 4..128). Pass 1 sums each slice's increments
  -- (f64), a fixed-order prefix over slices gives each slice its starting
  -- angle, pass 2 walks the slice as the reference does (add, wrap mod 2pi
  -- in f64). angle_slices = min(64, 1024/S): a whole block of at most 1024
  -- threads, and at most 64-way splits so the per-slice prefix stays short.
  -- (The first version walked all of t in one thread per (batch, head,
  -- angle): 4.0 ms of the 5.6 ms SSM core at batch 8, seqlen 4096.)
  d.angle_slices = math.min(64, 1024 // d.S)
  d.angle_threads = d.S * d.angle_slices
  d.angle_blocks = d.H
  -- The training forward runs the same kernel (angles.cuh.tmpl), and the
  -- backward the same grid: the local terms and a fixed-order suffix over
  -- slices. (Training first kept the sequential form: the angles forward
  -- and backward took most of the SSM core's fwd+bwd time.)

  -- Sequential scan: one block per (batch, head); the state Hs[P][N] lives
  -- in registers. scan_lanes threads share one row p of Hs, each owning
  -- scan_npt = N/scan_lanes entries n = lane + j*scan_lanes (interleaved,
  -- so the lanes of a row read consecutive shared-memory words: no bank
  -- conflicts). scan_lanes is the smallest power of two keeping
  -- scan_npt <= 16 (register pressure): N=64 -> 4 lanes, N=128 -> 8,
  -- N=256 -> 16. It divides 32, so a row's lanes sit in one warp and
  -- y[p] = sum_n Hs[p][n] q[n] reduces with shuffles. Each thread owns
  -- scan_rpt rows (p = rowgroup + r*scan_rowgroups): the smallest power of
  -- two keeping the block at <= 512 threads (P=64, N=128: 512 threads, one
  -- row each; P=32, N=64: 128 threads).
  local lanes = 1
  while d.N // lanes > 16 do lanes = lanes * 2 end
  d.scan_lanes = lanes
  d.scan_npt = d.N // lanes
  local rpt = 1
  while d.P * lanes // rpt > 512 do rpt = rpt * 2 end
  d.scan_rpt = rpt
  d.scan_rowgroups = d.P // rpt
  d.scan_threads = d.P * lanes // rpt
  assert(d.scan_threads % 32 == 0 or d.scan_threads < 32, "derive_mamba3: scan block")
  -- Per pass, scan_tchunk timesteps of k' [N], q' [N], v [P] and the
  -- scalars alpha, beta, gamma (+1 pad) are staged in shared memory by the
  -- whole block (coalesced): 32 timesteps, halved while the stage would
  -- exceed 32 KiB (under the 48 KiB static limit): N=64, P=32: 32 steps
  -- (21 KiB); N=128, P=64: 16 steps (20 KiB).
  local per_t = (2 * d.N + d.P + 4) * 4
  local tch = 32
  while tch * per_t > 32768 and tch > 1 do tch = tch // 2 end
  d.scan_tchunk = tch
  d.scan_smem_bytes = tch * per_t

  -- Gate (per token; y*silu(z), or per-head gated RMSNorm then silu(z)):
  -- one block of 128 threads per token, warp w handling heads w, w+4, ...;
  -- a head's P values are gate_vpl = ceil(P/32) per lane, reduced by a
  -- fixed shuffle butterfly (deterministic).
  d.gate_threads = 128
  d.gate_warps = d.gate_threads // 32
  d.gate_vpl = derive.ceil_div(d.P, 32)

  -- The SSM kernels emitted and the chunked scan's shapes: the inference
  -- section below (M.derive_inference).
  M.derive_inference(spec, d)
  M.derive_decode(d)

  -- Multiply-adds of the f64 reference per token (GEMMs, the SSM step
  -- 4*H*P*N, the per-head k/q maps), to size the test cases.
  d.ref_macs_per_token = d.L * (d.in_proj_out * d.D + d.D * d.E + 4 * d.H * d.P * d.N
    + 4 * d.H * d.N + 2 * d.D) + d.input_dim * d.D + d.D
  if d.training then M.derive_training(d) end
  return d
end

-- ===========================================================================
-- Inference section (forward performance: low-precision GEMM weights, the
-- chunked scan), kept apart from the other sections.
-- Fields:
--   d.lowp              true for bf16/f16 storage: the model owns a copy of
--                       the blob in act_t (same offsets, in elements) from
--                       which every layer GEMM reads its weights
--   d.convert_threads, d.convert_blocks_max   launch shape of that conversion
--   d.scan_emit_chunked the chunked scan kernel exists: scan.mode chunked, or
--                       auto when max_seq_len reaches d.scan_auto_min_len
--   d.scan_mode_id      0 sequential | 1 chunked | 2 auto (host dispatch)
--   d.scan_auto_min_len auto: prefills with seqlen >= this use the chunked
--                       scan = max(AUTO_SEQUENTIAL_MAX_LEN + 1, 4*chunk). The
--                       sequential kernel runs one block per (batch, head) for
--                       T dependent steps of ~4 flops per state entry and
--                       nothing to amortise; the chunked kernel spends ~2.5x
--                       the flops (the Q x Q intra-chunk products) but on
--                       tensor cores / register tiles, and stages whole chunks.
--                       Below 4 chunks its per-chunk fixed cost (4 block
--                       barriers, the prefix sum) is not repaid, and up to 256
--                       steps the single pass costs a few microseconds.
--   d.scan_kernel       "sequential" | "chunked" (the prefill kernel of the
--                       spec's mode; decode steps always run the sequential one)
--   d.chunk_vs_seq_tol  rel-L2 bound of chunked vs sequential (f32 1e-5;
--                       bf16/f16 d.check_tol: the chunked kernel's tensor-core
--                       operands are rounded to the storage dtype; f32 with
--                       allow_tf32 d.check_tol: a flip of a TF32 GEMM input)
--   chunked kernel (one block per (batch, head), chunks in order, state in
--   registers; kernels.cu.tmpl "chunked scan" has the design):
--   d.ck_engine         "fma" (f32: plain f32 FMA on 16x8x16 tiles, no TF32)
--                       | "mma_bf16" | "mma_f16" (mma.sync m16n8k16, f32 acc)
--   d.ck_op_t           C type of the staged operands (float | act_t)
--   d.ckb_dkq_t, d.ckb_dkq_size  C type and bytes of the chunked backward's
--                       per-head dk, dq rows (float for f32, else bf16)
--   d.ck_chunk          chunk length Q of the kernel: the spec's chunk, halved
--                       while the shared memory would exceed M.CK_SMEM_MAX (the
--                       chunked form is exact for any Q; only f32 with large
--                       N*P shrinks it)
--   d.ck_threads_source "default" | "tuned" (the tune cache's block size)
--   d.ck_warps, d.ck_threads   block: warps such that the state tile per
--                       thread P*N/(32*warps) stays <= 64 registers (8 warps,
--                       more for P*N > 16384, fewer when P*N/128 < 8)
--   d.ck_nw             state columns (n) per warp: the P x N state is split
--                       in (P/16) x (N/ck_nw) tiles, one per warp
--   d.ck_pw             output columns (p) per output work item; items are
--                       (Q/16 row tiles) x (P/ck_pw), d.ck_ny of them, looped
--                       over by the warps
--   d.ck_pad            padding (elements) of every staged row: 16 bytes, so
--                       fragment loads of 8 rows x 4 words hit 32 banks
--   d.ck_ldn, d.ck_ldq, d.ck_ldw   row strides: N+pad, Q+pad, 16+pad
--   d.ck_smem_bytes     dynamic shared memory of a block
--   d.ck_min_blocks     blocks per SM of __launch_bounds__ (1 or 2)
-- ===========================================================================
-- Largest dynamic shared memory the chunked kernel may ask for, per target,
-- and the shared memory of one SM (two blocks fit when both do): the
-- per-target tables of mg/derive.lua (SMEM_BLOCK_MAX, SM_SMEM).
M.CK_SMEM_MAX = derive.SMEM_BLOCK_MAX
M.SM_SMEM = derive.SM_SMEM

-- The chunked kernel's shared memory in bytes for chunk q and `warps`
-- warps: the staged tiles (rows padded by 16 bytes of the operand type
-- d.ck_es against bank conflicts) and 7q + 4 floats of per-step scalars.
local function ck_smem(d, q, warps)
  local pad = 16 // d.ck_es
  local ldn, ldq, ldw = d.N + pad, q + pad, 16 + pad
  local elems = 2 * q * ldn + d.N * ldq + d.P * ldq + d.P * ldn + warps * 16 * ldw
  return elems * d.ck_es + (7 * q + 4) * 4
end

-- The chunked kernel's output items and blocks per SM for chunk q, `warps`
-- warps (`threads` threads) and smem_bytes of shared memory: pw, ny and
-- min_blocks.
--   output items: the widest p-split (<= 64 columns, a multiple of 8
--   dividing P) that still gives every warp an item;
--   blocks per SM the kernel is compiled for (__launch_bounds__ minimum):
--   2 for the tensor-core engines when two blocks' shared memory fits in the
--   SM's (M.SM_SMEM, 1 KiB each reserved) and the block is <= 256 threads (128
--   registers per thread), else 1 (up to 255 registers: no spills of the
--   state tile).
local function ck_items(d, q, warps, threads, smem_bytes)
  local pw = math.min(d.P, 64)
  while pw > 8 and (q // 16) * (d.P // pw) < warps do pw = pw // 2 end
  local min_blocks = (d.ck_engine ~= "fma" and threads <= 256 and
    2 * (smem_bytes + 1024) <= (M.SM_SMEM[d.sm] or M.SM_SMEM[80])) and 2 or 1
  return pw, (q // 16) * (d.P // pw), min_blocks
end

function M.derive_inference(spec, d)
  d.lowp = d.dtype ~= "f32"
  d.convert_threads = 256
  d.convert_blocks_max = 1024
  d.scan_auto_min_len = math.max(derive.AUTO_SEQUENTIAL_MAX_LEN + 1, 4 * d.chunk_size)
  d.scan_emit_chunked, d.scan_mode_id = derive.scan_choice(spec.scan.mode, d.max_seq_len, d.scan_auto_min_len)
  d.scan_kernel = d.scan_mode_id == 1 and "chunked" or (d.scan_mode_id == 2 and "auto" or "sequential")
  d.chunk_vs_seq_tol = (d.lowp or d.tf32) and d.check_tol or 1e-5

  -- The chunked backward's per-head dk, dq rows [tokens][H][N], which
  -- prep_bwd sums over a group's heads: f32 for f32 storage; bf16 for both
  -- 16-bit dtypes (their largest per-token arrays: 16-bit halves the
  -- traffic of both kernels; bf16, not f16, for the range a scaled loss's
  -- gradients need). Their per-tile sums (the bias gradients) stay f32.
  d.ckb_dkq_t = d.dtype == "f32" and "float" or "__nv_bfloat16"
  d.ckb_dkq_size = d.dtype == "f32" and 4 or 2
  if d.dtype == "f32" then
    d.ck_engine, d.ck_op_t, d.ck_es = "fma", "float", 4
  elseif d.dtype == "bf16" then
    d.ck_engine, d.ck_op_t, d.ck_es = "mma_bf16", "__nv_bfloat16", 2
  else
    d.ck_engine, d.ck_op_t, d.ck_es = "mma_f16", "__half", 2
  end
  local PN = d.P * d.N
  local warps = math.max(8, PN // 2048)
  warps = math.min(warps, 16, PN // 128)
  -- `chunk_size: auto` with a tune-cache entry: the block size mamba-tune
  -- measured best with that chunk, when it splits the state tile evenly
  -- (whole 8-column groups of N per warp).
  d.ck_threads_source = "default"
  local tt = d.tuned and d.tuned.source == "tuned" and d.tuned.scan_threads
  if tt and tt % 32 == 0 then
    local tw = tt // 32
    local nw = PN % (16 * tw) == 0 and PN // (16 * tw) or 0
    if tw >= 1 and tw <= 32 and nw > 0 and nw % 8 == 0 and d.N % nw == 0 then
      warps = tw
      d.ck_threads_source = "tuned"
    end
  end
  d.ck_warps = warps
  d.ck_threads = 32 * warps
  d.ck_nw = PN // (16 * warps)
  assert(d.ck_nw % 8 == 0 and d.N % d.ck_nw == 0 and (d.P // 16) * (d.N // d.ck_nw) == warps,
    "derive_mamba3: chunked state split")
  d.ck_pad = 16 // d.ck_es
  d.ck_ldn = d.N + d.ck_pad
  d.ck_ldw = 16 + d.ck_pad
  local q = d.chunk_size
  local smax = M.CK_SMEM_MAX[d.sm] or M.CK_SMEM_MAX[80]
  while q > 16 and ck_smem(d, q, warps) > smax do q = q // 2 end
  d.ck_chunk = q
  d.ck_ldq = q + d.ck_pad
  d.ck_smem_bytes = ck_smem(d, q, warps)
  d.ck_pw, d.ck_ny, d.ck_min_blocks = ck_items(d, q, warps, d.ck_threads, d.ck_smem_bytes)
  d.ck_max_chunks = derive.ceil_div(d.max_seq_len, q)
  M.ck_fused(d)
  return d
end

-- The fused inference kernel (kernels/mamba3/chunked_fused.cuh: prep,
-- angles, the chunked scan and the gate in one launch, for prefill and
-- burn-in), on the chunked kernel's shape (d.ck_*):
--   d.ck_fused          emitted: the chunked scan is, the angle threads fit
--                       the block (S <= ck_threads) and its shared memory
--                       fits the target; else prefill runs the four kernels
--   d.ck_ldy            row stride (floats) of its f32 output tile Y [Q][P]:
--                       P + 4 (16 bytes of padding)
--   d.ck_yt             floats of its Y tile, which holds the stage's tanh
--                       tile [Q][S] before the outputs: Q * max(ck_ldy, S)
--   d.ck_asl            angle slices: thread (a, sl) owns angle a over slice
--                       sl, ck_threads // S slices
--   d.ck_asteps         steps per slice = ceil(Q / ck_asl)
--   d.ck_fused_smem_bytes  the chunked kernel's shared memory + Y/tanh, the
--                       per-step dt, lambda, 1/rms(B), 1/rms(C) (4 Q + 8
--                       floats) and the f64 slice sums and carried angles
--   d.ck_fused_min_blocks  blocks per SM of its __launch_bounds__ (as for
--                       the chunked kernel, with its own shared memory)
--   d.seg_slots, d.seg_ws_bytes   its segment form (sequences split in
--                       segments run side by side when batch x H blocks
--                       cannot fill the GPU): workspace slots (sequence,
--                       head, segment) and bytes (a P x N f32 state, two f64
--                       angles per rotary pair and an f32 decay per slot),
--                       then the per-token rows of every call (the fused
--                       form's token prologue)
--   d.seg_aux_w          floats per token row of that prologue: 1/rms of
--                       each group's B and C, tanh of the angle inputs
--                       (2G + S)
function M.ck_fused(d)
  local q = d.ck_chunk
  d.ck_ldy = d.P + 4
  d.ck_asl = math.max(1, d.ck_threads // d.S)
  d.ck_asteps = derive.ceil_div(q, d.ck_asl)
  d.ck_yt = q * math.max(d.ck_ldy, d.S)
  d.ck_fused_smem_bytes = d.ck_smem_bytes + 4 * (d.ck_yt + 4 * q + 8) + 8 * (d.ck_asl * d.S + d.S)
  local smax = M.CK_SMEM_MAX[d.sm] or M.CK_SMEM_MAX[80]
  d.ck_fused = d.scan_emit_chunked and d.S <= d.ck_threads and d.ck_fused_smem_bytes <= smax
  local _, _, mb = ck_items(d, q, d.ck_warps, d.ck_threads, d.ck_fused_smem_bytes)
  d.ck_fused_min_blocks = mb
  -- its segment form: (sequence, head, segment) slots of the workspace,
  -- enough for 2 blocks on each of 256 SMs; a call with batch x H slots
  -- or more runs whole sequences
  d.seg_slots = d.ck_fused and 512 or 0
  -- and the token prologue's rows (what every head's block would otherwise
  -- compute again from the same in_proj row), for max_tokens tokens
  d.seg_aux_w = 2 * d.G + d.S
  d.seg_ws_bytes = d.seg_slots * (d.P * d.N * 4 + 16 * d.S + 4)
      + (d.ck_fused and d.max_tokens * d.seg_aux_w * 4 or 0)
  return d
end

-- ===========================================================================
-- Decode section: the single-token step of kernels/mamba3/decode.cuh (a
-- decode step of batch <= d.dec_max_batch runs in-proj GEMV, mixer, out-proj
-- GEMV per layer instead of cuBLAS + the prefill kernels at seqlen 1).
--   d.dec_max_batch     the largest batch that takes it: min(max_batch,
--                       M.DEC_MAX_BATCH). The GEMVs read every weight once for
--                       all rows but do batch x the FMAs and shared-memory
--                       reads per weight, so past some batch cuBLAS's
--                       GEMMs win. 16: on the H200 (bench/results/
--                       h200-2026-12-05c.txt, mamba3_rl) the GEMV step took
--                       0.046 ms at batch 8 and the cuBLAS path 0.40 ms at
--                       16 (0.15 ms at 32): the cuBLAS path at 16 rows is
--                       the slow one by far; where the two cross above 16
--                       is not measured yet
--   d.dec_nb_max        rows the widest GEMV instance is compiled for: the
--                       power of two >= dec_max_batch (instances 1, 2, 4, ..)
--   d.dec_vw            elements per 16-byte weight load (16 / act_size)
--   d.dec_threads, d.dec_warps   GEMV block: 256 threads, 8 warps
--   d.dec_blocks_target  the grid the GEMV shapes aim at: about one block
--                       per SM (M.dec_blocks_target(d.sms))
--   d.dec_mix_threads   mixer block (one per (head, sequence)): the sequential
--                       scan's thread layout (scan_threads), at least a warp
--   per GEMV, prefix d.dec_in_ (in_proj, rows NP, K = D, input RMSNorm fused)
--   and d.dec_out_ (out_proj, rows D, K = E, += into the residual):
--     _rw     output rows per warp (4, halved while the grid has fewer than
--             d.dec_blocks_target blocks)
--     _ks     warps sharing a row, splitting K (1, doubled likewise up to 8:
--             small models still fill the GPU)
--     _rpb    rows per block = (dec_warps / ks) * rw
--     _blocks grid = ceil(rows / rpb)
--     _kt     K elements staged in shared memory per pass: the largest
--             divisor of K, a multiple of dec_vw, with at most
--             M.DEC_VEC_INFLIGHT / rw 16-byte loads per lane and row in flight
--             and dec_nb_max * kt * act_size <= M.DEC_STAGE_BYTES
--     _vpl    16-byte vectors per lane and row per pass = ceil(kt/vw/(32 ks))
--     _smem_bytes  static shared memory (stage + the K-split partials)
-- ===========================================================================
M.DEC_MAX_BATCH = 16
-- d.dec_blocks_target: about one GEMV block per SM, the SM count (d.sms)
-- rounded down to a multiple of 8 (132 -> 128, H100/H200 SXM; 108 -> 104;
-- 80 -> 80), at least 8
function M.dec_blocks_target(sms)
  return math.max(8, sms - sms % 8)
end
M.DEC_VEC_INFLIGHT = 16       -- 16-byte weight loads in flight per lane
M.DEC_STAGE_BYTES = 32 * 1024

local function dec_gemv(d, rows, K)
  local g = {}
  local function blocks(rw, ks) return derive.ceil_div(rows, (d.dec_warps // ks) * rw) end
  local rw, ks = 4, 1
  while rw > 1 and blocks(rw, ks) < d.dec_blocks_target do rw = rw // 2 end
  while ks < d.dec_warps and blocks(rw, ks) < d.dec_blocks_target do ks = ks * 2 end
  g.rw, g.ks = rw, ks
  g.rpb = (d.dec_warps // ks) * rw
  g.blocks = blocks(rw, ks)
  local ktmax = math.min(d.dec_vw * 32 * ks * (M.DEC_VEC_INFLIGHT // rw),
                         M.DEC_STAGE_BYTES // (d.dec_nb_max * d.act_size))
  local nt = 1
  while K % nt ~= 0 or (K // nt) % d.dec_vw ~= 0 or K // nt > ktmax do nt = nt + 1 end
  g.kt = K // nt
  g.vpl = derive.ceil_div(g.kt // d.dec_vw, 32 * ks)
  g.smem_bytes = d.dec_nb_max * g.kt * d.act_size + 4 * ks * g.rpb * d.dec_nb_max
  assert(g.smem_bytes <= 48 * 1024, "derive_mamba3: decode GEMV shared memory")
  return g
end

function M.derive_decode(d)
  d.dec_max_batch = math.min(d.max_batch, M.DEC_MAX_BATCH)
  d.dec_nb_max = derive.next_pow2(d.dec_max_batch)
  d.dec_vw = 16 // d.act_size
  d.dec_threads = 256
  d.dec_warps = d.dec_threads // 32
  d.dec_mix_threads = math.max(32, d.scan_threads)
  d.dec_blocks_target = M.dec_blocks_target(d.sms)
  local gemvs = { { "dec_in_", dec_gemv(d, d.in_proj_out, d.D) }, { "dec_out_", dec_gemv(d, d.D, d.E) } }
  for _, pg in ipairs(gemvs) do
    for _, k in ipairs({ "rw", "ks", "rpb", "blocks", "kt", "vpl", "smem_bytes" }) do d[pg[1] .. k] = pg[2][k] end
  end
  return d
end

-- ===========================================================================
-- Training section (backward + AdamW), used by mamba3/backward.cu.tmpl,
-- train.c.tmpl, train.h.tmpl and train_test.c.tmpl (spec.emit.training only).
-- The fields above are not changed here.
--   d.bscan_lanes, d.bscan_npt   lanes sharing a row of Hs and states per
--                     lane in the training scans (forward-for-training and
--                     backward): the forward scan's (N/lanes <= 16)
--   d.bscan_rpt       rows of Hs per thread: the smallest power of two
--                     keeping the block at <= 256 threads (the backward
--                     holds the state, its gradient and three column sums
--                     per thread)
--   d.bscan_rowgroups = P / bscan_rpt; d.bscan_threads = rowgroups * lanes;
--   d.bscan_warps     = ceil(bscan_threads / 32)
--   d.bscan_nw        = ceil(N / bscan_threads): column entries n per thread
--                       in the per-step column sums (dq', dk')
--   d.bscan_tchunk    checkpoint stride (CKPT_STRIDE in NAME_backward.cu):
--                     the forward-for-training saves Hs
--                     every bscan_tchunk steps; the backward recomputes the
--                     chunk's states forward from the checkpoint (never by
--                     dividing by alpha) into a per-thread
--                     [bscan_tchunk+1][rpt][npt] array: 16, halved while
--                     bscan_tchunk*rpt*npt > 256 floats or the shared memory
--                     of the backward scan exceeds 46 KiB
--   d.bscan_smem_bytes shared memory of the backward scan: staged k' and v
--                     (bscan_tchunk+1 steps: the token before the chunk), q',
--                     dy (bscan_tchunk steps), 8 scalars per step, and the
--                     per-warp column sums [bscan_warps][3N+4]
--   d.max_ckpts       checkpoints per sequence = ceil(max_seq_len/bscan_tchunk)
--   d.normb_rows      tokens per block of every per-token two-stage reduction
--                     (RMSNorm weights, gate norm, biases, BCNorm weights);
--                     d.normb_max_blocks = ceil(max_tokens / normb_rows)
--   d.part_width      widest partial row: max(D, E, H*N, in_dim)
--   d.red_threads     block of the elementwise / reduction kernels
--   d.gnorm_blocks    first-stage blocks of the gradient norm and MSE sums
--   d.gateb_warps     the gate backward's block (warps): two heads a
--                     warp, clamp(ceil(H/2), gate_warps, 16) warps. With the
--                     forward gate's 4 warps each warp held ceil(H/4) heads'
--                     values of every per-token array (mamba3_perf: 8 heads,
--                     124 registers, a quarter of the SM's threads; 16 warps
--                     of 2 heads: 48 registers, the kernel -15% on an H100).
--                     One head a warp was slower where H <= 8 (mamba3_rl: 8
--                     warps of 1 head +15%), so no fewer than 2 heads a warp
--                     and no fewer than 4 warps. The heads' arithmetic does
--                     not depend on the warp that does it.
--   d.gate_hpw        heads per warp of the gate backward = ceil(H/gateb_warps)
--   d.layers_begin, d.layers_end   blob range of the layers (floats)
--   d.adamw_layer, d.adamw_global  tensor ranges {lo, hi, cls, len} (layer-
--                     relative / absolute); cls 1 = weight matrix
--                     (input_proj, in_proj, out_proj .weight), 2 = the rest
--   d.grad_tol        rel-L2 of every gradient vs the f64 reference:
--                     f32 1e-4, bf16 5e-2, f16 1e-2
--   chunked SSM backward (kernels/mamba3/chunked_bwd.cuh has the design;
--   emitted with the chunked forward, d.scan_emit_chunked; NAME_backward.cu
--   names its shape CKB_*):
--   d.ckb_emit        whether the kernel is emitted (not when even 16-step
--                     chunks exceed the shared memory: d.ckb_why says so)
--   d.ckb_chunk       its chunk length Q: the spec's chunk_size, halved while
--                     the shared memory exceeds M.CK_SMEM_MAX (a multiple of
--                     bscan_tchunk: a chunk starts at a checkpoint)
--   d.ckb_warps, d.ckb_threads  block: the forward's default rule (the
--                     adjoint tile P*N/(32*warps) <= 64 registers)
--   d.ckb_nw          adjoint columns per warp: (P/16) x (N/ckb_nw) tiles
--   d.ckb_cw          output columns per work item of dq', dk', dv (16 rows
--                     x ckb_cw columns): min(32, P, N)
--   d.ckb_ldn, d.ckb_ldp, d.ckb_ldq  staged row strides: N, P, Q + 16 bytes
--   d.ckb_yvp         partials of dy_t . v_t per token: max(1, P/32)
--   d.ckb_ye_in_m     E dY (phase F's operand, [Q][ldp]) is staged where M
--                     and W were ([2][Q][ldq]: dead by then) when it fits
--                     there (ldp <= 2 ldq), else in a buffer of its own
--   d.ckb_floats      f32 scratch of a block (per-token scalars and the
--                     fixed-order partial sums), d.ckb_smem_bytes in all
--   d.ckb_min_blocks  blocks per SM the kernel is compiled for
--                     (__launch_bounds__ minimum): 2 when two blocks' shared
--                     memory fits the SM's (M.SM_SMEM, 1 KiB each reserved)
--                     and the block is <= 256 threads (128 registers per
--                     thread), else 1. Why: one block walks all chunks of a
--                     (sequence, head) and waits on its staging and its
--                     one-warp phases; a second block on the SM fills those
--                     waits (mamba3_perf: 256 blocks, 1.94 waves of one per SM)
--   d.ckb_fwd         the chunked forward kernel's fields (M.ck_variant) for
--                     chunk ckb_chunk: the forward for training of the
--                     chunked path, which saves the state entering every chunk
-- ===========================================================================
local MATRIX = { input_proj_w = true, in_proj_w = true, out_proj_w = true }
function M.derive_training(d)
  d.bscan_lanes = d.scan_lanes
  d.bscan_npt = d.scan_npt
  local rpt = 1
  while d.P * d.bscan_lanes // rpt > 256 do rpt = rpt * 2 end
  d.bscan_rpt = rpt
  d.bscan_rowgroups = d.P // rpt
  d.bscan_threads = d.bscan_rowgroups * d.bscan_lanes
  d.bscan_warps = derive.ceil_div(d.bscan_threads, 32)
  d.bscan_nw = derive.ceil_div(d.N, d.bscan_threads)
  local function smem(bt)
    return 4 * ((bt + 1) * d.N + bt * d.N + (bt + 1) * d.P + bt * d.P + 8 * bt
      + d.bscan_warps * (3 * d.N + 4))
  end
  local bt = 16
  while bt > 1 and bt * rpt * d.bscan_npt > 256 do bt = bt // 2 end
  while bt > 1 and smem(bt) > 46 * 1024 do bt = bt // 2 end
  assert(smem(bt) <= 48 * 1024, "derive_mamba3: backward scan shared memory")
  d.bscan_tchunk = bt
  d.bscan_smem_bytes = smem(bt)
  d.max_ckpts = derive.ceil_div(d.max_seq_len, bt)
  M.derive_ckb(d)
  d.normb_rows = 16
  d.normb_max_blocks = derive.ceil_div(d.max_tokens, d.normb_rows)
  d.part_width = math.max(d.D, d.E, d.HN, d.in_dim)
  d.red_threads = 256
  d.gnorm_blocks = 256
  d.gateb_warps = math.min(16, math.max(d.gate_warps, derive.ceil_div(d.H, 2)))
  d.gate_hpw = derive.ceil_div(d.H, d.gateb_warps)
  derive.training_common(d, MATRIX)
  return d
end

-- The chunked SSM backward's shape (see derive_training's header).
function M.derive_ckb(d)
  d.ckb_emit = d.scan_emit_chunked and true or false
  if not d.ckb_emit then
    d.ckb_chunk = 0
    return d
  end
  local PN = d.P * d.N
  local warps = math.min(math.max(8, PN // 2048), 16, PN // 128)
  d.ckb_warps = warps
  d.ckb_threads = 32 * warps
  d.ckb_nw = PN // (16 * warps)
  assert(d.ckb_nw % 8 == 0 and d.N % d.ckb_nw == 0, "derive_mamba3: chunked backward adjoint split")
  d.ckb_cw = math.min(32, d.P, d.N)
  d.ckb_yvp = math.max(1, d.P // 32)   -- partials of dy_t . v_t per token (one per warp-wide slice of a row)
  local pad = 16 // d.ck_es
  d.ckb_ldn, d.ckb_ldp = d.N + pad, d.P + pad
  local function floats(q)
    return q * (13 + d.ckb_yvp + 3 * (q // 16) + 2 * (d.N // d.ckb_cw)) + warps + 16
  end
  local function ye_in_m(q) return d.ckb_ldp <= 2 * (q + pad) end
  local function smem(q)
    local ldq = q + pad
    local elems = 2 * q * d.ckb_ldn + (ye_in_m(q) and 2 or 3) * q * d.ckb_ldp + 2 * d.P * d.ckb_ldn + 2 * q * ldq
    return elems * d.ck_es + 4 * floats(q)
  end
  local q = d.chunk_size
  local smax = M.CK_SMEM_MAX[d.sm] or M.CK_SMEM_MAX[80]
  while q > 16 and smem(q) > smax do q = q // 2 end
  if smem(q) > smax then
    -- the staged state and adjoint alone exceed the shared memory (f32
    -- with P*N >= 128*256): the training SSM stays sequential
    d.ckb_emit, d.ckb_chunk = false, 0
    d.ckb_why = string.format("it needs %d bytes of shared memory per block even in %d-step chunks, over the %d of sm_%d",
                              smem(q), q, smax, d.sm)
    return d
  end
  assert(q % d.bscan_tchunk == 0, "derive_mamba3: backward chunk is not a whole number of checkpoints")
  d.ckb_chunk = q
  d.ckb_ldq = q + pad
  d.ckb_ye_in_m = ye_in_m(q)
  d.ckb_floats = floats(q)
  d.ckb_smem_bytes = smem(q)
  d.ckb_min_blocks = (d.ckb_threads <= 256 and
    2 * (d.ckb_smem_bytes + 1024) <= (M.SM_SMEM[d.sm] or M.SM_SMEM[80])) and 2 or 1
  -- the forward for training of the chunked path: the chunked forward
  -- kernel with chunk ckb_chunk (its state at every chunk start is the
  -- backward's checkpoint) and the forward's block size
  d.ckb_fwd = M.ck_variant(d, q, d.ck_warps) or M.ck_variant(d, q, warps)
  assert(d.ckb_fwd, "derive_mamba3: no chunked forward shape for the backward's chunk")
  return d
end

-- ===========================================================================
-- Autotuning section (mg/tune.lua, doc/tuning.md). Used by the tuner; the
-- fields above are not changed here.
--   M.ck_variant(d, q, warps)  the chunked kernel's shape for chunk length q
--                     and `warps` warps per block, with the arithmetic of
--                     derive_inference (state split, padding, shared memory,
--                     output items, blocks per SM): a table of the ck_*
--                     fields, or nil and why when that shape cannot exist
--                     (state tile not a multiple of 8 columns, more than 64
--                     state registers per thread, shared memory over
--                     M.CK_SMEM_MAX, a block over 1024 threads). q is not
--                     shrunk: a chunk that does not fit is left out. For
--                     d.ck_warps and d.ck_chunk it gives exactly the fields
--                     derive_inference chose (mg/tune.lua checks that).
-- ===========================================================================
function M.ck_variant(d, q, warps)
  local PN = d.P * d.N
  if warps < 1 or 32 * warps > 1024 then return nil, "block over 1024 threads" end
  if q < 16 or q % 16 ~= 0 then return nil, "chunk not a multiple of 16" end
  if PN % (16 * warps) ~= 0 then return nil, "state does not split into 16-row tiles" end
  local nw = PN // (16 * warps)
  if nw % 8 ~= 0 or d.N % nw ~= 0 or (d.P // 16) * (d.N // nw) ~= warps then
    return nil, string.format("state tile of %d columns", nw)
  end
  if PN // (32 * warps) > 64 then
    return nil, string.format("%d state registers per thread (> 64)", PN // (32 * warps))
  end
  local v = { ck_warps = warps, ck_threads = 32 * warps, ck_nw = nw, ck_pad = 16 // d.ck_es }
  v.ck_ldn = d.N + v.ck_pad
  v.ck_ldw = 16 + v.ck_pad
  v.ck_ldq = q + v.ck_pad
  v.ck_chunk = q
  v.ck_smem_bytes = ck_smem(d, q, warps)
  local smax = M.CK_SMEM_MAX[d.sm] or M.CK_SMEM_MAX[80]
  if v.ck_smem_bytes > smax then
    return nil, string.format("%d bytes of shared memory (> %d)", v.ck_smem_bytes, smax)
  end
  v.ck_pw, v.ck_ny, v.ck_min_blocks = ck_items(d, q, warps, v.ck_threads, v.ck_smem_bytes)
  return v
end

return M
