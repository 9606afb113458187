-- mg/derive_mamba1.lua: Mamba-1 dims, the weights blob layout and the launch
-- shapes of the kernels. derive(spec, d) fills d (already holding the common
-- fields of mg/derive.lua) and returns it.
--
-- Fields (HACKING.md "Template environment" is the contract):
--   dims     d.K (d_conv), d.R (dt_rank; auto = ceil(D/16)), d.XP (= R+2N,
--            x_proj outputs); helpers so templates need no arithmetic:
--            d.E2 (= 2E, in_proj outputs), d.Km1 (= K-1, conv state taps),
--            d.xp_B (= R, first B column of x_proj's output), d.xp_C (= R+N),
--            d.conv_state_per_seq (= E*(K-1) floats), d.ssm_state_per_seq (= E*N)
--   weights  d.params, d.off, d.layer0, d.layer_stride, d.weights_total
--   launch   d.conv_threads, d.conv_blocks, d.conv_tile, d.conv_max_tiles
--            (the conv: see the comment at d.conv_threads), d.scan_lanes
--            (+ d.scan_lanes_source "default" | "tuned"), d.scan_npt,
--            d.scan_threads (+ d.scan_threads_source "default" | "tuned"),
--            d.scan_channels, d.scan_blocks, d.scan_tchunk, d.scan_stage_w,
--            d.scan_base_lanes, d.scan_base_channels, d.scan_base_blocks (the
--            shape the scan backward starts from and the auto rule counts),
--            d.scan_fuse_dt (dt_proj computed inside the inference scan),
--            d.cxp_fuse, d.cxp_max_tokens, d.cxp_why (the fused conv +
--            x_proj kernel of prefill: see the comment at d.cxp_fuse)
--            (floats per staged timestep), d.scan_smem_bytes (M.scan_stage)

local derive = require("mg.derive")

local M = {}

-- Layer tensors in blob order: key (in d.layer0), PyTorch suffix, shape.
-- The order is the contract with the reference (mg_ref_mamba1_layout).
local function layer_tensors(d)
  return {
    { "norm_w",     "norm.weight",            { d.D } },
    { "in_proj_w",  "mixer.in_proj.weight",   { 2 * d.E, d.D } },
    { "conv_w",     "mixer.conv1d.weight",    { d.E, 1, d.K } },
    { "conv_b",     "mixer.conv1d.bias",      { d.E } },
    { "x_proj_w",   "mixer.x_proj.weight",    { d.R + 2 * d.N, d.E } },
    { "dt_proj_w",  "mixer.dt_proj.weight",   { d.E, d.R } },
    { "dt_proj_b",  "mixer.dt_proj.bias",     { d.E } },
    { "A_log",      "mixer.A_log",            { d.E, d.N } },
    { "D",          "mixer.D",                { d.E } },
    { "out_proj_w", "mixer.out_proj.weight",  { d.D, d.E } },
  }
end

-- The scan's shared-memory stage (kernels/mamba1/scan_body.cuh,
-- scan_stage) for d_state N and `channels` channels per block: a row per
-- timestep of B | C (2N floats) and the block's xc, dt and z (3 * channels),
-- tchunk rows: 32 timesteps, halved while the stage would exceed 40 KiB (it
-- is the kernels' only large static shared array, under the 48 KiB limit).
-- Returns tchunk, the row width in floats, the bytes.
function M.scan_stage(N, channels)
  local w = 2 * N + 3 * channels
  local tchunk = 32
  while tchunk > 1 and tchunk * w * 4 > 40960 do tchunk = tchunk // 2 end
  return tchunk, w, tchunk * w * 4
end

-- The bound of the scan body's per-thread state arrays (NPT_MAX of
-- kernels/mamba1/scan_body.cuh's policies): the default lane count keeps
-- N / lanes within it, and so must a tuned one.
M.SCAN_NPT_MAX = 16
-- The default lane count's parallelism target: about 16 warps on each of
-- an H200's 132 SMs (2^16 threads), and the fewest states per thread it
-- spreads a channel down to.
M.SCAN_TARGET_THREADS = 65536
-- The most dt_proj columns a fused-dt scan keeps in registers (scan_body.cuh
-- SCAN_FDT_RMAX).
M.SCAN_FDT_RMAX = 16
M.SCAN_NPT_SPREAD = 4

-- Whether `lanes` threads can share one channel of the scan at d_state N:
-- a power of two dividing 32 and N (a channel's lanes sit in one warp and
-- reduce y with xor shuffles), leaving at most SCAN_NPT_MAX states per
-- thread. -> true, or false and why.
function M.scan_lanes_ok(N, lanes)
  if math.type(lanes) ~= "integer" or lanes < 1 or lanes > 32 or lanes & (lanes - 1) ~= 0 then
    return false, "lanes per channel must be a power of two from 1 to 32"
  end
  if N % lanes ~= 0 then return false, string.format("%d lanes do not divide d_state %d", lanes, N) end
  if N // lanes > M.SCAN_NPT_MAX then
    return false, string.format("%d lanes leave %d states per thread (at most %d)", lanes, N // lanes,
      M.SCAN_NPT_MAX)
  end
  return true
end

function M.derive(spec, d)
  local m = spec.model
  d.K = m.d_conv
  d.R = (m.dt_rank == "auto") and derive.ceil_div(d.D, 16) or m.dt_rank
  d.XP = d.R + 2 * d.N
  d.E2 = 2 * d.E
  d.Km1 = d.K - 1
  d.xp_B = d.R
  d.xp_C = d.R + d.N
  d.conv_state_per_seq = d.E * (d.K - 1)
  d.ssm_state_per_seq = d.E * d.N

  -- The weights blob; state_dict names under "backbone." (Hugging Face Mamba-1).
  d.params, d.off, d.layer0, d.layer_stride, d.weights_total =
    derive.blob_layout(d, layer_tensors(d), "backbone.")

  -- Causal conv: one thread per (channel, time tile), conv_blocks blocks of
  -- conv_threads channels per tile (grid: batch x tiles, conv_blocks). 128
  -- threads keeps several blocks per sequence for small E (better spread over
  -- the SMs at small batch); from E = 2048 on there are enough blocks and 256
  -- halves the block count.
  d.conv_threads = (d.E < 2048) and 128 or 256
  d.conv_blocks = derive.ceil_div(d.E, d.conv_threads)
  -- conv_tile: time steps per thread of the prefill and training conv
  -- kernels. A thread loads its tile's inputs and the K-1 before it into
  -- registers at once (all loads in flight together), so a sequence is
  -- ceil(seqlen / conv_tile) independent tiles rather than one serial walk.
  -- 16: the re-read window (K-1 <= 7 inputs; the training backward also
  -- recomputes the K-1 steps after its tile) stays a small share of the
  -- tile, the register arrays stay small (backward: 16 + 2(K-1) inputs and
  -- 16 + K-1 output gradients), and batch 1 x 256 steps still makes 16
  -- tiles per channel block. d.conv_max_tiles = ceil(max_seq_len / conv_tile).
  d.conv_tile = 16
  d.conv_max_tiles = derive.ceil_div(d.max_seq_len, d.conv_tile)
  assert(d.max_batch * d.conv_max_tiles <= 2147483647, "derive_mamba1: too many conv tiles for grid.x")

  -- Fused conv + x_proj (prefill, burn-in): one block per (sequence, conv
  -- tile) runs the conv of all E channels of its tile's tokens, then their
  -- x_proj outputs dbl = xc . x_proj.weight^T from the xc it just wrote, a
  -- warp per output row (lane-strided products, then a butterfly). Why:
  -- for few tokens the x_proj GEMM and the conv are each a launch whose
  -- fixed cost exceeds its work (a narrow layer's prefill of one stream is
  -- a chain of such launches), and the GEMM rereads xc. For many tokens
  -- cuBLAS's tiled GEMM does the products faster than a warp per row, so
  -- the host uses the fused kernel up to d.cxp_max_tokens tokens per call
  -- (NAME_set_conv_xproj changes the bound). Emitted where the tile's xc
  -- fits the block's static shared memory (conv_tile x E floats <= 32 KiB)
  -- and x_proj is narrow (XP <= 64 rows: a warp's lane-strided row stays a
  -- few registers and the rows per warp few).
  local cxp_smem = d.conv_tile * d.E * 4
  if cxp_smem > 32768 then
    d.cxp_why = ("conv_tile x d_inner = %d x %d floats exceed 32 KiB of shared memory"):format(d.conv_tile, d.E)
  elseif d.XP > 64 then
    d.cxp_why = ("x_proj has %d output rows (dt_rank + 2 d_state), more than 64"):format(d.XP)
  else
    d.cxp_why = ""
  end
  d.cxp_fuse = d.cxp_why == ""
  d.cxp_max_tokens = d.cxp_fuse and 2048 or 0

  -- Selective scan: scan_lanes threads share one channel, each owning
  -- scan_npt = N/scan_lanes states in registers; the lanes divide 32, so a
  -- channel's lanes sit in one warp and y = sum_n s*C reduces with shuffles.
  -- Two shapes are derived: the forward scans' (sequential, chunked, the
  -- training forward, the unfused decode scan) and, as scan_base_*, the
  -- one the scan backward is built from and the auto rule counts blocks of.
  --
  -- Base: the smallest power of two keeping N / lanes <= SCAN_NPT_MAX
  -- (register pressure: N=16 -> 1 lane, N=64 -> 4, N=256 -> 16), then,
  -- while the scan would run fewer than SCAN_TARGET_THREADS threads at
  -- max_batch (times the chunks of a max_seq_len window when every call
  -- takes the chunked scan), more lanes, down to SCAN_NPT_SPREAD states per
  -- thread. Why: a narrow model at its largest batch (E = 256, N = 16,
  -- batch 64: 16K threads of 16 states) filled 6% of the H200's warp slots
  -- (ncu, bench/results/h200-2026-12-05-profile-mamba1_rl.csv).
  local lanes = 1
  while d.N // lanes > M.SCAN_NPT_MAX do lanes = lanes * 2 end
  local chunks = spec.scan.mode == "chunked" and derive.ceil_div(d.max_seq_len, d.chunk_size) or 1
  local base = lanes
  while base * 2 <= 32 and d.N // (base * 2) >= M.SCAN_NPT_SPREAD
        and d.max_batch * chunks * d.E * base < M.SCAN_TARGET_THREADS do
    base = base * 2
  end
  -- Forward: SCAN_NPT_SPREAD states per thread whatever the thread count
  -- (up to 32 lanes). Why: each thread walks its steps one after another,
  -- and the scan waits on that chain (mamba1_long's chunked output pass:
  -- 40% of cycles issuing, 31% occupancy, H100 ncu); fewer states per
  -- thread shorten each step's chain and raise the warps an SM holds.
  -- mamba-tune on an H100 (bench/results/h100-2026-12-06j-tune-mamba1_long-lanes.csv,
  -- N = 64): 16 lanes against 4 took the chunked scan from 1.232 to 1.070
  -- ms at batch 8 x 4096 and from 0.211 to 0.156 ms at batch 1, the
  -- sequential one from 2.6 to 0.89 ms. The scan backward keeps the base
  -- shape: it holds a checkpoint chunk's states per thread and picks its
  -- own lanes from there (derive_training).
  -- (the base's loop stops under the same bounds or earlier: lanes >= base)
  while lanes * 2 <= 32 and d.N // (lanes * 2) >= M.SCAN_NPT_SPREAD do lanes = lanes * 2 end
  d.scan_lanes_source = "default"
  local tl = d.tuned and d.tuned.source == "tuned" and d.tuned.scan_lanes
  if tl and M.scan_lanes_ok(d.N, tl) then
    lanes = tl
    d.scan_lanes_source = "tuned"
  end
  d.scan_lanes = lanes
  d.scan_npt = d.N // lanes
  -- Block size, halved (down to one warp) while a sequence would get fewer
  -- than 8 blocks: a small model (E = 256, N = 16: 2 blocks of 128) would
  -- otherwise leave most SMs idle at small batch, and smaller blocks let an
  -- SM interleave several of them (one block's staging wait is another's
  -- compute). Base: from 128 threads. Forward: from 16 channels' worth
  -- (16 x lanes), at least 128 and at most 512 threads, so that a block's
  -- staging of B | C (2N floats a step, shared by its channels) serves as
  -- many channels as at 4 lanes. With `chunk_size: auto` and a tune-cache
  -- entry, the forward's block size mamba-tune measured best together with
  -- that chunk (it swept 32..512 and verified each), when it is whole warps
  -- of whole channels.
  local function halved(threads, l)
    while threads > 32 and threads % (2 * l) == 0 and derive.ceil_div(d.E * l, threads) < 8 do
      threads = threads // 2
    end
    return threads
  end
  local base_threads = halved(128, base)
  d.scan_base_lanes = base
  d.scan_base_channels = base_threads // base
  d.scan_base_blocks = derive.ceil_div(d.E, d.scan_base_channels)
  d.scan_threads = halved(math.max(128, math.min(512, 16 * lanes)), lanes)
  d.scan_threads_source = "default"
  local tt = d.tuned and d.tuned.source == "tuned" and d.tuned.scan_threads
  if tt and tt >= 32 and tt <= 1024 and tt % 32 == 0 and tt % lanes == 0 then
    d.scan_threads = tt
    d.scan_threads_source = "tuned"
  end
  d.scan_channels = d.scan_threads // d.scan_lanes
  -- dt_proj fused into the inference scan: the scan's staging computes each
  -- (step, channel)'s dt = dt_low . dt_proj.weight[e] (R FMAs) instead of a
  -- K = R GEMM writing [tokens][E] that the scan reads back; the R weights
  -- sit in registers (R <= SCAN_FDT_RMAX; R <= channels is kept from when
  -- dt_low took the stage's dt slot, so that no plan changed). Why: on the H200
  -- the K = 8 GEMM of mamba1_rl ran at 7.6 TFLOP/s (10 us a layer at b64
  -- T256) plus its output's round trip. The training forward keeps the GEMM
  -- (its backward reads the dt it saved).
  d.scan_fuse_dt = d.R <= M.SCAN_FDT_RMAX and d.R <= d.scan_channels
  d.scan_blocks = derive.ceil_div(d.E, d.scan_channels)
  d.scan_tchunk, d.scan_stage_w, d.scan_smem_bytes = M.scan_stage(d.N, d.scan_channels)
  M.derive_inference(spec, d)
  if d.training then M.derive_training(spec, d) end
  return d
end

-- ===========================================================================
-- Inference section (mixed precision, chunked scan, burn-in, decode graphs).
-- The training section below is separate.
-- Fields:
--   d.lowp              true when precision is bf16/f16: the model owns a
--                       copy of the blob in act_t (same offsets, in elements)
--                       from which every GEMM weight except input_proj is read
--   d.weights_act_bytes bytes of that copy (weights_total * act_size; 0 for f32)
--   d.convert_threads, d.convert_blocks_max   launch shape of the conversion
--   d.scan_emit_sequential / d.scan_emit_chunked   which scan kernels exist:
--                       sequential always (decode, short calls); chunked for
--                       mode chunked, and for auto when max_seq_len exceeds
--                       the auto threshold
--   d.scan_mode_id      0 sequential | 1 chunked | 2 auto (host dispatch)
--   d.scan_auto_min_len auto: the chunked scan exists when max_seq_len reaches
--                       this (= 2 chunks), and a call takes it when its
--                       seqlen reaches this and its sequential scan would
--                       have fewer than scan_auto_blocks_per_sm blocks per
--                       SM (batch * scan_auto_prefill_blocks < that * SMs,
--                       the SM count queried at create). Why both: the sequential scan
--                       walks the sequence one step after another per
--                       block, so it is fast only when enough blocks run
--                       side by side; the chunked one does the recurrence
--                       twice (3 launches) but is parallel over chunks.
--                       Measured on the H200 (bench, mamba1_rl): batch 1 x
--                       256 steps is latency-bound sequentially
--   d.scan_auto_blocks_per_sm  see scan_auto_min_len (2)
--   d.scan_auto_prefill_blocks  the sequential scan's blocks per sequence
--                       for the rule, counted in blocks of 4 warps
--                       (ceil(scan_blocks * scan_threads / 128)). Why
--                       warps: the rule was set with blocks of at most 128
--                       threads (mamba1_rl); the forward's wider shape
--                       (16 lanes, 256 threads at d_state 64) runs 4x the
--                       warps a sequence of the base shape did, so it fills
--                       the GPU at a quarter of the batch. The training
--                       forward and backward count scan_base_blocks (their
--                       choice follows the scan backward's shape)
--   d.scan_auto_tuned_len, d.scan_auto_chunk_batch, d.scan_auto_seq_batch
--                       the measured crossover (mg/tune.lua crossover) of a
--                       spec tuned with `chunk_size: auto`: a call of at
--                       least scan_auto_tuned_len steps (the sweep's longest
--                       seqlen) takes the chunked scan up to
--                       scan_auto_chunk_batch streams (measured faster at
--                       every batch up to there) and the sequential one from
--                       scan_auto_seq_batch (measured faster there; 0: at no
--                       measured batch); between the two, and for shorter
--                       calls, the SM rule above. 0, 0, 0 without a tuned
--                       crossover (the SM rule alone). Why: the rule's
--                       threshold is a guess; the sweep measured, e.g.,
--                       mamba1_rl at batch 64 x 256 steps on the H200 with
--                       the chunked scan 17% faster than the sequential one
--                       the rule picks there
--   d.scan_mode_resolved "auto" when both scans exist and the call decides
--   d.scan_chunk        chunk length Q (= d.chunk_size)
--   d.scan_max_chunks   ceil(max_seq_len / Q)
--   d.scan_self_combine the inference's chunked scan has each output block
--                       walk the cross-chunk combine for its own chunk
--                       (at most max_chunks - 1 steps a state) instead of a
--                       combine launch: when max_chunks <= 16. Why: at
--                       small batch (the chunked scan's use) the combine is
--                       a launch of a few microseconds a layer for almost no
--                       work; the walk repeats the combine's arithmetic, so
--                       the bits are the same
--   d.scan_cstate_floats  workspace of chunk states: max_batch*max_chunks*E*N
--   d.scan_dsum_floats    workspace of per-chunk sum of delta: max_batch*max_chunks*E
--   d.scan_combine_threads  block of the cross-chunk combine kernel
--   d.chunk_vs_seq_tol  rel-L2 bound of chunked vs sequential outputs (f32:
--                       1e-5; bf16/f16: d.check_tol, since one rounding flip
--                       of a stored activation already exceeds 1e-5; f32 with
--                       allow_tf32 likewise, for a flip of a TF32 GEMM input)
--   d.graph_capture_mode  CUDA stream capture mode used by decode graphs
--   d.decode_part_floats  workspace of the fused decode's x_proj partials:
--                       max_batch * conv_blocks * XP floats
--   d.decode_persistent true when the single-launch decode kernel is emitted
--                       (decode_persistent_kernel: the whole backbone of one
--                       decode step in one launch, a thread-block cluster per
--                       stream); false keeps the fused path only. Needs
--                       clusters (sm_90 and later targets: sm_90, sm_100,
--                       sm_120), the GEMV weights of all layers (storage
--                       dtype, + input_proj f32) <= 16 MiB (they stay L2-resident
--                       and one cluster of decode_cluster SMs streams them per
--                       step: beyond that the whole-GPU GEMMs of the fused
--                       path win), the block's channels x lanes within one
--                       block and its shared memory <= 48 KiB
--   d.decode_persistent_why  why not (a sentence; "" when persistent)
--   d.decode_cluster    blocks per cluster = per stream: 8 (the portable
--                       maximum), halved while a block would own fewer than 8
--                       channels (E < 64)
--   d.decode_ec         channels owned by each block of the cluster (= E / decode_cluster)
--   d.decode_threads    block size: 256 up to 64 channels per block, 512 up to
--                       256, else 1024; raised to hold decode_ec * N/16
--                       threads (at most 16 states per thread), capped at 1024
--   d.decode_seqs       most streams one cluster walks together (DEC_SEQS): the
--                       kernel holds each block's GEMV weights in registers,
--                       so a cluster that serves several streams reads them
--                       once for all of them, and a large batch runs as one
--                       wave of clusters instead of several. The launch picks
--                       1..decode_seqs per call (the fewest that fit the
--                       GPU's co-resident clusters); decode_seqs is the count
--                       that fits max_batch into d.sms // (2 * decode_cluster)
--                       clusters, at most 8, lowered while the shared memory
--                       would exceed 48 KiB. Why half the SMs: a cluster's
--                       blocks share one GPC, so an H100/H200 SXM (132 SMs,
--                       GPCs of at most 18) holds fewer clusters of 8 than
--                       132 // 8 = 16; on the 2026-12-05 H100 bench the step
--                       time doubled from batch 32 to 64 at 4 streams per
--                       cluster (a second wave). More streams per cluster
--                       only raise the most a call may pick
--   d.decode_push       true when the 1-stream instance (the latency case)
--                       hands its x_proj and out_proj partials to the other
--                       blocks by push: st.async into every block's receive
--                       slots, whose mbarrier counts the bytes, instead of a
--                       cluster barrier and reads of the others' shared memory
--                       (a barrier's arrive also waits for every earlier store
--                       to reach memory; a push is one trip, a pull two)
--   d.decode_push_smem_bytes  its shared memory (<= 48 KiB when decode_push)
--   d.decode_min_blocks  __launch_bounds__ minimum blocks per SM: 1 when
--                       ceil(max_batch / decode_seqs) * decode_cluster blocks
--                       fit one per SM of d.sms SMs (132, H100/H200 SXM,
--                       unless a queried GPU says otherwise), else 2 (caps
--                       the kernel at 128 registers, where it spills: two
--                       blocks per SM halve the waves; 1 for blocks above
--                       256 threads)
--   d.decode_lanes      threads sharing one channel in the conv/dt/scan phase:
--                       the largest power of two <= min(32, N) with
--                       decode_ec * lanes <= decode_threads, at least N/16
--   d.decode_npt        states per thread (= N / decode_lanes)
--   d.decode_rpl        dt_proj columns per lane (= ceil(R / decode_lanes))
--   d.decode_vw         vector width (elements) of the x_proj / out_proj weight
--                       loads over a block's channel slice: 4, 2 or 1 (decode_ec % vw == 0)
--   d.decode_in_vw      likewise for input_proj rows (input_dim % vw == 0; 1 when 0)
--   d.decode_weight_bytes  GEMV weight bytes read per step and stream
--   d.decode_smem_bytes static shared memory of the kernel (decode_seqs
--                       copies of the per-stream buffers)
-- ===========================================================================
function M.derive_inference(spec, d)
  d.lowp = d.dtype ~= "f32"
  d.weights_act_bytes = d.lowp and d.weights_total * d.act_size or 0
  d.convert_threads = 256
  d.convert_blocks_max = 1024

  d.scan_chunk = d.chunk_size
  d.scan_auto_min_len = 2 * d.scan_chunk
  d.scan_auto_blocks_per_sm = 2
  d.scan_auto_prefill_blocks = derive.ceil_div(d.scan_blocks * d.scan_threads, 128)
  local xo = d.tuned and d.tuned.source == "tuned" and d.tuned.crossover
  if type(xo) == "table" and math.tointeger(xo.seqlen) and xo.seqlen >= 1 then
    d.scan_auto_tuned_len = xo.seqlen
    d.scan_auto_chunk_batch = math.tointeger(xo.chunk_max_batch) or 0
    d.scan_auto_seq_batch = math.tointeger(xo.seq_min_batch) or 0
  else
    d.scan_auto_tuned_len, d.scan_auto_chunk_batch, d.scan_auto_seq_batch = 0, 0, 0
  end
  d.scan_emit_sequential = true
  d.scan_emit_chunked, d.scan_mode_id = derive.scan_choice(spec.scan.mode, d.max_seq_len, d.scan_auto_min_len)
  if d.scan_mode_id == 2 then d.scan_mode_resolved = "auto" end
  d.scan_max_chunks = derive.ceil_div(d.max_seq_len, d.scan_chunk)
  assert(d.scan_max_chunks <= 65535, "derive_mamba1: too many chunks for grid.z")
  d.scan_self_combine = d.scan_max_chunks <= 16
  if d.scan_emit_chunked then
    d.scan_cstate_floats = d.max_batch * d.scan_max_chunks * d.E * d.N
    d.scan_dsum_floats = d.max_batch * d.scan_max_chunks * d.E
  else
    d.scan_cstate_floats, d.scan_dsum_floats = 0, 0
  end
  d.scan_combine_threads = 256
  -- fused single-token decode: x_proj partial sums [max_batch][conv_blocks][XP]
  d.decode_part_floats = d.max_batch * d.conv_blocks * d.XP
  d.chunk_vs_seq_tol = (d.lowp or d.tf32) and d.check_tol or 1e-5
  d.graph_capture_mode = "cudaStreamCaptureModeRelaxed"

  -- Single-launch decode (see the field comments above).
  local cs = 8
  while cs > 1 and d.E // cs < 8 do cs = cs // 2 end
  d.decode_cluster = cs
  d.decode_ec = d.E // cs
  local ec = d.decode_ec
  local min_lanes = math.max(1, d.N // 16)
  d.decode_threads = math.min(1024, math.max((ec <= 64) and 256 or ((ec <= 256) and 512 or 1024),
                                             derive.next_pow2(ec * min_lanes)))
  local lanes = 1
  while lanes * 2 <= math.min(32, d.N) and ec * lanes * 2 <= d.decode_threads do lanes = lanes * 2 end
  if lanes < min_lanes then lanes = min_lanes end
  d.decode_lanes = lanes
  d.decode_npt = d.N // lanes
  d.decode_rpl = derive.ceil_div(d.R, lanes)
  local function vw(n)
    if n > 0 and n % 4 == 0 then return 4 elseif n > 0 and n % 2 == 0 then return 2 end
    return 1
  end
  d.decode_vw = vw(ec)
  d.decode_in_vw = vw(d.input_dim)
  d.decode_weight_bytes = d.L * (2 * d.E * d.D + d.XP * d.E + d.E * d.R + d.D * d.E) * d.act_size
    + d.input_dim * d.D * 4
  -- Per stream: s_h, s_hn, s_pout [D]; s_u [input_dim]; s_xz [2ec], s_xc,
  -- s_g [ec]; s_xpart, s_dbl [XP]; s_red [threads/32].
  local function smem(seqs)
    return 4 * seqs * (3 * d.D + d.input_dim + 4 * ec + 2 * d.XP + d.decode_threads // 32)
  end
  local clusters = math.max(1, d.sms // (2 * cs))
  local seqs = math.min(8, derive.ceil_div(d.max_batch, clusters))
  while seqs > 1 and smem(seqs) > 48 * 1024 do seqs = seqs - 1 end
  d.decode_seqs = seqs
  d.decode_smem_bytes = smem(seqs)
  d.decode_min_blocks = (derive.ceil_div(d.max_batch, seqs) * cs <= d.sms or d.decode_threads > 256) and 1 or 2
  local why = ""
  if d.sm < 90 then
    why = "target " .. spec.target .. " has no thread-block clusters (sm_90 and later)"
  elseif d.decode_weight_bytes > 16 * 1024 * 1024 then
    why = string.format("the GEMV weights (%d bytes per step) exceed 16 MiB: one cluster per stream "
      .. "cannot stream them faster than the whole-GPU GEMMs", d.decode_weight_bytes)
  elseif ec * lanes > d.decode_threads then
    why = string.format("%d channels x %d lanes per block exceed %d threads", ec, lanes, d.decode_threads)
  elseif d.decode_smem_bytes > 48 * 1024 then
    why = string.format("shared memory %d bytes exceeds 48 KiB", d.decode_smem_bytes)
  end
  d.decode_persistent = why == ""
  d.decode_persistent_why = why
  -- The 1-stream instance exchanges the blocks' partials by push (st.async
  -- into every block's receive slots, an mbarrier counting the bytes) when
  -- the slots fit beside the rest: [cluster][XP] and [cluster][D] floats.
  d.decode_push_smem_bytes = smem(1) + 4 * cs * (d.XP + d.D) + 16
  d.decode_push = d.decode_persistent and d.decode_push_smem_bytes <= 48 * 1024
  return d
end

-- ===========================================================================
-- Training section (backward + AdamW), used by mamba1/backward.cu.tmpl,
-- train.c.tmpl and train_test.c.tmpl (only when spec.emit.training).
-- Fields:
--   d.scan_warps      warps of a scan block (= scan_threads/32)
--   d.bscan_lanes     threads sharing one channel in the scan backward
--                     kernels: scan_base_lanes, doubled (up to 32,
--                     dividing N) while a thread would hold more than
--                     BSCAN_NPT_MAX states. Why: the backward keeps a
--                     checkpoint chunk's recomputed states per thread
--                     ([bscan_tchunk][bscan_npt]); up to 64 floats they stay
--                     in registers (scan_bwd.cuh BWD_UNROLL), beyond that in
--                     local memory, reloaded at every step of the reverse
--                     walk. mamba1_long (N = 64, 4 base lanes of 16
--                     states) ran its scan backward at 12% occupancy with hs
--                     in local memory: 43% of its training step (H100,
--                     bench/results/h100-2026-12-05h-profile-mamba1_long.txt).
--   d.bscan_npt       states per thread of the scan backward = N / bscan_lanes
--   d.bscan_channels  channels per scan-backward block: scan_base_channels,
--                     halved while the block would exceed 512 threads or its
--                     shared memory at a checkpoint stride of 8 (see
--                     bscan_smem_bytes) 40 KiB; then doubled while a token
--                     would get more than BSCAN_MAX_PARTS dB | dC partials
--                     (one per block, bscan_blocks), the doubled block
--                     stays within those bounds and the sequential backward
--                     at max_batch still has a block for each of d.sms
--                     SMs (the larger blocks hold an SM's registers alone
--                     or half of them). Why: every partial is a
--                     row of 2N floats per token written by the scan
--                     backward and read back by the dB | dC reduction
--                     (bc_reduce_kernel); where the base shape is narrow
--                     (mamba1_long in auto mode: 16 lanes, 8 channels, 64
--                     blocks) those rows were 1.07 GB a layer at batch 8 x
--                     4096 and their reduction 5% of the training step at
--                     95% of the copy ceiling (H100,
--                     bench/results/h100-2026-12-07-profile-mamba1_long.txt)
--   d.bscan_threads   = bscan_channels * bscan_lanes; d.bscan_warps = /32
--   d.bscan_blocks    scan-backward blocks per sequence = ceil(E /
--                     bscan_channels): the dB | dC partials per token
--   d.bspan_lanes, d.bspan_npt, d.bspan_threads  the block shape of the
--                     chunked backward's span kernel (scan_bwd_span_kernel):
--                     bscan_channels channels of scan_base_lanes
--                     (doubled only while the block is not whole warps).
--                     Why not bscan_lanes: the span kernel holds no
--                     per-step states, and each lane recomputes its
--                     channel's delta every step (at 16 lanes a channel
--                     mamba1_long's span kernel took 1.98 ms where 4 took
--                     1.69, H100); its outputs are per state, the same bits
--                     at any lane count.
--   d.bscan_tchunk    checkpoint stride of the training scan: the forward-for-
--                     training saves the SSM state every bscan_tchunk steps and
--                     the backward recomputes the states inside each chunk
--                     forward from its checkpoint (never dividing by exp(dA)),
--                     keeping them per thread in a [bscan_tchunk][bscan_npt]
--                     array: bscan_tchunk*bscan_npt <= 256 floats (1 KiB of
--                     local memory per thread where it does not fit registers).
--                     It is also the number of timesteps staged in shared
--                     memory per pass of the backward (B | C and the block's
--                     xc, delta, dy, softplus'); halved while that staging plus the
--                     double-buffered per-warp dB/dC reduction buffer
--                     (2*bscan_warps*2N floats) would exceed 40 KiB.
--   d.bscan_red_steps steps whose per-warp dB | dC sums the scan backward
--                     collects before one barrier and the cross-warp sums
--                     (the same sums, in the same order, as step by step):
--                     the largest power of two <= bscan_tchunk whose
--                     double-buffered buffer (2*bscan_red_steps*bscan_warps*2N
--                     floats, dynamic shared memory: d.bscan_red_bytes) keeps
--                     the kernel's shared memory within its share of an
--                     SM: at the 128-register bound 512 / bscan_threads
--                     blocks fill an SM's registers, so each may take 160
--                     KiB / that count (40 KiB at 128 threads, 80 KiB at
--                     256, 160 KiB from 512 on; at least 40 KiB; and within
--                     the target's limit per block, derive.SMEM_BLOCK_MAX:
--                     97 KiB on sm_86/89/120); more shared memory than that
--                     would take the place of another block.
--                     Why: a barrier per step held every warp of the block
--                     to the slowest one at every step of the reverse walk.
--   d.bscan_red_bytes = 4*2*bscan_red_steps*bscan_warps*2N
--   d.bscan_smem_bytes = 4*(2*bscan_tchunk*N + 4*bscan_tchunk*bscan_channels)
--                     (static) + bscan_red_bytes
--   d.max_ckpts       checkpoints per sequence = ceil(max_seq_len/bscan_tchunk)
--                     (mamba1_long, N = 64, 4096 steps -> stride 16, 256
--                     checkpoints; see NAME_train.h "Long sequences")
--   d.bscan_span      steps per span of the chunk-parallel scan backward: the
--                     spec's chunk length rounded up to a whole number of
--                     checkpoint chunks (a span starts at a checkpoint)
--   d.bscan_span_ck   checkpoint chunks per span (= bscan_span / bscan_tchunk)
--   d.bscan_emit_chunked  the chunk-parallel backward kernels exist: scan.mode
--                     chunked, or auto when max_seq_len reaches
--                     bscan_auto_min_len (the sequential backward kernel is
--                     always emitted: sequential mode and short calls)
--   d.bscan_mode_id   0 sequential | 1 chunked | 2 auto (host dispatch of the
--                     backward; chunked: calls longer than one span)
--   d.bscan_auto_min_len  auto: = 2*bscan_span, the forward's rule with the
--                     span: calls with seqlen >= this whose sequential
--                     backward would have fewer than scan_auto_blocks_per_sm
--                     blocks per SM take the chunked backward and the
--                     chunked training forward
--   d.bscan_max_spans ceil(max_seq_len / bscan_span)
--   d.bscan_parts     per-sequence partitions of the scan's parameter-gradient
--                     partials (part_A, part_D, part_dtb): bscan_max_spans
--                     with the chunked backward, else 1
--   d.bscan_span_floats  workspace of each of the span products and the span
--                     adjoints: max_batch*bscan_max_spans*E*N (0 without the
--                     chunked backward)
--   d.bscan_combine_threads  block of the cross-span combine kernel
--   d.normb_rows      rows per block of the RMSNorm backward and of the column
--                     sums: each block writes one partial row of the weight
--                     gradient; the d.normb_max_blocks = ceil(max_tokens /
--                     normb_rows) partials are summed in block order
--   d.red_threads     block size of the elementwise / reduction kernels
--   d.conv_parts      partials of the conv weight and bias gradients: one per
--                     (sequence, time tile of conv_tile steps) =
--                     max_batch * conv_max_tiles (sizes part_cw, part_cb)
--   d.conv_part_group partials summed per thread by the first stage of the
--                     conv gradients' two-stage sum (in place, in order); the
--                     second stage sums the ceil(parts / group) group sums in
--                     order. A one-stage sum would leave each of the E*K
--                     threads a serial walk over batch*tiles partials (2048
--                     at 8 x 4096 steps): latency-bound on a few SMs
--   d.gnorm_blocks    blocks of the first stage of the global gradient norm and
--                     of the MSE loss: a fixed count, so the partition of the
--                     sum (hence its rounding) never depends on the GPU
--   d.layers_begin, d.layers_end   blob range of the layers (floats)
--   d.adamw_layer     { {lo, hi, cls, len}, ... } tensor ranges relative to a layer start
--   d.adamw_global    { {lo, hi, cls, len}, ... } absolute ranges of the other tensors;
--                     cls 1 = weight matrix (Linear / conv weight: decayed under
--                     wd_matrices_only), 2 = norms, biases, A_log, D. Everything
--                     outside the ranges is padding: AdamW never writes it.
--   d.grad_tol        rel-L2 tolerance of the gradients against the f64
--                     reference: f32 1e-4; bf16 5e-2, f16 1e-2 (provisional,
--                     to be measured on the H200)
-- ===========================================================================
local MATRIX = { input_proj_w = true, in_proj_w = true, conv_w = true, x_proj_w = true,
                 dt_proj_w = true, out_proj_w = true }
M.BSCAN_NPT_MAX = 4
M.BSCAN_MAX_PARTS = 16
function M.derive_training(spec, d)
  d.scan_warps = d.scan_threads // 32
  local bl = d.scan_base_lanes
  while d.N // bl > M.BSCAN_NPT_MAX and bl * 2 <= 32 and d.N % (bl * 2) == 0 do bl = bl * 2 end
  d.bscan_lanes = bl
  d.bscan_npt = d.N // bl
  local function smem_c(t, c, g) return 4 * (2 * t * d.N + 2 * (g or 1) * (c * bl // 32) * 2 * d.N + 4 * t * c) end
  local ch = d.scan_base_channels
  while ch % 2 == 0 and (ch // 2) * bl >= 32 and (ch * bl > 512 or smem_c(8, ch) > 40960) do ch = ch // 2 end
  while derive.ceil_div(d.E, ch) > M.BSCAN_MAX_PARTS and ch * 2 * bl <= 512 and smem_c(8, ch * 2) <= 40960
        and derive.ceil_div(d.E, ch * 2) * d.max_batch >= d.sms do
    ch = ch * 2
  end
  d.bscan_channels = ch
  d.bscan_threads = ch * bl
  assert(d.bscan_threads % 32 == 0 and d.bscan_threads <= 1024, "derive_mamba1: scan backward block")
  d.bscan_warps = d.bscan_threads // 32
  d.bscan_blocks = derive.ceil_div(d.E, ch)
  -- The span kernel of the chunked backward keeps no states per step: the
  -- base lanes (raised only until its blocks are whole warps).
  local sl = d.scan_base_lanes
  while (ch * sl) % 32 ~= 0 and sl < bl do sl = sl * 2 end
  d.bspan_lanes = sl
  d.bspan_npt = d.N // sl
  d.bspan_threads = ch * sl
  local bt = 16
  while bt * d.bscan_npt > 256 do bt = bt // 2 end
  local function smem(t) return smem_c(t, ch) end
  while bt > 1 and smem(bt) > 40960 do bt = bt // 2 end
  d.bscan_tchunk = bt
  local g = 1
  local budget = math.min(math.max(40960, math.min(160 * 1024, 160 * 1024 * d.bscan_threads // 512)),
                          derive.SMEM_BLOCK_MAX[d.sm] or derive.SMEM_BLOCK_MAX[80])
  while g * 2 <= bt and smem_c(bt, ch, g * 2) <= budget do g = g * 2 end
  d.bscan_red_steps = g
  d.bscan_red_bytes = 4 * 2 * g * d.bscan_warps * 2 * d.N
  d.bscan_smem_bytes = smem_c(bt, ch, g)
  d.max_ckpts = derive.ceil_div(d.max_seq_len, bt)
  -- Chunk-parallel scan backward. A span must be a whole number of
  -- checkpoint chunks, so that it starts at a saved state and its chunks are
  -- the sequential backward's chunks: round the chunk length up to a
  -- multiple of bt (chunk 64, stride 16 -> 64 = 4 chunks; chunk 16, stride
  -- 16 -> 16 = 1 chunk; stride 8 -> the chunk as it is). Its threshold
  -- under auto follows the forward's rule (d.scan_auto_min_len) with the span.
  d.bscan_span = derive.ceil_div(d.scan_chunk, bt) * bt
  d.bscan_span_ck = d.bscan_span // bt
  d.bscan_auto_min_len = 2 * d.bscan_span
  d.bscan_emit_chunked, d.bscan_mode_id = derive.scan_choice(spec.scan.mode, d.max_seq_len, d.bscan_auto_min_len)
  d.bscan_max_spans = derive.ceil_div(d.max_seq_len, d.bscan_span)
  assert(d.bscan_max_spans <= 65535, "derive_mamba1: too many backward spans for grid.z")
  d.bscan_parts = d.bscan_emit_chunked and d.bscan_max_spans or 1
  d.bscan_span_floats = d.bscan_emit_chunked and d.max_batch * d.bscan_max_spans * d.E * d.N or 0
  d.bscan_combine_threads = 256
  d.normb_rows = 16
  d.normb_max_blocks = derive.ceil_div(d.max_tokens, d.normb_rows)
  d.red_threads = 256
  d.conv_parts = d.max_batch * d.conv_max_tiles
  d.conv_part_group = 32
  d.gnorm_blocks = 256
  derive.training_common(d, MATRIX)
  return d
end

return M
