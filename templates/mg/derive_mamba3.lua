-- mg/derive_mamba3.lua: Mamba-3 SISO dims, the weights blob layout and the
-- launch shapes of the kernels. derive(spec, d) fills d (already holding the
-- common fields of mg/derive.lua) and returns it. Templates do no
-- arithmetic: every number they print comes from here.
--
-- Fields (HACKING.md "Template environment" is the contract; math.md names):
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
--   launch   d.norm_threads, d.norm_vecs, d.norm_iters (RMSNorm, as Mamba-1),
--            d.prep_threads, d.prep_warps, d.prep_n_per_lane,
--            d.angle_threads, d.angle_blocks,
--            d.scan_lanes, d.scan_npt, d.scan_rpt, d.scan_rowgroups,
--            d.scan_threads, d.scan_tchunk, d.scan_smem_bytes,
--            d.gate_threads, d.gate_warps, d.gate_vpl,
--            d.scan_kernel ("sequential" | "chunked": the kernel emitted)
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
M.layer_tensors = layer_tensors

function M.layout(d)
  local lay = { params = {}, next = 0 }
  local off = {}
  if d.input_dim > 0 then
    off.input_proj_w = derive.add_param(lay, "input_proj.weight", { d.D, d.input_dim }, "input_proj_w").offset
    off.input_proj_b = derive.add_param(lay, "input_proj.bias", { d.D }, "input_proj_b").offset
  end
  local starts = {}
  local layer0 = {}
  for l = 0, d.L - 1 do
    for i, t in ipairs(layer_tensors(d)) do
      local p = derive.add_param(lay, "layers." .. l .. "." .. t[2], t[3], t[1], l)
      if i == 1 then starts[l] = p.offset end
      if l == 0 then layer0[t[1]] = p.offset end
    end
  end
  -- Every tensor starts 64-aligned, so every layer has the same aligned size.
  local layer_end = derive.align(lay.next)
  local stride = d.L > 1 and (starts[1] - starts[0]) or (layer_end - starts[0])
  for l = 1, d.L - 1 do
    assert(starts[l] - starts[l - 1] == stride, "derive_mamba3: non-uniform layer stride")
  end
  off.norm_f_w = derive.add_param(lay, "norm_f.weight", { d.D }, "norm_f_w").offset
  return lay.params, off, layer0, stride, derive.align(lay.next)
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

  d.params, d.off, d.layer0, d.layer_stride, d.weights_total = M.layout(d)

  -- RMSNorm (block pre-norm, norm_f): as Mamba-1. One block per token row,
  -- read as float4 vectors (D is a multiple of 8); one vector per thread
  -- when the row fits: next power of two of D/4, at least a warp, at most
  -- 1024 (larger rows loop norm_iters times).
  d.norm_vecs = d.D // 4
  d.norm_threads = math.min(1024, math.max(32, derive.next_pow2(d.norm_vecs)))
  d.norm_iters = derive.ceil_div(d.norm_vecs, d.norm_threads)

  -- Prep (per token: BCNorm, per-head scalars, biased k and q for every
  -- head): one block of 128 threads (4 warps) per token. Warp w reduces the
  -- rms of groups w, w+4, ... (each lane prep_n_per_lane = ceil(N/32)
  -- entries, a fixed shuffle butterfly); then the block writes the H*N
  -- entries of k and q with consecutive threads on consecutive n
  -- (coalesced). 128 keeps several blocks resident per SM for any H*N.
  d.prep_threads = 128
  d.prep_warps = d.prep_threads // 32
  d.prep_n_per_lane = derive.ceil_div(d.N, 32)

  -- Angles + rotary: the angle recurrence is sequential in t, one thread
  -- per (batch, head, angle) walking t in order (theta kept in f64, wrapped
  -- mod 2pi every step, so it stays exact over any length). 128 threads per
  -- block; grid (angle_blocks, batch) with angle_blocks = ceil(H*S/128).
  d.angle_threads = 128
  d.angle_blocks = derive.ceil_div(d.HS, d.angle_threads)

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

  -- The SSM kernel emitted. The chunked form (math.md) is not emitted yet:
  -- scan.mode chunked runs the sequential kernel, which computes the same
  -- recurrence (results agree with the f64 reference either way).
  d.scan_kernel = "sequential"

  -- Multiply-adds of the f64 reference per token (GEMMs, the SSM step
  -- 4*H*P*N, the per-head k/q maps), to size the test cases.
  d.ref_macs_per_token = d.L * (d.in_proj_out * d.D + d.D * d.E + 4 * d.H * d.P * d.N
    + 4 * d.H * d.N + 2 * d.D) + d.input_dim * d.D + d.D
  return d
end

return M
