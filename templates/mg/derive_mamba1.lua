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
--   launch   d.norm_threads, d.norm_vecs, d.norm_iters, d.conv_threads,
--            d.conv_blocks, d.scan_lanes, d.scan_npt, d.scan_threads,
--            d.scan_channels, d.scan_blocks, d.scan_tchunk, d.scan_smem_bytes

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
M.layer_tensors = layer_tensors

function M.layout(d)
  local lay = { params = {}, next = 0 }
  local off = {}
  if d.input_dim > 0 then
    off.input_proj_w = derive.add_param(lay, "backbone.input_proj.weight", { d.D, d.input_dim }, "input_proj_w").offset
    off.input_proj_b = derive.add_param(lay, "backbone.input_proj.bias", { d.D }, "input_proj_b").offset
  end
  local starts = {}
  local layer0 = {}
  for l = 0, d.L - 1 do
    for i, t in ipairs(layer_tensors(d)) do
      local p = derive.add_param(lay, "backbone.layers." .. l .. "." .. t[2], t[3], t[1], l)
      if i == 1 then starts[l] = p.offset end
      if l == 0 then layer0[t[1]] = p.offset end
    end
  end
  -- Every tensor starts 64-aligned, so each layer starts 64-aligned and all
  -- layers have the same size: the stride is the aligned size of one layer.
  local layer_end = derive.align(lay.next)
  local stride = d.L > 1 and (starts[1] - starts[0]) or (layer_end - starts[0])
  for l = 1, d.L - 1 do
    assert(starts[l] - starts[l - 1] == stride, "derive_mamba1: non-uniform layer stride")
  end
  off.norm_f_w = derive.add_param(lay, "backbone.norm_f.weight", { d.D }, "norm_f_w").offset
  return lay.params, off, layer0, stride, derive.align(lay.next)
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

  d.params, d.off, d.layer0, d.layer_stride, d.weights_total = M.layout(d)

  -- RMSNorm: one block per token row of D values, read as float4 vectors
  -- (D is a multiple of 8, so D/4 is whole). One vector per thread when the
  -- row fits: next power of two of D/4 (power of two for the tree reduction),
  -- at least a warp (32), at most 1024 (the block limit; larger rows loop
  -- norm_iters times).
  d.norm_vecs = d.D // 4
  d.norm_threads = math.min(1024, math.max(32, derive.next_pow2(d.norm_vecs)))
  d.norm_iters = derive.ceil_div(d.norm_vecs, d.norm_threads)

  -- Causal conv: one thread per channel, grid (conv_blocks, batch). 128
  -- threads keeps several blocks per sequence for small E (better spread over
  -- the SMs at small batch); from E = 2048 on there are enough blocks and 256
  -- halves the block count.
  d.conv_threads = (d.E < 2048) and 128 or 256
  d.conv_blocks = derive.ceil_div(d.E, d.conv_threads)

  -- Selective scan: scan_lanes threads share one channel, each owning
  -- scan_npt = N/scan_lanes states in registers. scan_lanes is the smallest
  -- power of two keeping scan_npt <= 16 (register pressure): N=16 -> 1 lane,
  -- N=64 -> 4, N=256 -> 16. It divides 32, so a channel's lanes sit in one
  -- warp and y = sum_n s*C reduces with shuffles.
  local lanes = 1
  while d.N // lanes > 16 do lanes = lanes * 2 end
  d.scan_lanes = lanes
  d.scan_npt = d.N // lanes
  -- 128 threads per block: 4 warps, enough blocks for E >= 128 at batch 1.
  d.scan_threads = 128
  d.scan_channels = d.scan_threads // d.scan_lanes
  d.scan_blocks = derive.ceil_div(d.E, d.scan_channels)
  -- B_t and C_t (N floats each) of scan_tchunk timesteps are staged in
  -- shared memory per pass: 32 timesteps, halved while the staging would
  -- exceed 32 KiB (so it stays under the 48 KiB static shared-memory limit
  -- with room for the kernel's own arrays): 32 up to N = 128, 16 at N = 256.
  -- d.scan_smem_bytes = 2 * scan_tchunk * N * 4.
  local tchunk = 32
  while 2 * tchunk * d.N * 4 > 32768 do tchunk = tchunk // 2 end
  d.scan_tchunk = tchunk
  d.scan_smem_bytes = 2 * tchunk * d.N * 4
  return d
end

return M
