-- tests/test_derive_mamba3.lua: mg/derive_mamba3.lua (dims, the weights blob
-- layout of HACKING.md "Weight blob layout (Mamba-3 SISO)", launch shapes)
-- and the mamba3 file set of mg/emit.lua rendered with the real templates.
-- Derived values of the example specs are checked against hand computations.
-- Prints one line per check; raises an error when any check failed.

local derive = require("mg.derive")
local emit = require("mg.emit")
local derive3 = require("mg.derive_mamba3")

local T = require("tests.harness").new("test_derive_mamba3")
local check, is = T.check, T.is

-- A canonical Mamba-3 spec (what validate returns: the schema's defaults
-- where not given here), with overrides.
local function spec3(model, shapes, top, scan)
  return T.spec("mamba3_siso", {
    name = "m3",
    model = { d_model = 128, n_layers = 4, d_state = 64, headdim = 32, input_dim = 64 },
    scan = { mode = "sequential" },
    shapes = { max_batch = 64, max_seq_len = 256 },
  }, { model = model, shapes = shapes, scan = scan }, top or {})
end

-- ------------------------------------------------------------ specs/mamba3_rl.yaml
local rl = derive.derive(spec3(nil, nil, { name = "mamba3_rl" }))
is(rl.D, 128, "rl: D")
is(rl.E, 256, "rl: E")
is(rl.N, 64, "rl: N")
is(rl.P, 32, "rl: P")
is(rl.H, 8, "rl: H = 256/32")
is(rl.G, 1, "rl: G")
is(rl.heads_per_group, 8, "rl: heads per group")
is(rl.S, 16, "rl: S = floor(64*0.5)/2")
is(rl.S2, 32, "rl: 2S rotated entries")
is(rl.in_proj_out, 680, "rl: in_proj outputs 2E+2GN+3H+S = 512+128+24+16")
is(rl.split_z, 0, "rl: z at 0")
is(rl.split_x, 256, "rl: x at E")
is(rl.split_B, 512, "rl: B at 2E")
is(rl.split_C, 576, "rl: C at 2E+GN")
is(rl.split_dd_dt, 640, "rl: dd_dt at 2E+2GN")
is(rl.split_dd_A, 648, "rl: dd_A")
is(rl.split_trap, 656, "rl: trap")
is(rl.split_angles, 664, "rl: angles")
is(rl.split_angles + rl.S, rl.in_proj_out, "rl: angles last")
is(rl.a_heavy_tail, true, "rl: heavy_tail")
is(rl.outproj_norm, true, "rl: outproj_norm")
is(rl.ssm_state_per_seq, 8 * 32 * 64, "rl: ssm state H*P*N")
is(rl.k_prev_per_seq, 8 * 64, "rl: k_prev H*N")
is(rl.v_prev_per_seq, 256, "rl: v_prev H*P")
is(rl.angle_per_seq, 8 * 16, "rl: angle H*S")
-- blob: input_proj.weight 128*64 = 8192 at 0; bias 128 at 8192; layer 0 at
-- 8320: norm 128 | in_proj 680*128 = 87040 at 8448 | dt_bias 8 at 95488 |
-- B_norm 64 at 95552 | C_norm 64 at 95616 | B_bias 512 at 95680 | C_bias 512
-- at 96192 | D 8 at 96704 | norm (gate) 256 at 96768 | out_proj 32768 at
-- 97024 -> layer end 129792, stride 121472; norm_f at 8320 + 4*121472.
is(rl.off.input_proj_w, 0, "rl: input_proj.weight offset")
is(rl.off.input_proj_b, 8192, "rl: input_proj.bias offset")
is(rl.layer0.norm_w, 8320, "rl: layer 0 norm")
is(rl.layer0.in_proj_w, 8448, "rl: in_proj")
is(rl.layer0.dt_bias, 95488, "rl: dt_bias")
is(rl.layer0.B_norm_w, 95552, "rl: B_norm")
is(rl.layer0.C_norm_w, 95616, "rl: C_norm")
is(rl.layer0.B_bias, 95680, "rl: B_bias")
is(rl.layer0.C_bias, 96192, "rl: C_bias")
is(rl.layer0.D, 96704, "rl: D")
is(rl.layer0.norm_gate_w, 96768, "rl: gate norm")
is(rl.layer0.out_proj_w, 97024, "rl: out_proj")
is(rl.layer_stride, 121472, "rl: layer stride")
is(rl.off.norm_f_w, 8320 + 4 * 121472, "rl: norm_f")
is(rl.weights_total, 8320 + 4 * 121472 + 128, "rl: weights_total")
is(#rl.params, 2 + 4 * 10 + 1, "rl: 43 tensors")
is(rl.params[3].name, "layers.0.norm.weight", "rl: block norm name")
is(rl.params[11].name, "layers.0.mixer.norm.weight", "rl: gate norm name (state_dict)")
is(rl.params[8].shape[1] .. "x" .. rl.params[8].shape[2] .. "x" .. rl.params[8].shape[3], "8x1x64", "rl: B_bias shape [H,1,N]")
is(rl.params[#rl.params].name, "norm_f.weight", "rl: norm_f last")
-- every layer tensor = layer 0's + l * stride; all 64-aligned
local uniform, aligned = true, true
for _, p in ipairs(rl.params) do
  if p.layer and p.offset ~= rl.layer0[p.key] + p.layer * rl.layer_stride then uniform = false end
  if p.offset % 64 ~= 0 then aligned = false end
end
check(uniform, "rl: uniform layer stride")
check(aligned, "rl: every tensor 64-aligned")
-- launch shapes
is(rl.norm_threads, 32, "rl: norm_threads (D/4 = 32)")
is(rl.scan_lanes, 4, "rl: scan_lanes (N=64 -> 4 lanes of 16)")
is(rl.scan_npt, 16, "rl: scan_npt")
is(rl.scan_rpt, 1, "rl: one row per thread")
is(rl.scan_threads, 128, "rl: scan block P*lanes = 128")
is(rl.scan_tchunk, 32, "rl: 32 staged steps (656 B each)")
is(rl.scan_smem_bytes, 32 * (2 * 64 + 32 + 4) * 4, "rl: scan stage bytes")
is(rl.angle_blocks, rl.H, "rl: one angle block per head")
is(rl.angle_threads, rl.S * rl.angle_slices, "rl: angle block = S x slices")
is(rl.angle_blocks, rl.H, "rl: one angle block per head")
is(rl.gate_vpl, 1, "rl: gate values per lane")
is(rl.prep_n_per_lane, 2, "rl: prep N/32")
is(rl.scan_kernel, "sequential", "rl: sequential scan")

-- training section (derive_training)
is(rl.bscan_lanes, 4, "rl: training scan lanes = scan lanes")
is(rl.bscan_rpt, 1, "rl: training scan one row per thread (128 threads)")
is(rl.bscan_threads, 128, "rl: training scan block")
is(rl.bscan_warps, 4, "rl: training scan warps")
is(rl.bscan_nw, 1, "rl: one column per thread")
is(rl.bscan_tchunk, 16, "rl: checkpoint every 16 steps (16*1*16 = 256 floats per thread)")
is(rl.bscan_smem_bytes, 4 * (17 * 64 + 16 * 64 + 17 * 32 + 16 * 32 + 8 * 16 + 4 * (3 * 64 + 4)), "rl: backward scan shared memory")
is(rl.max_ckpts, 16, "rl: 256/16 checkpoints")
is(rl.part_width, 512, "rl: widest partial row H*N")
is(rl.gateb_warps .. " " .. rl.gate_hpw, "4 2", "rl: the gate backward's 8 heads over 4 warps, 2 a warp")
is(rl.grad_tol, 1e-4, "rl: f32 gradient tolerance")
is(#rl.adamw_layer, 10, "rl: 10 tensor ranges per layer")
is(#rl.adamw_global, 3, "rl: input_proj weight, bias, norm_f")
is(rl.adamw_layer[2][3], 1, "rl: in_proj is a matrix")
is(rl.adamw_layer[3][3], 2, "rl: dt_bias is not")

-- ------------------------------------------------------------ specs/mamba3_lm.yaml
local lm = derive.derive(spec3({ d_model = 1024, n_layers = 2, d_state = 128, headdim = 64, input_dim = 0 },
  { max_batch = 2, max_seq_len = 2048 }, { name = "mamba3_lm" }, { mode = "chunked" }))
is(lm.H, 32, "lm: H = 2048/64")
is(lm.S, 32, "lm: S = 32")
is(lm.in_proj_out, 4096 + 256 + 96 + 32, "lm: in_proj outputs")
is(lm.off.input_proj_w, nil, "lm: no input_proj")
is(lm.layer0.norm_w, 0, "lm: layer 0 at 0")
is(lm.scan_lanes, 8, "lm: 8 lanes (N=128)")
is(lm.gateb_warps .. " " .. lm.gate_hpw, "16 2", "lm: the gate backward's 32 heads over 16 warps, 2 a warp")
is(lm.scan_threads, 512, "lm: scan block 64 rows x 8 lanes")
is(lm.scan_rpt, 1, "lm: one row per thread")
is(lm.scan_tchunk, 16, "lm: 16 staged steps (1296 B each)")
is(lm.chunk_size, 64, "lm: chunk 64")
is(lm.scan_mode_resolved, "chunked", "lm: scan mode chunked")
is(lm.norm_threads, 256, "lm: norm_threads")
is(lm.weights_total % 64, 0, "lm: total aligned")
is(lm.bscan_rpt, 2, "lm: training scan 2 rows per thread (256 threads)")
is(lm.bscan_threads, 256, "lm: training scan block")
is(lm.bscan_tchunk, 8, "lm: checkpoint every 8 steps (8*2*16 = 256 floats per thread)")
is(lm.max_ckpts, 256, "lm: 2048/8 checkpoints")

-- ------------------------------------------------------------ variants
local g2 = derive.derive(spec3({ ngroups = 2, a_activation = "softplus", outproj_norm = false, rope_fraction = 1.0 }))
is(g2.heads_per_group, 4, "g2: heads per group")
is(g2.S, 32, "g2: rope_fraction 1.0 -> S = N/2")
is(g2.in_proj_out, 512 + 256 + 24 + 32, "g2: in_proj outputs with G = 2")
is(g2.a_heavy_tail, false, "g2: softplus")
is(g2.layer0.norm_gate_w, nil, "g2: no gate norm without outproj_norm")
is(#g2.params, 2 + 4 * 9 + 1, "g2: 9 tensors per layer")
local big = derive.derive(spec3({ d_model = 512, d_state = 256, headdim = 128 }))
is(big.scan_lanes, 16, "big: 16 lanes (N=256)")
is(big.scan_rpt, 4, "big: 4 rows per thread (128*16/4 = 512 threads)")
is(big.scan_threads, 512, "big: scan block 512")
is(big.gate_vpl, 4, "big: gate values per lane (P=128)")
local small = derive.derive(spec3({ d_model = 16, d_state = 16, headdim = 16 }))
is(small.scan_lanes, 1, "small: one lane (N=16)")
is(small.scan_threads, 16, "small: scan block 16 (half a warp)")
is(small.gateb_warps .. " " .. small.gate_hpw, "4 1", "small: the gate backward keeps 4 warps for its 2 heads")

-- ------------------------------------------------------------ inference section: chunked scan, lowp weights
is(rl.scan_emit_chunked, false, "rl: no chunked kernel (mode sequential)")
is(rl.scan_mode_id, 0, "rl: scan mode id 0")
is(rl.scan_auto_min_len, 257, "rl: auto threshold max(257, 4*64)")
is(rl.lowp, false, "rl: f32 GEMM weights")
is(rl.ck_engine, "fma", "rl: f32 chunked engine is FMA (no TF32)")
is(rl.ck_warps, 8, "rl: 8 warps (P*N = 2048)")
is(rl.ck_nw, 16, "rl: state tile 16 x 16 per warp")
is(rl.ck_pw, 16, "rl: output items 16 x 16 (4 row tiles x 2)")
is(rl.ck_min_blocks, 1, "rl: FMA engine compiled for 1 block/SM")
is(lm.scan_emit_chunked, true, "lm: chunked kernel")
is(lm.scan_kernel, "chunked", "lm: chunked prefill")
is(lm.ck_chunk, 64, "lm: kernel chunk 64 (f32 fits: 164 KiB)")
is(lm.ck_smem_bytes, 4 * (2 * 64 * 132 + 128 * 68 + 64 * 68 + 64 * 132 + 8 * 16 * 20) + (7 * 64 + 4) * 4,
  "lm: chunked shared memory")
-- specs/mamba3_perf.yaml with the scan settings `scan`
local function perf_spec(scan)
  return spec3({ d_model = 1024, n_layers = 1, d_state = 128, headdim = 64, input_dim = 0 },
    { max_batch = 8, max_seq_len = 4096 }, { name = "mamba3_perf", precision = "bf16" }, scan)
end
local perf = derive.derive(perf_spec({ mode = "chunked" }))
is(perf.lowp, true, "perf: bf16 GEMM weight copy")
is(perf.ck_engine, "mma_bf16", "perf: tensor cores (mma.sync bf16)")
is(perf.ck_chunk, 64, "perf: chunk 64")
is(perf.ck_warps, 8, "perf: 8 warps")
is(perf.ck_nw, 64, "perf: state tile 16 x 64 per warp (32 registers)")
is(perf.ck_pw, 32, "perf: output items 16 x 32")
is(perf.ck_ny, 8, "perf: 8 output items per chunk")
is(perf.ck_pad, 8, "perf: 16-byte padding = 8 bf16")
is(perf.ck_smem_bytes, 2 * (2 * 64 * 136 + 128 * 72 + 64 * 72 + 64 * 136 + 8 * 16 * 24) + (7 * 64 + 4) * 4,
  "perf: chunked shared memory (2 blocks per SM)")
is(perf.ck_min_blocks, 2, "perf: compiled for 2 blocks per SM")
check(perf.cost.core_flops_per_token > 0 and perf.cost.core_bytes_per_token > 0, "perf: cost model of the SSM core")
-- the split core's kernels add up to the split total; the bf16 perf shapes
-- (H 32, N 128, P 64, G 1, S 32, E 2048) give the figures the bench quotes
local c = perf.cost
is(c.core_prep_bytes_per_token + c.core_angles_bytes_per_token + c.core_scan_bytes_per_token
   + c.core_gate_bytes_per_token, c.core_split_bytes_per_token, "perf: the split kernels' bytes sum to the split total")
is(c.core_prep_bytes_per_token, (2 * 128 + 3 * 32 + 32) * 2 + 3 * 32 * 4 + 2 * 32 * 128 * 4, "perf: prep bytes per token")
is(c.core_gate_bytes_per_token, 2048 * (4 + 2 + 2), "perf: gate bytes per token (y f32, z, g)")
is(c.tcore_fscan_ck_bytes_per_token, 4 * 32 * 32 + 2 * 128 * 2 + 2 * 4 + 2048 * 2 + 3 * 32 * 4 + 2048 * 4
   + 32 * 64 * 128 * 4 // perf.ck_chunk,
   "perf: the chunked training forward scan's bytes: k', q' built from the angle table (f32 per pair), B, C and 1/rms; one checkpoint per chunk")
is(c.tcore_prep_ck_bytes_per_token, (2 * 128 + 3 * 32 + 32) * 2 + 3 * 32 * 4 + 2 * 4 + 32 * 4,
   "perf: the chunked path's prep: scalars, the 1/rms of B and C and the angles' tanh out, no per-head k', q'")
is(c.tcore_angles_ck_bytes_per_token, 32 * 4 + 32 * 4 + 4 * 32 * 32,
   "perf: the chunked path's angle table: tanh and dt in (prep's), the reduced angles out")
check(c.tcore_fscan_seq_bytes_per_token > c.tcore_fscan_ck_bytes_per_token,
      "perf: the sequential forward's checkpoints (every bscan_tchunk steps) cost more than one per chunk")
is(perf.ck_threads_source, "default", "perf: derived block size without a tune entry")
local function perf_tuned(threads)
  return derive.derive(perf_spec({ mode = "chunked", chunk_size = "auto" }),
    { tuned = { chunk_size = 128, scan_threads = threads, source = "tuned" } })
end
local pt = perf_tuned(512)
is(pt.ck_chunk, 128, "perf tuned: the tuned chunk 128")
is(pt.ck_warps, 16, "perf tuned: 512 threads -> 16 warps")
is(pt.ck_threads_source, "tuned", "... from the tune cache")
is(pt.ck_nw, 32, "perf tuned: state tile 16 x 32 per warp")
is(perf_tuned(96).ck_warps, 8, "perf tuned: 3 warps would not split the state evenly -> derived 8")
local autol = derive.derive(spec3(nil, { max_seq_len = 1024 }, nil, { mode = "auto", chunk_size = 128 }))
is(autol.scan_auto_min_len, 512, "auto: threshold 4 chunks of 128")
is(autol.scan_mode_id, 2, "auto: both kernels when max_seq_len reaches it")
local bigc = derive.derive(spec3({ d_model = 512, d_state = 256, headdim = 128 }, nil, nil, { mode = "chunked", chunk_size = 128 }))
is(bigc.ck_warps, 16, "big f32 chunked: 16 warps (P*N = 32768)")
is(bigc.ck_chunk, 16, "big f32 chunked: kernel chunk shrunk to fit 225 KiB")
local bigc80 = derive.derive(spec3({ d_model = 512, d_state = 128, headdim = 64 }, nil, { target = "sm_86", precision = "f16" },
  { mode = "chunked", chunk_size = 128 }))
check(bigc80.ck_smem_bytes <= 97 * 1024, "sm_86: chunked shared memory within 99 KiB")
local tiny = derive.derive(spec3({ d_model = 16, d_state = 16, headdim = 16 }, nil, nil, { mode = "chunked", chunk_size = 16 }))
is(tiny.ck_warps, 2, "tiny chunked: 2 warps (P*N/128)")
is(tiny.ck_nw, 8, "tiny chunked: state tile 16 x 8")

-- ------------------------------------------------------------ training: the chunked SSM backward
is(rl.ckb_emit, false, "rl: no chunked backward (mode sequential)")
is(rl.ckb_chunk, 0, "rl: backward chunk 0")
is(perf.ckb_emit, true, "perf: chunked backward")
is(perf.ckb_chunk, 64, "perf: backward chunk = the spec's 64 (bf16 fits)")
is(perf.ckb_warps, 8, "perf: backward 8 warps")
is(perf.ckb_nw, 64, "perf: adjoint tile 16 x 64 per warp")
-- the chunked backward's per-head dk, dq rows: f32 for f32 storage, bf16 for
-- both 16-bit dtypes (f16 too: the range of a scaled loss's gradients)
is(perf.ckb_dkq_t .. " " .. perf.ckb_dkq_size, "__nv_bfloat16 2", "perf (bf16): dk, dq rows in bf16")
is(bigc80.ckb_dkq_t .. " " .. bigc80.ckb_dkq_size, "__nv_bfloat16 2", "f16 storage: dk, dq rows in bf16, not f16")
is(rl.ckb_dkq_t .. " " .. rl.ckb_dkq_size, "float 4", "f32 storage: dk, dq rows in f32")
is(perf.ckb_cw, 32, "perf: dq/dk/dv items 16 x 32")
is(perf.ckb_yvp, 2, "perf: two dy.v partials per token (P = 64)")
is(perf.ckb_floats, 64 * (13 + 2 + 3 * 4 + 2 * (128 // 32)) + 8 + 16, "perf: backward f32 scratch")
is(perf.ckb_ye_in_m, true, "perf: E dY staged where M and W were (72 <= 2 x 72)")
is(perf.ckb_smem_bytes, 2 * (2 * 64 * 136 + 2 * 64 * 72 + 2 * 64 * 136 + 2 * 64 * 72) + 4 * perf.ckb_floats,
  "perf: backward shared memory")
check(perf.ckb_smem_bytes <= 225 * 1024, "perf: backward shared memory within sm_90's 225 KiB")
is(perf.ckb_smem_bytes, 115552, "perf: 115552 bytes: two blocks fit the 228 KiB of an SM (1 KiB each reserved)")
is(perf.ckb_min_blocks, 2, "perf: backward compiled for two blocks per SM")
is(perf.ckb_chunk % perf.bscan_tchunk, 0, "perf: a backward chunk is whole checkpoint slots")
is(lm.ckb_emit, true, "lm: chunked backward")
is(lm.ckb_chunk, 64, "lm: f32 backward chunk = the spec's 64 (213856 bytes, E dY where M and W were)")
is(lm.ckb_smem_bytes, 213856, "lm: f32 backward shared memory at chunk 64")
is(lm.ckb_min_blocks, 1, "lm: f32 chunk 64: one block per SM")
is(tiny.ckb_yvp, 1, "tiny: one dy.v partial per token (P = 16)")
is(tiny.ckb_warps, 2, "tiny: backward 2 warps (P*N/128)")
-- E dY needs its own buffer when a row of it is wider than M and W's two
-- rows together: P = 64 in 16-step chunks (f32: 68 > 2 x 20)
local ye16 = derive.derive(spec3({ d_state = 64, headdim = 64 }, nil, { precision = "f32" },
  { mode = "chunked", chunk_size = 16 }))
is(ye16.ckb_chunk, 16, "P 64, chunk 16: backward chunk 16")
is(ye16.ckb_ye_in_m, false, "P 64, chunk 16: E dY in a buffer of its own (68 > 2 x 20)")
local n256a = derive.derive(spec3({ d_state = 256, headdim = 128 }, { max_seq_len = 1024, max_batch = 4 }, nil,
  { mode = "auto" }))
is(n256a.scan_emit_chunked, true, "n256 auto f32: chunked forward emitted")
is(n256a.ckb_emit, false, "n256 auto f32: no chunked backward (shared memory)")
check(type(n256a.ckb_why) == "string" and n256a.ckb_why:find("shared memory", 1, true) ~= nil,
  "n256 auto f32: the reason names shared memory", tostring(n256a.ckb_why))

-- ------------------------------------------------------------ single-token decode (d.dec_*)
-- perf (bf16, D 1024, NP 4480, E 2048): in_proj 4 rows per warp, 32 per
-- block -> 140 blocks; out_proj 1 row per warp -> 128 blocks; whole rows
-- staged (8 rows x 1024 / 2048 bf16 = 16 / 32 KiB).
is(perf.dec_max_batch, 8, "perf decode: GEMV up to batch 8")
is(perf.dec_nb_max, 8, "perf decode: widest GEMV instance 8 rows")
is(perf.dec_vw, 8, "perf decode: 8 bf16 per 16-byte load")
is(perf.dec_mix_threads, 512, "perf decode: mixer block = scan block")
is(perf.dec_in_rw .. "/" .. perf.dec_in_ks .. "/" .. perf.dec_in_rpb .. "/" .. perf.dec_in_blocks, "4/1/32/140",
  "perf decode: in_proj rows per warp / K-split / rows per block / grid")
is(perf.dec_in_kt .. "/" .. perf.dec_in_vpl, "1024/4", "perf decode: in_proj one pass, 4 vectors per lane and row")
is(perf.dec_in_smem_bytes, 8 * 1024 * 2 + 4 * 32 * 8, "perf decode: in_proj shared memory")
is(perf.dec_out_rw .. "/" .. perf.dec_out_ks .. "/" .. perf.dec_out_rpb .. "/" .. perf.dec_out_blocks, "1/1/8/128",
  "perf decode: out_proj shape")
is(perf.dec_out_kt .. "/" .. perf.dec_out_vpl, "2048/8", "perf decode: out_proj one pass, 8 vectors per lane")
is(perf.dec_out_smem_bytes, 8 * 2048 * 2 + 4 * 8 * 8, "perf decode: out_proj shared memory")
-- rl (f32, D 128, max_batch 64): small rows -> K split across warps to fill the GPU
is(rl.dec_max_batch, 16, "rl decode: GEMV up to batch 16 (max_batch 64: cuBLAS above)")
is(rl.dec_vw, 4, "rl decode: 4 f32 per 16-byte load")
is(rl.dec_in_rw .. "/" .. rl.dec_in_ks .. "/" .. rl.dec_in_blocks, "1/2/170", "rl decode: in_proj 2-way K split, 170 blocks")
is(rl.dec_out_rw .. "/" .. rl.dec_out_ks .. "/" .. rl.dec_out_blocks, "1/8/128", "rl decode: out_proj 8-way K split, 128 blocks")
is(rl.dec_out_kt .. "/" .. rl.dec_out_vpl, "256/1", "rl decode: out_proj one pass")
-- the grid the GEMVs aim at: one block per SM, rounded down to a multiple of 8
is(derive3.dec_blocks_target(132) .. "/" .. derive3.dec_blocks_target(108) .. "/" .. derive3.dec_blocks_target(80)
  .. "/" .. derive3.dec_blocks_target(170) .. "/" .. derive3.dec_blocks_target(4), "128/104/80/168/8",
  "decode: blocks target from the SM count (132 -> 128)")
is(perf.sms .. "/" .. perf.dec_blocks_target, "132/128", "perf decode: no GPU queried -> 132 SMs, target 128")
-- with `chunk_size: auto` and a queried GPU (opts.tuned.sms): 170 SMs want
-- more blocks (perf: in_proj 2 rows per warp, out_proj a 2-way K split);
-- 80 SMs fewer (rl: in_proj without its K split)
local function sms_opts(sms) return { tuned = { chunk_size = 64, source = "default", sms = sms } } end
local p170 = derive.derive(perf_spec({ mode = "chunked", chunk_size = "auto" }), sms_opts(170))
is(p170.dec_in_rw .. "/" .. p170.dec_in_ks .. "/" .. p170.dec_in_rpb .. "/" .. p170.dec_in_blocks, "2/1/16/280",
  "sms 170: perf in_proj 280 blocks")
is(p170.dec_out_rw .. "/" .. p170.dec_out_ks .. "/" .. p170.dec_out_rpb .. "/" .. p170.dec_out_blocks, "1/2/4/256",
  "sms 170: perf out_proj 256 blocks")
local p132 = derive.derive(perf_spec({ mode = "chunked", chunk_size = "auto" }), sms_opts(132))
is(p132.dec_in_blocks .. "/" .. p132.dec_out_blocks, "140/128", "sms 132 queried: the default's shapes")
local r80 = derive.derive(spec3(nil, nil, { name = "mamba3_rl" }, { chunk_size = "auto" }), sms_opts(80))
is(r80.dec_in_rw .. "/" .. r80.dec_in_ks .. "/" .. r80.dec_in_blocks, "1/1/85", "sms 80: rl in_proj 85 blocks, no K split")
-- lm (f32, max_batch 2): K = D = 1024 f32 in 2 passes of 512 (16 loads in flight)
is(lm.dec_max_batch .. "/" .. lm.dec_nb_max, "2/2", "lm decode: batch bound by max_batch")
is(lm.dec_in_kt, 512, "lm decode: in_proj passes of 512 columns")
-- every shape: whole grid, K in whole passes, shared memory under 48 KiB
for _, c in ipairs({ { "rl", rl }, { "lm", lm }, { "perf", perf }, { "tiny", tiny }, { "n256a", n256a } }) do
  local nm, x = c[1], c[2]
  for _, g in ipairs({ { "in", x.in_proj_out, x.D }, { "out", x.D, x.E } }) do
    local p = "dec_" .. g[1] .. "_"
    check(x[p .. "blocks"] * x[p .. "rpb"] >= g[2] and g[3] % x[p .. "kt"] == 0 and x[p .. "kt"] % x.dec_vw == 0
      and x[p .. "vpl"] * 32 * x[p .. "ks"] * x.dec_vw >= x[p .. "kt"] and x[p .. "smem_bytes"] <= 48 * 1024,
      nm .. " decode: " .. g[1] .. "_proj GEMV shape is whole")
  end
  check(x.dec_mix_threads >= x.scan_threads and x.dec_mix_threads % 32 == 0, nm .. " decode: mixer block")
end

-- ------------------------------------------------------------ emit with the real templates
local sp = spec3(nil, nil, { name = "mamba3_rl" })
local ok, files = pcall(emit.files, sp, derive.derive(sp),
  { spec_name = "mamba3_rl.yaml", spec_hash = string.rep("b", 64) }, {})
check(ok, "emit.files renders the mamba3 templates", not ok and tostring(files) or nil)
if ok then
  local names = {}
  for i, f in ipairs(files) do names[i] = f.path .. "<" .. f.template end
  local want = { "mamba3_rl.h<mamba3/model.h.tmpl", "mamba3_rl_common.cuh<mamba3/common.cuh.tmpl",
    "mamba3_rl_kernels.cu<mamba3/kernels.cu.tmpl", "mamba3_rl.c<mamba3/model.c.tmpl",
    "model_alias.h<common/model_alias.h.tmpl", "mamba3_rl_test.c<host/mamba3/test.c", "fwd_tests.h<host/common/fwd_tests.h",
    "mamba3_rl_bench.c<host/mamba3/bench.c",
    "bench_util.h<host/common/bench_util.h", "Makefile<common/Makefile.tmpl",
    -- the kernel bodies, copied (plain CUDA)
    "mg_dtype.cuh<kernels/common/dtype.cuh", "mg_norm.cuh<kernels/common/norm.cuh", "mg_m3_prep.cuh<kernels/mamba3/prep.cuh",
    "mg_m3_angles.cuh<kernels/mamba3/angles.cuh", "mg_m3_scan.cuh<kernels/mamba3/scan.cuh",
    "mg_m3_tiles.cuh<kernels/mamba3/tiles.cuh", "mg_m3_chunked_fwd.cuh<kernels/mamba3/chunked_fwd.cuh",
    "mg_m3_gate.cuh<kernels/mamba3/gate.cuh", "mg_m3_launch_fwd.cuh<kernels/mamba3/launch_fwd.cuh",
    "mg_m3_decode.cuh<kernels/mamba3/decode.cuh", "mg_m3_launch_decode.cuh<kernels/mamba3/launch_decode.cuh",
    "mg_m3_train_fwd.cuh<kernels/mamba3/train_fwd.cuh", "mg_m3_scan_bwd.cuh<kernels/mamba3/scan_bwd.cuh",
    "mg_m3_chunked_bwd.cuh<kernels/mamba3/chunked_bwd.cuh", "mg_m3_launch_train.cuh<kernels/mamba3/launch_train.cuh",
    -- the training half (emit.training)
    "mamba3_rl_train.h<mamba3/train.h.tmpl", "mamba3_rl_backward.cu<mamba3/backward.cu.tmpl",
    "mamba3_rl_train.c<mamba3/train.c.tmpl", "mg_m3_train_pipeline.h<host/mamba3/train_pipeline.h",
    "mg_train_host.h<host/common/train_host.h",
    "mamba3_rl_train_test.c<host/mamba3/train_test.c",
    "train_tests.h<host/common/train_tests.h", "mamba3_rl_nccl.c<host/common/nccl_train.c" }
  local have = {}
  for _, nm in ipairs(names) do have[nm] = true end
  for _, nm in ipairs(want) do check(have[nm], "emit: mamba3 file " .. nm) end
  local byname = {}
  for _, f in ipairs(files) do byname[f.path] = f.content end
  -- the constants live in the shared header, the kernels include it
  local h, cu, c = byname["mamba3_rl.h"], byname["mamba3_rl_common.cuh"] .. byname["mamba3_rl_kernels.cu"], byname["mamba3_rl.c"]
  check(h:find("^// Code generated by mamba%-gen .- from mamba3_rl%.yaml %(sha256 bbbbbbbbbbbbbbbb%) with template mamba3/model%.h%.tmpl%. DO NOT EDIT%.\n") ~= nil,
    "emit: provenance line")
  check(h:find("\n#define MAMBA3_RL_N_HEADS      8 ", 1, true) ~= nil, "emit: header N_HEADS")
  check(h:find("\n#define MAMBA3_RL_WEIGHTS_FLOATS 494336u", 1, true) ~= nil, "emit: header WEIGHTS_FLOATS")
  check(h:find("mamba3_rl_prefill(mamba3_rl_model *m, int batch, int seqlen,", 1, true) ~= nil, "emit: prefill prototype")
  check(cu:find("\nconstexpr int NP = 680;", 1, true) ~= nil, "emit: kernels NP constant")
  check(cu:find("\nconstexpr int OFF_ANG = 664;", 1, true) ~= nil, "emit: kernels angle split")
  check(cu:find("\nconstexpr bool A_HEAVY_TAIL = true;", 1, true) ~= nil, "emit: heavy_tail branch")
  check(cu:find("\nconstexpr int SCAN_THREADS = 128;", 1, true) ~= nil, "emit: scan block")
  check(c:find('{ "layers.3.mixer.out_proj.weight", ' .. rl.params[#rl.params - 1].offset .. "u, 2, { 128, 256, 0, 0 }, 32768u },", 1, true) ~= nil,
    "emit: parameter table row")
  check(c:find("L0_NORM_GATE_W", 1, true) ~= nil, "emit: gate norm offset")
  check(not cu:find("{{", 1, true) and not c:find("{{", 1, true) and not h:find("{{", 1, true), "emit: no template syntax left")
  -- training half
  is(names[#names - 1] .. " " .. names[#names], "Makefile<common/Makefile.tmpl mamba3_rl.py<common/torch_module.py.tmpl",
    "emit: the Makefile, then the PyTorch module, last")
  local py = byname["mamba3_rl.py"]
  check(py:find("^# Code generated by mamba%-gen .- with template common/torch_module%.py%.tmpl%. DO NOT EDIT%.\n") ~= nil
    and py:find('\nNAME = "mamba3_rl"\n', 1, true) ~= nil and py:find("\nN_HEADS = 8\n", 1, true) ~= nil
    and py:find("\nWEIGHTS_FLOATS = 494336\n", 1, true) ~= nil and py:find("\nclass Model(torch.nn.Module):", 1, true) ~= nil
    and not py:find("{{", 1, true) and not py:find("{%", 1, true),
    "emit: mamba3_rl.py: provenance, the model's constants, the code")
  check(h:find('\n#include "mamba3_rl_train.h"\n', 1, true) ~= nil, "emit: header includes the training API")
  check(byname["Makefile"]:find("./$(NAME)_train_test", 1, true) ~= nil, "emit: make check runs the training test")
  check(byname["mamba3_rl_backward.cu"]:find("\nconstexpr int CKPT_STRIDE = 16;", 1, true) ~= nil, "emit: backward checkpoint stride")
  check(byname["mamba3_rl_train.h"]:find("mamba3_rl_backward(mamba3_rl_trainer *t,", 1, true) ~= nil, "emit: backward prototype")
  local tr = byname["mamba3_rl_train.h"] .. byname["mamba3_rl_backward.cu"] .. byname["mamba3_rl_train.c"] .. byname["mamba3_rl_train_test.c"]
  check(not tr:find("{{", 1, true) and not tr:find("{%", 1, true), "emit: no template syntax left in the training files")
  local spn = spec3(nil, nil, { name = "m3n", emit = { training = false, inference = true, deterministic = true } })
  local okn, fn = pcall(emit.files, spn, derive.derive(spn), { spec_name = "m3n.yaml", spec_hash = string.rep("d", 64) }, {})
  check(okn, "emit: renders without emit.training", not okn and tostring(fn) or nil)
  if okn then
    local bn = {}
    for _, f in ipairs(fn) do bn[f.path] = f.content end
    check(bn["m3n_train.h"] == nil and bn["m3n_backward.cu"] == nil and bn["m3n_train.c"] == nil and
      bn["m3n_train_test.c"] == nil, "emit: no training files without emit.training")
    check(not bn["m3n.h"]:find("_train.h", 1, true), "emit: no training include without emit.training")
    check(not bn["Makefile"]:find("./$(NAME)_train_test", 1, true), "emit: make check without the training test")
    check(bn["m3n.h"]:find('\n#define M3N_SPEC_SHA256 "' .. string.rep("d", 64) .. '"', 1, true) ~= nil and
      bn["m3n.h"]:find('\n#define M3N_VERSION "0.1.0"', 1, true) ~= nil, "emit: version and spec hash macros")
    check(bn["Makefile"]:find("\nVERSION = 0.1.0\n", 1, true) ~= nil and bn["m3n.pc.in"]:find("\nVersion: 0.1.0\n", 1, true) ~= nil,
      "emit: the Makefile and m3n.pc.in carry the version")
  end
  local sp2 = spec3({ outproj_norm = false, input_dim = 0, a_activation = "softplus" }, nil, { name = "m3b", precision = "bf16" })
  local ok2, f2 = pcall(emit.files, sp2, derive.derive(sp2), { spec_name = "m3b.yaml", spec_hash = string.rep("c", 64) }, {})
  check(ok2, "emit: variant without gate norm / input_proj, softplus, bf16 renders", not ok2 and tostring(f2) or nil)
  if ok2 then
    local b2 = {}
    for _, f in ipairs(f2) do b2[f.path] = f.content end
    check(not b2["m3b.c"]:find("L0_NORM_GATE_W", 1, true), "emit: no gate norm offset without outproj_norm")
    check(b2["m3b_common.cuh"]:find("\ntypedef __nv_bfloat16 act_t;", 1, true) ~= nil, "emit: bf16 storage type")
    check(b2["m3b_common.cuh"]:find("\nconstexpr bool A_HEAVY_TAIL = false;", 1, true) ~= nil, "emit: softplus branch")
    check(b2["m3b.c"]:find("\n#define LOWP 1", 1, true) ~= nil, "emit: bf16 GEMM weight copy")
  end
end

return T.done()
