-- mg/cost.lua: the cost model the benchmarks quote figures against: floating
-- point operations and bytes moved through device memory per token, and the
-- bytes of the weights a call reads once. Lua holds this arithmetic so the
-- bench templates only print it; the bench divides by measured time and the
-- measured ceilings (copy bandwidth, GEMM rate) of the GPU it runs on.
--
-- Bytes are what the emitted pipeline moves by design (each kernel's reads and
-- writes of activations; the residual stream f32), not a lower bound: the
-- fraction of the copy ceiling then says how well each pass streams.

local M = {}

-- Mamba-1 forward (prefill) per token, and the per-call weight bytes.
function M.mamba1(d)
  local a = d.act_size
  local D, E, N, K, R, XP, L = d.D, d.E, d.N, d.K, d.R, d.XP, d.L
  local gemm = 2 * (2 * E * D) + 2 * (XP * E) + 2 * (E * R) + 2 * (D * E)
  -- scan: dA = exp (1), s = dA*s + dB*x (3), y += s*C (2) per state; conv 2K per channel
  local other = 6 * E * N + 2 * K * E + 10 * E + 8 * D
  local layer_bytes =
      D * 4 + D * a            -- rmsnorm: read h (f32), write hn
    + D * a + 2 * E * a        -- in_proj: read hn, write xz
    + E * a + E * a            -- conv: read x, write xc
    + E * a + XP * a           -- x_proj: read xc, write dbl
    + R * a + E * a            -- dt_proj: read dt_low, write dt
    + 3 * E * a + 2 * N * a + E * a  -- scan: read xc, dt, z, B, C; write g
    + E * a + 2 * D * 4        -- out_proj: read g, read+write h
  local io_bytes = d.in_dim * 4 + D * 4 + 2 * D * 4  -- u in, h init, norm_f in/out
  local in_gemm = d.input_dim > 0 and 2 * d.input_dim * D or 0
  -- weights each call reads: GEMM weights in the storage dtype, the rest f32
  local gemm_w = L * (2 * E * D + XP * E + E * R + D * E) + (d.input_dim > 0 and d.input_dim * D or 0)
  local small_w = d.weights_total - gemm_w
  return {
    gemm_flops_per_token = L * gemm + in_gemm,
    other_flops_per_token = L * other,
    bytes_per_token = L * layer_bytes + io_bytes,
    weight_bytes = gemm_w * a + small_w * 4,
    -- one decode step per stream: the state is read and written once per token
    state_bytes_per_seq = L * (E * (K - 1) + E * N) * 4 * 2,
    -- a training step, approximately: backward = 2x the forward's GEMM work
    -- and traffic; AdamW reads weights, grads, m, v and writes weights, m, v
    -- (f32) once
    train_flops_per_token = 3 * (L * gemm + in_gemm) + 3 * L * other,
    train_bytes_per_token = 3 * (L * layer_bytes + io_bytes),
    train_weight_bytes = 3 * (gemm_w * a + small_w * 4) + 7 * 4 * d.weights_total,
  }
end

-- Mamba-3 SISO forward per token (d from derive_mamba3: dims, d.ck_chunk).
-- The SSM core is prep (BCNorm, biases, dt/A/lambda) + angles (rotary) +
-- the scan + the gate, i.e. the layer without its GEMMs and norms; its
-- flops are those of the chunked form at the kernel's chunk Q per head and
-- token: N*Q (q'.k' over the causal half, 2 flops each) + P*Q (W.V, causal
-- half) + 2*N*P (inter-chunk Q'.Hs^T) + 2*N*P (state update), plus the
-- elementwise maps. (The sequential scan does ~8*N*P per head and token.)
function M.mamba3(d)
  local a = d.act_size
  local D, E, N, P, H, G, S, L = d.D, d.E, d.N, d.P, d.H, d.G, d.S, d.L
  local NP = d.in_proj_out
  local Q = d.ck_chunk
  local gemm = 2 * NP * D + 2 * D * E
  local ssm_chunked = H * (N * Q + P * Q + 4 * N * P)
  local ssm_seq = H * 8 * N * P
  local elementwise = H * (8 * N + 12 * S + 20) + 10 * E + 8 * D
  -- the split path's four kernels, each alone (the bench's per-kernel rows)
  local prep_bytes = (2 * G * N + 3 * H + S) * a + 3 * H * 4 + 2 * H * N * 4   -- B, C, scalars in; dt, adt, lam, k, q out
  local angles_bytes = S * a + H * 4 + 2 * 2 * 2 * S * H * 4                  -- angles, dt in; rotated pairs of k, q in and out
  local scan_bytes = 2 * H * N * 4 + E * a + 3 * H * 4 + E * 4                -- k', q', v, scalars in; y out
  local gate_bytes = E * 4 + E * a + E * a                                    -- y, z in; g out
  local core_split_bytes = prep_bytes + angles_bytes + scan_bytes + gate_bytes
  -- The training's SSM core, kernel by kernel (the bench's "ssm core
  -- fwd+bwd" rows and their parts): k', q' in the storage dtype, the
  -- rotary angle table rot [H][S] f32, the checkpoints one state [H][P][N] f32
  -- per bscan_tchunk steps (sequential) or per chunk (chunked).
  local HN, HS = H * N, H * S
  local dkq = d.ckb_dkq_size or 4                                  -- the chunked backward's dk, dq entries
  local ck_seq = H * P * N * 4 // (d.bscan_tchunk or 16)          -- checkpoint bytes per token, sequential
  local ck_ck = H * P * N * 4 // (d.ck_chunk or 64)               -- and chunked
  local t_angles = S * a + H * a + 4 * HS                          -- angle and dt columns in; rot out
  local t_prep = (2 * G * N + 3 * H) * a + 4 * HS + 3 * H * 4 + 2 * HN * a   -- B, C, scalars, rot in; dt, adt, lam, k', q' out
  local t_scan_in = 2 * HN * a + E * a + 3 * H * 4                -- k', q', v, scalars in
  -- the chunked path builds k', q' in its scans (no per-head rows): its
  -- prep writes the scalars and the 1/rms of B and C only, its scans read
  -- the group's B and C (once a token from DRAM, the other heads from L2),
  -- the 1/rms and the angle table instead of k', q'
  -- (and the tanh of the angle columns, for the angle table's walk, which
  -- then reads it with dt instead of the columns)
  local t_prep_ck = (2 * G * N + 3 * H + S) * a + 3 * H * 4 + 2 * G * 4 + S * 4   -- B, C, scalars, angles in; dt, adt, lam, rbc, tanh out
  local t_angles_ck = S * 4 + H * 4 + 4 * HS                        -- tanh and dt in; rot out
  local t_scan_in_ck = 4 * HS + 2 * G * N * a + 2 * G * 4 + E * a + 3 * H * 4   -- rot, B, C, rbc, v, scalars in
  local t_fscan_seq = t_scan_in + E * 4 + ck_seq                  -- y and the checkpoints out
  local t_fscan_ck = t_scan_in_ck + E * 4 + ck_ck
  local t_gate_bwd = E * 4 + E * a + E * 4 + E * a + E * 4 + E * a -- y, z, dg in; g, dy, dz out
  local t_bscan_seq = t_scan_in + ck_seq + E * 4                  -- the forward's inputs, checkpoints, dy in
    + 2 * HN * 4 + E * 4 + 3 * H * 4                              -- dk, dq, dv, dadt, ddt, dlam out
  local t_bscan_ck = t_scan_in_ck + ck_ck + E * 4                -- the forward's inputs (cs among them), checkpoints, dy in
    + 2 * HN * dkq + E * a + 3 * H * 4 + HS * 4 + 2 * HN * 4 // 16   -- dk, dq, dv (into dproj), scalars, gth, tile sums out
  local t_angles_bwd = 2 * HN * a + 4 * HS + 2 * 2 * HN * 4 + HS * 4   -- k', q', rot, dk, dq in; dk, dq, gth out
  local t_angles_sums = 2 * HS * 4                                -- gth in place
  local t_prep_bwd_ck = (2 * G * N + 3 * H) * a + 2 * H * 4 + 2 * HN * dkq + 3 * H * 4 + HS * 4
    + (2 * G * N + 3 * H + S) * a + H * 4 + 2 * N * 4              -- proj, dt, lam, dk, dq, scalar and angle grads in; dproj, sums out
  local t_prep_bwd_seq = t_prep_bwd_ck + 2 * HN * (4 - dkq) + E * 4 + E * a   -- dk, dq f32, and dv in
  -- the fused kernel (d.ck_fused) moves the minimum: the in_proj row's
  -- B, C, scalars, angles, x and z in, g out (the group's B and C are read
  -- by each of its heads, from L2 after the first)
  local core_fused_bytes = (2 * G * N + 3 * H + S + 2 * E) * a + E * a
  local core_bytes = d.ck_fused and core_fused_bytes or core_split_bytes
  local layer_bytes =
      D * 4 + D * a            -- rmsnorm: read h (f32), write hn
    + D * a + NP * a           -- in_proj: read hn, write proj
    + core_bytes
    + E * a + 2 * D * 4        -- out_proj: read g, read+write h
  local io_bytes = d.in_dim * 4 + D * 4 + 2 * D * 4
  local in_gemm = d.input_dim > 0 and 2 * d.input_dim * D or 0
  local gemm_w = L * (NP * D + D * E)
  local in_w = d.input_dim > 0 and d.input_dim * D or 0
  local small_w = d.weights_total - gemm_w - in_w
  local ssm = d.scan_emit_chunked and ssm_chunked or ssm_seq
  return {
    gemm_flops_per_token = L * gemm + in_gemm,
    other_flops_per_token = L * (ssm + elementwise),
    bytes_per_token = L * layer_bytes + io_bytes,
    weight_bytes = gemm_w * a + (in_w + small_w) * 4,
    -- the SSM core alone (one layer), per token, and the small weights it reads
    core_flops_per_token = ssm + elementwise - 8 * D,
    core_seq_flops_per_token = ssm_seq + elementwise - 8 * D,
    core_bytes_per_token = core_bytes,
    core_split_bytes_per_token = core_split_bytes,
    core_prep_bytes_per_token = prep_bytes,
    core_angles_bytes_per_token = angles_bytes,
    core_scan_bytes_per_token = scan_bytes,
    core_gate_bytes_per_token = gate_bytes,
    -- the scan kernel's own flops (the chunked form, or the sequential one)
    core_scan_flops_per_token = ssm_chunked,
    core_scan_seq_flops_per_token = ssm_seq,
    tcore_angles_bytes_per_token = t_angles,
    tcore_prep_bytes_per_token = t_prep,
    tcore_prep_ck_bytes_per_token = t_prep_ck,
    tcore_angles_ck_bytes_per_token = t_angles_ck,
    tcore_fscan_seq_bytes_per_token = t_fscan_seq,
    tcore_fscan_ck_bytes_per_token = t_fscan_ck,
    tcore_gate_bytes_per_token = gate_bytes,   -- the inference gate kernel
    tcore_gate_bwd_bytes_per_token = t_gate_bwd,
    tcore_bscan_seq_bytes_per_token = t_bscan_seq,
    tcore_bscan_ck_bytes_per_token = t_bscan_ck,
    tcore_angles_bwd_bytes_per_token = t_angles_bwd,
    tcore_angles_sums_bytes_per_token = t_angles_sums,
    tcore_prep_bwd_seq_bytes_per_token = t_prep_bwd_seq,
    tcore_prep_bwd_ck_bytes_per_token = t_prep_bwd_ck,
    -- a training step (forward_train + loss + backward + AdamW): about 3x
    -- the forward's GEMM and elementwise work and traffic, and the AdamW
    -- pass over the f32 blob (weights, grads, m, v read; weights, m, v written)
    train_flops_per_token = 3 * (L * gemm + in_gemm) + 3 * L * (ssm + elementwise),
    train_bytes_per_token = 3 * (L * layer_bytes + io_bytes),
    train_weight_bytes = 3 * (gemm_w * a + (in_w + small_w) * 4) + 7 * 4 * d.weights_total,
    -- one decode step per stream: the four states read and written once
    state_bytes_per_seq = L * (H * P * N + H * N + H * P + H * S) * 4 * 2,
  }
end

-- The shapes a model's bench program measures: prefill at the largest batch
-- for a short window (32 tokens, the RL replay case) and the longest sequence,
-- and one stream at the longest sequence; decode at batch 1 and the largest.
function M.bench_shapes(d)
  local B, T = d.max_batch, d.max_seq_len
  local prefill, seen = {}, {}
  local function add(b, t)
    local k = b .. "x" .. t
    if not seen[k] then seen[k] = true; prefill[#prefill + 1] = { b, t } end
  end
  add(B, math.min(32, T))
  add(B, T)
  add(1, T)
  local decode = { 1 }
  if B > 1 then decode[2] = B end
  return { prefill = prefill, decode = decode }
end

return M
