-- tests/test_derive.lua: mg/derive.lua, mg/derive_mamba1.lua, mg/yaml_out.lua,
-- mg/emit.lua's dispatch and mg/init.lua's main(). Derived values of the
-- example specs are checked against hand computations.
-- Prints one line per check; raises an error when any check failed.

local derive = require("mg.derive")
local yaml_out = require("mg.yaml_out")
local init = require("mg.init")

local T = require("tests.harness").new("test_derive")
local check, is = T.check, T.is

-- A canonical Mamba-1 spec (what validate returns: the schema's defaults
-- where not given here), with overrides.
local function spec1(model, shapes, top)
  return T.spec("mamba1", { name = "m", model = { d_model = 128, n_layers = 4 }, shapes = { max_batch = 8, max_seq_len = 256 } },
    { model = model, shapes = shapes }, top or {})
end

-- A host-style tree from an ordered description { {key, value-or-list}, ... }.
local line = 0
local function tree(desc, col)
  col = col or 1
  line = line + 1
  local node = { kind = "map", keys = {}, values = {}, line = line, col = col }
  line = line - 1
  for _, kv in ipairs(desc) do
    line = line + 1
    node.keys[#node.keys + 1] = { kind = "scalar", value = kv[1], plain = true, line = line, col = col }
    if type(kv[2]) == "table" then
      node.values[#node.values + 1] = tree(kv[2], col + 2)
    else
      node.values[#node.values + 1] = { kind = "scalar", value = kv[2], plain = true, line = line, col = col + #kv[1] + 2 }
    end
  end
  return node
end

-- ------------------------------------------------------------ specs/mamba1_rl.yaml
local rl = derive.derive(spec1({ input_dim = 64 }, { max_batch = 64, max_seq_len = 256 },
  { name = "mamba1_rl" }))
is(rl.name, "mamba1_rl", "rl: name")
is(rl.NAME, "MAMBA1_RL", "rl: NAME")
is(rl.D, 128, "rl: D")
is(rl.E, 256, "rl: E")
is(rl.decode_part_floats, 64 * 2 * 40, "rl: fused decode x_proj partials (64 x 2 conv blocks x XP 40)")
is(rl.N, 16, "rl: N")
is(rl.K, 4, "rl: K")
is(rl.R, 8, "rl: R = ceil(128/16)")
is(rl.L, 4, "rl: L")
is(rl.XP, 40, "rl: XP = R+2N")
is(rl.in_dim, 64, "rl: in_dim = input_dim")
is(rl.max_tokens, 64 * 256, "rl: max_tokens")
is(rl.eps, 1e-5, "rl: eps")
is(rl.act_t, "float", "rl: act_t")
is(rl.mg_dtype, "MG_F32", "rl: mg_dtype")
is(rl.act_size, 4, "rl: act_size")
is(rl.sm, 90, "rl: sm")
is(rl.scan_mode_resolved, "auto", "rl: auto with both scans -> the call decides")
-- blob: input_proj.weight 128*64 = 8192 at 0; bias 128 at 8192; layer 0 at 8320
is(rl.off.input_proj_w, 0, "rl: input_proj.weight offset")
is(rl.off.input_proj_b, 8192, "rl: input_proj.bias offset")
is(rl.layer0.norm_w, 8320, "rl: layer0 norm offset")
is(rl.layer0.in_proj_w, 8448, "rl: layer0 in_proj offset")
is(rl.layer0.conv_w, 8448 + 65536, "rl: layer0 conv offset")
is(rl.layer0.conv_b, 73984 + 1024, "rl: layer0 conv bias offset")
is(rl.layer0.x_proj_w, 75264, "rl: layer0 x_proj offset")
is(rl.layer0.dt_proj_w, 75264 + 10240, "rl: layer0 dt_proj offset")
is(rl.layer0.dt_proj_b, 85504 + 2048, "rl: layer0 dt_proj bias offset")
is(rl.layer0.A_log, 87808, "rl: layer0 A_log offset")
is(rl.layer0.D, 87808 + 4096, "rl: layer0 D offset")
is(rl.layer0.out_proj_w, 92160, "rl: layer0 out_proj offset")
is(rl.layer_stride, 92160 + 32768 - 8320, "rl: layer stride = 116608")
is(rl.off.norm_f_w, 8320 + 4 * 116608, "rl: norm_f offset")
is(rl.weights_total, 8320 + 4 * 116608 + 128, "rl: weights_total = 474880")
is(#rl.params, 2 + 4 * 10 + 1, "rl: 43 tensors")
is(rl.params[1].name, "backbone.input_proj.weight", "rl: first tensor name")
is(rl.params[3].name, "backbone.layers.0.norm.weight", "rl: layer 0 norm name")
is(rl.params[4].name, "backbone.layers.0.mixer.in_proj.weight", "rl: in_proj name")
is(rl.params[4].key, "in_proj_w", "rl: in_proj key")
is(rl.params[4].layer, 0, "rl: in_proj layer")
is(rl.params[4].numel, 512 * 128, "rl: in_proj numel")
is(table.concat(rl.params[5].shape, ","), "256,1,4", "rl: conv1d.weight shape [E,1,K]")
is(table.concat(rl.params[7].shape, ","), "40,256", "rl: x_proj shape [R+2N,E]")
is(rl.params[13].name, "backbone.layers.1.norm.weight", "rl: layer 1 starts after 10 tensors")
is(rl.params[13].offset, 8320 + 116608, "rl: layer 1 offset = layer0 + stride")
is(rl.params[#rl.params].name, "backbone.norm_f.weight", "rl: last tensor norm_f")
is(rl.params[#rl.params].layer, nil, "rl: norm_f has no layer")
local aligned = true
for _, p in ipairs(rl.params) do if p.offset % 64 ~= 0 then aligned = false end end
check(aligned, "rl: every offset is a multiple of 64")
is(rl.weights_total % 64, 0, "rl: total is a multiple of 64")
-- launch shapes
is(rl.norm_threads, 32, "rl: norm_threads (D/4 = 32)")
is(rl.conv_threads, 128, "rl: conv_threads")
is(rl.conv_blocks, 2, "rl: conv_blocks")
is(rl.conv_tile, 16, "rl: conv_tile (time steps per conv thread)")
is(rl.conv_max_tiles, 16, "rl: conv_max_tiles = 256/16")
is(rl.conv_parts, 64 * 16, "rl: conv-backward partials per parameter = max_batch x tiles")
is(rl.conv_part_group, 32, "rl: conv partials summed per thread in stage 1")
is(rl.scan_lanes, 4, "rl: scan_lanes (N=16 at batch 64: 16K threads of one lane, spread to 4 lanes)")
is(rl.scan_npt, 4, "rl: scan_npt")
is(rl.scan_threads, 128, "rl: scan_threads (128: 8 blocks per sequence already)")
is(rl.scan_channels, 32, "rl: scan_channels")
is(rl.scan_blocks, 8, "rl: scan_blocks")
is(rl.scan_auto_prefill_blocks, 8, "rl: the auto rule counts 8 blocks of 4 warps a sequence")
is(rl.scan_base_blocks, 8, "rl: base blocks (training's auto rule) = forward blocks")
is(rl.scan_tchunk, 32, "rl: scan_tchunk")
is(rl.E2, 512, "rl: E2")
is(rl.Km1, 3, "rl: Km1")
is(rl.xp_B, 8, "rl: xp_B")
is(rl.xp_C, 24, "rl: xp_C")

-- ------------------------------------------------------------ specs/mamba1_130m.yaml
local m130 = derive.derive(spec1({ d_model = 768, n_layers = 24 }, { max_batch = 8, max_seq_len = 512 },
  { name = "mamba1_130m" }))
is(m130.E, 1536, "130m: E")
is(m130.R, 48, "130m: R")
is(m130.XP, 80, "130m: XP")
is(m130.in_dim, 768, "130m: in_dim = D (identity input)")
is(m130.off.input_proj_w, nil, "130m: no input_proj")
is(m130.layer0.norm_w, 0, "130m: layer 0 at 0")
-- per layer: 768 + 3072*768 + 1536*4 + 1536 + 80*1536 + 1536*48 + 1536 + 1536*16 + 1536 + 768*1536
local per_layer = 768 + 3072 * 768 + 1536 * 4 + 1536 + 80 * 1536 + 1536 * 48 + 1536 + 1536 * 16 + 1536 + 768 * 1536
is(per_layer, 3771648, "130m: hand-computed layer size")
is(m130.layer_stride, 3771648, "130m: layer_stride (all sizes multiples of 64)")
is(m130.weights_total, 24 * 3771648 + 768, "130m: weights_total = 90520320 (+ 38.6M embedding = 129.1M params)")
is(#m130.params, 241, "130m: 241 tensors")
is(m130.scan_mode_resolved, "auto", "130m: auto at max_seq_len 512 -> both scans, the call decides")
is(m130.norm_threads, 256, "130m: norm_threads (next pow2 of 192)")
is(m130.norm_iters, 1, "130m: norm_iters")
is(m130.conv_threads, 128, "130m: conv_threads")
is(m130.scan_lanes, 4, "130m: 4 lanes (8 x 1536 channels: 12K threads of one lane)")
is(m130.scan_blocks, 48, "130m: scan_blocks (32 channels of 4 lanes per block)")

-- ------------------------------------------------------------ other shapes
local function lanes_of(N)
  local d = derive.derive(spec1({ d_state = N }))
  return string.format("%d/%d/%d/%d", d.scan_lanes, d.scan_npt, d.scan_channels, d.scan_tchunk)
end
is(lanes_of(1), "1/1/32/32", "N=1: 1 lane, E 256: 32 channels per block (8 blocks)")
-- (the forward spreads a channel down to 4 states a thread, or to 32
-- lanes; blocks of 16 channels from 8 lanes on, at least 128 threads)
is(lanes_of(8), "2/4/32/32", "N=8: 2 lanes of 4 states")
is(lanes_of(32), "8/4/16/32", "N=32: 8 lanes")
is(lanes_of(64), "16/4/16/32", "N=64: 16 lanes, 256 threads")
is(lanes_of(128), "32/4/16/32", "N=128: 32 lanes, 512 threads")
is(lanes_of(256), "32/8/16/16", "N=256: 32 lanes (at most), tchunk 16")
-- the base shape (scan backward, auto rule) spreads only while threads are few
local function lanes_at(N, batch, mode)
  local d = derive.derive(spec1({ d_state = N }, { max_batch = batch, max_seq_len = 1024 },
    { scan = { mode = mode, chunk_size = 64 } }))
  return string.format("%d/%d", d.scan_base_lanes, d.scan_lanes)
end
is(lanes_at(16, 256, "auto"), "1/4", "N=16 at batch 256: base 1 lane (64K threads), forward 4")
is(lanes_at(64, 64, "auto"), "4/16", "N=64 at batch 64: base 4 lanes (the register bound) already give 64K threads")
is(lanes_at(16, 8, "chunked"), "2/4", "chunked: 16 chunks per window count: 8 x 16 x 256 = 32K, so base 2 lanes")
local big = derive.derive(spec1({ d_model = 8192, expand = 2 }))
is(big.norm_threads, 1024, "D=8192: norm_threads capped at 1024")
is(big.norm_iters, 2, "D=8192: norm_iters 2")
is(big.conv_threads, 256, "E=16384: conv_threads 256")
local small = derive.derive(spec1({ d_model = 8, expand = 1, dt_rank = 3, d_conv = 2 }))
is(small.R, 3, "explicit dt_rank")
is(small.norm_threads, 32, "D=8: norm_threads at least 32")
is(small.layer_stride % 64, 0, "tiny dims: stride still 64-aligned")
local one = derive.derive(spec1({ n_layers = 1 }))
is(one.layer_stride, rl.layer_stride, "L=1: stride = aligned layer size (same layer dims as rl)")
local bf = derive.derive(spec1(nil, nil, { precision = "bf16" }))
is(bf.act_t, "__nv_bfloat16", "bf16 act_t")
is(bf.mg_dtype, "MG_BF16", "bf16 mg_dtype")
is(bf.act_size, 2, "bf16 act_size")
is(bf.check_tol, 2e-2, "bf16 check_tol")
is(rl.check_tol, 1e-5, "f32 check_tol")
is(bf.unit_roundoff, 2^-8, "bf16 unit roundoff 2^-8 (8 significand bits)")
is(rl.unit_roundoff, 2^-24, "f32 unit roundoff 2^-24")
is(rl.tf32, false, "f32: no TF32 unless allow_tf32")
-- allow_tf32: f32 storage, the projection GEMMs on TF32: f16's tolerances
local tf = derive.derive(spec1(nil, nil, { allow_tf32 = true, emit = { training = true, inference = true, deterministic = true } }))
is(tf.tf32, true, "allow_tf32: d.tf32")
is(tf.dtype .. "/" .. tf.act_t, "f32/float", "allow_tf32: f32 storage")
is(tf.check_tol, 5e-3, "allow_tf32: f16's check tolerance")
is(tf.chunk_vs_seq_tol, 5e-3, "allow_tf32: chunked vs sequential at check_tol (a TF32 input may round the other way)")
is(tf.grad_tol, 1e-2, "allow_tf32: f16's gradient tolerance")
is(tf.unit_roundoff, 2^-11, "allow_tf32: f16's unit roundoff (TF32 keeps 10 mantissa bits)")
is(rl.grad_tol, 1e-4, "f32: gradient tolerance 1e-4")
local h = derive.derive(spec1(nil, nil, { precision = "f16", target = "sm_80", scan = { mode = "chunked", chunk_size = "auto" } }))
is(h.act_t, "__half", "f16 act_t")
is(h.sm, 80, "sm_80")
is(h.scan_mode_resolved, "chunked", "explicit chunked")
is(h.chunk_size, 64, "chunk_size auto -> 64")
is(h.scan_threads, 128, "no tune entry: derived scan block size (E 256 x 4 lanes: 8 blocks of 128)")
is(h.scan_threads_source, "default", "... source default")
local autospec = spec1(nil, nil, { scan = { mode = "chunked", chunk_size = "auto" } })
local tu = derive.derive(autospec, { tuned = { chunk_size = 32, scan_threads = 256, source = "tuned" } })
is(tu.chunk_size, 32, "tuned chunk")
is(tu.scan_threads, 256, "tuned scan block size")
is(tu.scan_threads_source, "tuned", "... source tuned")
is(tu.scan_channels * tu.scan_lanes, 256, "... channels x lanes = block")
local odd = derive.derive(autospec, { tuned = { chunk_size = 32, scan_threads = 48, source = "tuned" } })
is(odd.scan_threads, 128, "a tuned block size that is not whole warps is ignored")
local fixed = derive.derive(spec1(nil, nil, { scan = { mode = "chunked", chunk_size = 32 } }),
  { tuned = { chunk_size = 16, scan_threads = 256, source = "tuned" } })
is(fixed.scan_threads, 128, "a fixed chunk_size does not read the tune cache")

-- ------------------------------------------------------------ Mamba-1 inference section
-- (derive_mamba1.lua derive_inference: mixed precision, chunked scan)
is(rl.lowp, false, "rl: f32 has no low-precision weight copy")
is(rl.weights_act_bytes, 0, "rl: no copy bytes")
is(bf.lowp, true, "bf16: low-precision weight copy")
is(bf.weights_act_bytes, bf.weights_total * 2, "bf16: copy = weights_total bf16 elements")
is(rl.scan_chunk, 64, "rl: chunk 64")
is(rl.scan_auto_min_len, 128, "auto threshold: 2 chunks")
is(rl.scan_emit_sequential, true, "sequential kernel always emitted")
is(rl.scan_emit_chunked, true, "rl (auto, max_seq_len 256 >= 2 chunks): chunked kernels too")
is(rl.scan_mode_id, 2, "rl: the host picks per call")
is(rl.scan_cstate_floats, 64 * 4 * 256 * 16, "rl: chunk states MAX_BATCH*chunks*E*N")
is(m130.scan_emit_chunked, true, "130m (auto, max_seq_len 512): chunked kernels too")
is(m130.scan_mode_id, 2, "130m: host picks by seqlen")
is(m130.scan_max_chunks, 8, "130m: 512/64 chunks")
is(m130.scan_cstate_floats, 8 * 8 * 1536 * 16, "130m: chunk states MAX_BATCH*chunks*E*N")
is(m130.scan_dsum_floats, 8 * 8 * 1536, "130m: chunk delta sums MAX_BATCH*chunks*E")
is(h.scan_emit_chunked, true, "explicit chunked: chunked kernels")
is(h.scan_mode_id, 1, "explicit chunked: mode id 1")
is(h.chunk_vs_seq_tol, 5e-3, "f16: chunked vs sequential at check_tol")
is(h.unit_roundoff, 2^-11, "f16 unit roundoff 2^-11")
is(rl.chunk_vs_seq_tol, 1e-5, "f32: chunked vs sequential at 1e-5")
local c256 = derive.derive(spec1(nil, { max_seq_len = 700 }, { scan = { mode = "chunked", chunk_size = 256 } }))
is(c256.scan_max_chunks, 3, "chunk 256, max_seq_len 700: 3 chunks (last partial)")
is(c256.scan_auto_min_len, 512, "chunk 256: auto threshold 2*256")
local a512 = derive.derive(spec1(nil, { max_seq_len = 512 }, { scan = { mode = "auto", chunk_size = 256 } }))
is(a512.scan_emit_chunked, true, "auto, chunk 256, max_seq_len 512 = 2 chunks: chunked too")
local a511 = derive.derive(spec1(nil, { max_seq_len = 511 }, { scan = { mode = "auto", chunk_size = 256 } }))
is(a511.scan_emit_chunked, false, "auto, chunk 256, max_seq_len 511 < 2 chunks: sequential only")
local sq = derive.derive(spec1(nil, { max_seq_len = 4096 }, { scan = { mode = "sequential", chunk_size = 64 } }))
is(sq.scan_emit_chunked, false, "explicit sequential: no chunked kernels at any length")
local long = derive.derive(spec1({ d_model = 256, n_layers = 2, d_state = 64 }, { max_seq_len = 4096 },
  { scan = { mode = "chunked", chunk_size = 64 } }))
is(long.scan_max_chunks, 64, "long: 4096/64 chunks")
is(long.scan_cstate_floats, 8 * 64 * 512 * 64, "long: chunk-state workspace (64 MiB at max_batch 8)")
-- training on the long spec: the scan backward takes 16 lanes a channel
-- (the base's 4 leave 16 states a thread; 4 keep a checkpoint chunk's
-- 16 x 4 recomputed states in registers), blocks of the base's 32
-- channels = 512 threads; checkpoint stride 16, 256 checkpoints per
-- sequence at 4096 steps
is(long.scan_lanes, 16, "long: forward scan lanes (4 states a thread)")
is(long.scan_threads, 256, "long: forward scan block = 16 channels x 16 lanes")
is(long.scan_blocks, 32, "long: forward scan blocks per sequence")
is(long.scan_base_lanes, 4, "long: base lanes (the register bound)")
is(long.scan_base_blocks, 16, "long: base blocks of 32 channels")
is(long.scan_auto_prefill_blocks, 64, "long: 32 blocks of 8 warps count as 64 of 4 for the auto rule")
is(long.bscan_lanes, 16, "long: scan backward lanes (4 states a thread)")
is(long.bscan_npt, 4, "long: scan backward states per thread")
is(long.bscan_threads, 512, "long: scan backward block = 32 channels x 16 lanes")
is(long.bscan_blocks, long.scan_base_blocks, "long: as many scan backward blocks (dB|dC partials) as base ones")
is(long.bscan_tchunk, 16, "long: training checkpoint stride")
-- dB | dC warp sums per barrier: the long spec's 512-thread blocks fill an
-- SM's registers alone, so its buffer may take up to 160 KiB: 8 steps of
-- 16 warps x 2N = 128 floats, double-buffered (128 KiB) beside the 16 KiB
-- staging; the RL spec's 4 warps x 32 floats take a whole checkpoint chunk
-- within 40 KiB
is(long.bscan_red_steps, 8, "long: 8 steps of dB | dC sums per barrier")
is(long.bscan_red_bytes, 4 * 2 * 8 * 16 * 2 * 64, "long: their double buffer (dynamic shared memory)")
-- auto mode (the shipped mamba1_long): the base shape spreads to 16 lanes,
-- 8 channels; the scan backward then doubles its channels while a token
-- gets more than 16 dB | dC partials and the sequential backward at
-- max_batch keeps a block per SM: 16 channels (32 blocks x batch 8 = 256
-- >= 132; 32 channels would give 128), its 256 threads taking 80 KiB of
-- shared memory (half an SM's share) for 8 steps of sums per barrier
local function long_auto(mb) return derive.derive(spec1({ d_model = 256, n_layers = 2, d_state = 64 },
  { max_seq_len = 4096, max_batch = mb }, { scan = { mode = "auto", chunk_size = 64 } })) end
local la = long_auto(8)
is(la.scan_base_channels, 8, "long, auto: base blocks of 8 channels x 16 lanes")
is(la.bscan_channels, 16, "long, auto: scan backward doubled to 16 channels (32 partials a token)")
is(la.bscan_threads, 256, "long, auto: scan backward block of 256 threads")
is(la.bscan_blocks, 32, "long, auto: 32 scan backward blocks a sequence")
is(la.bscan_red_steps, 8, "long, auto: 8 steps of dB | dC sums per barrier (80 KiB budget)")
is(la.bscan_smem_bytes <= 80 * 1024, true, "long, auto: within half an SM's 160 KiB")
is(long_auto(4).bscan_channels, 8, "long, auto, max_batch 4: no doubling (64 blocks of 16 channels < 132 SMs)")
is(long_auto(16).bscan_channels, 32, "long, auto, max_batch 16: 32 channels (16 partials a token)")
local long86 = derive.derive(spec1({ d_model = 256, n_layers = 2, d_state = 64 }, { max_seq_len = 4096 },
  { scan = { mode = "chunked", chunk_size = 64 }, target = "sm_86" }))
is(long86.bscan_red_steps, 4, "long on sm_86: 4 steps per barrier (97 KiB a block at most)")
is(long86.bscan_smem_bytes <= 97 * 1024, true, "long on sm_86: within the target's shared memory per block")
is(rl.bscan_red_steps, rl.bscan_tchunk, "rl: a checkpoint chunk of dB | dC sums per barrier")
is(rl.bscan_smem_bytes, 4 * (2 * rl.bscan_tchunk * rl.N + 2 * rl.bscan_red_steps * rl.bscan_warps * 2 * rl.N
  + 4 * rl.bscan_tchunk * rl.bscan_channels), "rl: training scan shared memory")
is(long.max_ckpts, 256, "long: 4096/16 checkpoints")
is(long.bscan_smem_bytes, 4 * (2 * 16 * 64 + 2 * 8 * 16 * 2 * 64 + 4 * 16 * 32), "long: training scan shared memory")
-- chunk-parallel scan backward: spans of the chunk length rounded up to whole
-- checkpoint chunks
is(long.bscan_span, 64, "long: backward span = chunk 64 (4 checkpoint chunks of 16)")
is(long.bscan_span_ck, 4, "long: 4 checkpoint chunks per span")
is(long.bscan_emit_chunked, true, "long (chunked): chunk-parallel backward emitted")
is(long.bscan_mode_id, 1, "long: backward mode id 1")
is(long.bscan_max_spans, 64, "long: 4096/64 spans")
is(long.bscan_parts, 64, "long: scan partials per sequence = spans")
is(long.bscan_span_floats, 8 * 64 * 512 * 64, "long: span products / adjoints MAX_BATCH*spans*E*N")
is(rl.bscan_emit_chunked, true, "rl (auto, max_seq_len 256 >= 2 spans): chunk-parallel backward too")
is(rl.bscan_mode_id, 2, "rl: backward mode id 2 (the host picks)")
is(rl.bscan_parts, 4, "rl: scan partials per sequence = spans")
is(rl.bscan_span_floats, 64 * 4 * 256 * 16, "rl: span workspace MAX_BATCH*spans*E*N")
is(m130.bscan_emit_chunked, true, "130m (auto, max_seq_len 512): chunk-parallel backward too")
is(m130.bscan_mode_id, 2, "130m: host picks the backward by seqlen")
is(m130.bscan_auto_min_len, 128, "130m: backward auto threshold 2*64")
is(m130.bscan_max_spans, 8, "130m: 512/64 spans")
is(sq.bscan_emit_chunked, false, "explicit sequential: sequential backward at any length")
is(sq.bscan_parts, 1, "explicit sequential: one scan partial per sequence")
local c24 = derive.derive(spec1({ d_state = 256 }, { max_seq_len = 700 }, { scan = { mode = "chunked", chunk_size = 16 } }))
is(c24.bscan_tchunk, 8, "N=256: checkpoint stride 8 (the 40 KiB staging bound halves 16)")
is(c24.bscan_span, 16, "chunk 16, stride 8: span 16")
is(c24.bscan_span_ck, 2, "chunk 16, stride 8: 2 checkpoint chunks per span")
is(c24.bscan_max_spans, 44, "chunk 16, max_seq_len 700: 44 spans")
is(c24.conv_max_tiles, 44, "max_seq_len 700: 44 conv tiles (last partial)")
is(c256.bscan_span, 256, "chunk 256: span 256")
is(c256.bscan_max_spans, 3, "chunk 256, max_seq_len 700: 3 spans (last partial)")
is(c256.bscan_auto_min_len, 512, "chunk 256: backward auto threshold 2*256")
is(a512.bscan_emit_chunked, true, "auto, chunk 256, max_seq_len 512: chunk-parallel backward too")
is(a511.bscan_emit_chunked, false, "auto, chunk 256, max_seq_len 511: sequential backward only")
is(long.normb_max_blocks, 8 * 4096 // 16, "long: RMSNorm-backward partial rows")
is(long.conv_max_tiles, 256, "long: 4096/16 conv tiles")
is(long.conv_parts, 8 * 256, "long: conv-backward partials (max_batch 8 x 256 tiles)")
is(long.decode_part_floats, 8 * 4 * (16 + 2 * 64), "long: fused decode x_proj partials (8 x 4 conv blocks x XP)")
-- fused conv + x_proj of few-token prefills
is(rl.cxp_fuse, true, "rl: fused conv + x_proj (16 x 256 floats of xc, XP 40)")
is(rl.cxp_max_tokens, 2048, "rl: fused up to 2048 tokens a call")
is(rl.cxp_why, "", "rl: no reason against it")
is(long.cxp_fuse, false, "long: no fused conv + x_proj (XP 144)")
is(long.cxp_max_tokens, 0, "long: bound 0")
check(long.cxp_why:find("144", 1, true) ~= nil, "long: the reason names x_proj's 144 rows")
-- single-launch decode (one cluster kernel per step)
is(rl.decode_persistent, true, "rl: single-launch decode emitted")
is(rl.decode_persistent_why, "", "rl: no reason against it")
is(rl.decode_cluster, 8, "rl: cluster of 8 blocks per stream")
is(rl.decode_ec, 32, "rl: 256/8 channels per block")
is(rl.decode_threads, 256, "rl: 256 threads per block")
is(rl.decode_lanes, 8, "rl: 8 lanes per channel (32 x 8 = 256)")
is(rl.decode_npt, 2, "rl: 16/8 states per thread")
is(rl.decode_rpl, 1, "rl: R 8 over 8 lanes")
is(rl.decode_vw, 4, "rl: float4 slices (32 % 4)")
is(rl.decode_in_vw, 4, "rl: input_dim 64 as float4")
is(rl.decode_seqs, 8, "rl: 64 streams over the 132 // 16 = 8 clusters assumed co-resident -> 8 streams per cluster")
is(rl.decode_min_blocks, 1, "rl: 64 / 8 x 8 = 64 blocks fit one per SM")
is(rl.decode_weight_bytes, 4 * (2 * 256 * 128 + 40 * 256 + 256 * 8 + 128 * 256) * 4 + 64 * 128 * 4,
  "rl: GEMV weight bytes per step")
is(rl.decode_smem_bytes, 4 * 8 * (3 * 128 + 64 + 4 * 32 + 2 * 40 + 8), "rl: decode shared memory (8 streams)")
is(long.decode_persistent, true, "long: single-launch decode emitted")
is(long.decode_min_blocks, 1, "long: 8 x 8 blocks fit one per SM")
is(long.decode_seqs, 1, "long: 8 streams fit 8 clusters: one stream per cluster")
is(rl.decode_push, true, "rl: the 1-stream decode pushes its partials")
is(rl.decode_push_smem_bytes, 4 * (3 * 128 + 64 + 4 * 32 + 2 * 40 + 8) + 4 * 8 * (40 + 128) + 16,
   "rl: push shared memory = the 1-stream arrays + [8][XP] + [8][D] slots + 2 mbarriers")
is(long.decode_push, true, "long: the 1-stream decode pushes its partials")
-- The SM count behind decode_min_blocks: DEFAULT_SMS (132), or with
-- `chunk_size: auto` the GPU's as mg/tune.lua resolve queried it (opts.tuned.sms).
-- max_batch 16: 16 x 8 = 128 blocks, one per SM on 132 or 170 SMs, not on 80.
local function m1_sms(sms, chunk)
  return derive.derive(spec1(nil, { max_batch = 16, max_seq_len = 256 }, { scan = { chunk_size = chunk or "auto" } }),
    sms and { tuned = { chunk_size = 64, source = "default", sms = sms } } or nil)
end
local s0, s80, s170 = m1_sms(nil), m1_sms(80), m1_sms(170)
is(derive.DEFAULT_SMS, 132, "sms: default 132 (H100/H200 SXM)")
is(s0.sms .. "/" .. s0.sms_source, "132/default", "sms: no GPU queried -> the default")
is(s0.decode_min_blocks, 1, "sms 132: 128 decode blocks fit one per SM")
is(s80.sms .. "/" .. s80.sms_source, "80/gpu", "sms: the queried GPU's count")
is(s80.decode_seqs, 4, "sms 80: 16 streams over 80 // 16 = 5 clusters -> 4 streams per cluster")
is(s80.decode_min_blocks, 1, "sms 80: 16 / 4 x 8 = 32 blocks fit one per SM")
local s40 = m1_sms(40)
is(s40.decode_seqs, 8, "sms 40: 16 streams over 40 // 16 = 2 clusters -> 8 per cluster")
is(s40.decode_min_blocks, 1, "sms 40: 2 x 8 = 16 blocks fit one per SM")
is(s170.decode_min_blocks, 1, "sms 170: one block per SM")
local sfix = derive.derive(spec1(nil, { max_batch = 16, max_seq_len = 256 }, { scan = { chunk_size = 64 } }),
  { tuned = { chunk_size = 64, source = "default", sms = 80 } })
is(sfix.sms .. "/" .. sfix.decode_min_blocks, "132/1", "sms: a fixed chunk_size queries no GPU -> the default")
is(long.decode_lanes, 4, "long: 4 lanes per channel (N 64: 16 states per thread)")
is(m130.decode_persistent, false, "130m: no single-launch decode (weights too large)")
check(m130.decode_persistent_why:find("16 MiB") ~= nil, "130m: the reason names the 16 MiB bound", m130.decode_persistent_why)
is(bf.decode_weight_bytes, bf.L * (2 * bf.E * bf.D + bf.XP * bf.E + bf.E * bf.R + bf.D * bf.E) * 2 + bf.input_dim * bf.D * 4,
  "bf16: GEMV weights in bf16, input_proj f32")
local a80 = derive.derive(spec1(nil, nil, { target = "sm_80" }))
is(a80.decode_persistent, false, "sm_80: no clusters, no single-launch decode")
is(a80.decode_push, false, "sm_80: no push exchange either")
local n256 = derive.derive(spec1({ d_state = 256 }))
-- N = 256: the scan backward at 32 lanes (8 states a thread), its blocks
-- halved while the dB/dC buffer (2 x warps x 2N floats) would pass 40 KiB
is(n256.bscan_lanes, 32, "N=256: scan backward lanes")
is(n256.bscan_npt, 8, "N=256: scan backward states per thread")
is(n256.bscan_smem_bytes <= 40960 and n256.bscan_threads <= 512, true, "N=256: scan backward block within 40 KiB and 512 threads")
is(n256.bscan_blocks * n256.bscan_channels >= n256.E, true, "N=256: scan backward grid covers E")
is(n256.decode_threads, 512, "N=256: 32 channels x 16 lanes -> 512 threads")
is(n256.decode_npt, 16, "N=256: 16 states per thread")
is(n256.decode_persistent, true, "N=256: single-launch decode emitted")
-- decode_seqs: at most 8, and lowered while the per-stream buffers exceed 48 KiB
local big = derive.derive(spec1({ d_model = 1024, d_state = 16 }, { max_batch = 1024, max_seq_len = 64 }))
check(big.decode_seqs >= 1 and big.decode_seqs <= 8, "d_model 1024, max_batch 1024: 1..8 streams per cluster", big.decode_seqs)
check(big.decode_smem_bytes <= 48 * 1024, "d_model 1024, max_batch 1024: decode shared memory within 48 KiB",
  big.decode_smem_bytes)
check(big.decode_seqs < 8, "d_model 1024: the 48 KiB bound lowers the 8 streams the batch asks for", big.decode_seqs)
local tiny = derive.derive(spec1({ d_model = 8, expand = 1, d_state = 1 }))
is(tiny.decode_cluster, 1, "E=8: one block per stream")
is(tiny.decode_lanes, 1, "N=1: one lane per channel")
local e72 = derive.derive(spec1({ d_model = 72, expand = 1 }))
is(e72.decode_ec, 9, "E=72: 9 channels per block")
is(e72.decode_vw, 1, "E=72: scalar slice loads")

-- ------------------------------------------------------------ Mamba-3 SISO
local m3spec = T.spec("mamba3_siso", { name = "m3", precision = "bf16",
  model = { d_model = 128, n_layers = 2, d_state = 64, headdim = 32, ngroups = 2 },
  scan = { mode = "chunked" }, shapes = { max_batch = 8, max_seq_len = 1024 } })
local d3 = derive.derive(m3spec)
is(d3.H, 8, "m3: H = 256/32")
is(d3.S, 16, "m3: S = floor(64*0.5)/2")
is(d3.in_proj_out, 2 * 256 + 2 * 2 * 64 + 3 * 8 + 16, "m3: in_proj outputs 2E+2GN+3H+S")
is(d3.split_angles, d3.in_proj_out - 16, "m3: angles last")
is(d3.heads_per_group, 4, "m3: heads per group")
is(d3.params[2].name, "layers.0.mixer.in_proj.weight", "m3: state_dict names")
is(d3.weights_total % 64, 0, "m3: total aligned")

-- ------------------------------------------------------------ print-spec
local text = yaml_out.render(spec1({ input_dim = 64 }, nil, { name = "mamba1_rl" }), rl)
check(text:find("^name: mamba1_rl\narch: mamba1\nmodel:\n  d_model: 128\n") ~= nil, "print-spec starts in key order", text:sub(1, 80))
check(text:find("\n  norm_eps: 1e%-05\n") ~= nil, "print-spec float as shortest round-trip")
check(text:find("\n  dt_rank: auto\n") ~= nil, "print-spec keeps auto")
check(text:find("\nderived:\n  dims:\n    D: 128\n") ~= nil, "print-spec derived section")
check(text:find("\n    %- {name: backbone%.layers%.0%.mixer%.in_proj%.weight, shape: %[512, 128%], offset: 8448, numel: 65536}\n") ~= nil,
  "print-spec params row")
check(text:find("\n  weights_total: 474880\n") ~= nil, "print-spec weights_total")
check(text:find("\n    scan_lanes: 4\n") ~= nil, "print-spec launch shapes")
check(text:find("\n    scan_base_lanes: 4\n    scan_base_channels: 32\n    scan_base_blocks: 8\n    scan_auto_prefill_blocks: 8\n") ~= nil,
  "print-spec: the base shape and the auto rule's block count")
is(yaml_out.render(spec1(), derive.derive(spec1())), yaml_out.render(spec1(), derive.derive(spec1())), "print-spec is deterministic")
is(yaml_out.float_text(1.0), "1.0", "yaml float 1.0")
is(yaml_out.float_text(0.5), "0.5", "yaml float 0.5")
local t3 = yaml_out.render(m3spec, d3)
check(t3:find("\n  headdim: 32\n") and t3:find("\n  outproj_norm: true\n") and not t3:find("d_conv"), "print-spec mamba3 keys")

-- ------------------------------------------------------------ main()
local mtree = tree({ { "name", "m" }, { "arch", "mamba1" },
  { "model", { { "d_model", "128" }, { "n_layers", "2" } } },
  { "shapes", { { "max_batch", "4" }, { "max_seq_len", "64" } } } })
local args = { command = "check", spec_path = "x/m.yaml", spec_name = "m.yaml", spec_hash = string.rep("0", 64), spec = mtree, options = {} }
local r = init.main(args)
check(type(r) == "table" and next(r) == nil, "main check returns {}")
args.command = "print-spec"
r = init.main(args)
check(type(r.text) == "string" and r.text:find("^name: m\n"), "main print-spec returns text")
line = 0
local m3tree = tree({ { "name", "m3" }, { "arch", "mamba3_siso" },
  { "model", { { "d_model", "128" }, { "n_layers", "2" } } },
  { "shapes", { { "max_batch", "4" }, { "max_seq_len", "64" } } } })
args.spec, args.command = m3tree, "check"
check(pcall(init.main, args), "mamba3_siso: check works")
args.command = "print-spec"
check(pcall(init.main, args), "mamba3_siso: print-spec works")
args.command = "emit"
local ok, e = pcall(init.main, args)
check(ok and type(e) == "table" and type(e.files) == "table" and #e.files >= 5 and
  e.files[1].path == "m3.h" and e.files[1].template == "mamba3/model.h.tmpl",
  "mamba3_siso: emit returns the mamba3 file set (templates/tests/test_derive_mamba3.lua checks it)",
  not ok and tostring(type(e) == "table" and e.spec_errors and e.spec_errors[1].msg or e) or nil)

-- emit's file set for mamba1, with stand-in templates (mg.read replaced for
-- the duration; the real templates are exercised by the emit suites).
local emit = require("mg.emit")
local real_read = mg.read
local stub = "{{ provenance(P) }}\n{{ name }} {{ NAME }} {{ d.E }} {{ f32(d.eps) }} {{ int(d.N) }}\n"
mg.read = function(rel)
  local p = rel:find("Makefile", 1, true) and "'#'" or "'//'"
  return (stub:gsub("P", p))
end
local ok_e, files = pcall(emit.files, spec1(nil, nil, { name = "rl" }), derive.derive(spec1(nil, nil, { name = "rl" })),
  { spec_name = "rl.yaml", spec_hash = string.rep("a", 64) }, {})
local ok_n, files_nt = pcall(emit.files, spec1(nil, nil, { name = "rl", emit = { training = false, inference = true, deterministic = true } }),
  derive.derive(spec1(nil, nil, { name = "rl", emit = { training = false, inference = true, deterministic = true } })),
  { spec_name = "rl.yaml", spec_hash = string.rep("a", 64) }, {})
mg.read = real_read
require("mg.tmpl").clear_cache()
check(ok_e, "emit.files with stand-in templates", not ok_e and tostring(files))

-- include(): a fragment rendered with the template's environment plus its
-- vars, the final newline dropped; the shared training fragments' unknown
-- part is an error naming the fragment.
local frags = {
  ["frag.tmpl"] = "{{ name }}:{{ part }}:{{ d.N }}\n",
  ["main.tmpl"] = "a\n{{ include(\"frag.tmpl\", { part = \"x\" }) }}\nb\n",
}
mg.read = function(rel) return frags[rel] or real_read(rel) end
local tmpl = require("mg.tmpl")
local env = emit.env(spec1(nil, nil, { name = "rl" }), derive.derive(spec1(nil, nil, { name = "rl" })), {}, "main.tmpl")
local ok_i, txt = pcall(tmpl.render, "main.tmpl", env)
is(ok_i and txt, "a\nrl:x:16\nb\n", "include: the fragment's lines in place, with its vars and the environment")
check(env.part == nil, "include: the vars do not leak into the including template's environment")
local ok_u, err_u = pcall(env.include, "common/train_optim.cu.tmpl", { part = "nope" })
check(not ok_u and tostring(err_u):find("train_optim.cu.tmpl: unknown part nope", 1, true) ~= nil,
  "include: an unknown part of a shared fragment is an error naming it", tostring(err_u))
mg.read = real_read
tmpl.clear_cache()
check(ok_n, "emit.files without training", not ok_n and tostring(files_nt))
if ok_n then
  local names = {}
  for i, f in ipairs(files_nt) do names[i] = f.path end
  is(table.concat(names, " "), "rl.h rl_common.cuh mg_dtype.cuh rl_kernels.cu mg_warp_sums.cuh mg_m1_starts.cuh mg_m1_util.cuh mg_m1_conv.cuh mg_m1_conv_xproj.cuh mg_m1_scan_body.cuh mg_m1_scan_fwd.cuh mg_m1_decode.cuh mg_m1_launch.cuh mg_m1_launch.h mg_rms_row.cuh mg_norm.cuh mg_convert.cuh mg_launch_norm.cuh mg_launch_convert.cuh mg_packed.cuh mg_launch_packed.cuh rl.c mg_m1_pipeline.h mg_model_host.h mg_packed_host.h model_alias.h rl_test.c fwd_tests.h rl_bench.c bench_util.h rl.pc.in rlConfig.cmake.in rlConfigVersion.cmake Makefile rl.py",
    "emit: emit.training = false drops the training files")
end
if ok_e then
  local names = {}
  for i, f in ipairs(files) do names[i] = f.path .. "<" .. f.template end
  is(table.concat(names, " "), "rl.h<mamba1/model.h.tmpl rl_common.cuh<mamba1/common.cuh.tmpl mg_dtype.cuh<kernels/common/dtype.cuh rl_kernels.cu<mamba1/kernels.cu.tmpl " ..
    "mg_warp_sums.cuh<kernels/common/warp_sums.cuh mg_m1_starts.cuh<kernels/mamba1/starts.cuh mg_m1_util.cuh<kernels/mamba1/util.cuh mg_m1_conv.cuh<kernels/mamba1/conv.cuh mg_m1_conv_xproj.cuh<kernels/mamba1/conv_xproj.cuh mg_m1_scan_body.cuh<kernels/mamba1/scan_body.cuh mg_m1_scan_fwd.cuh<kernels/mamba1/scan_fwd.cuh mg_m1_decode.cuh<kernels/mamba1/decode.cuh mg_m1_launch.cuh<kernels/mamba1/launch.cuh mg_m1_launch.h<kernels/mamba1/launch.h " ..
    "mg_rms_row.cuh<kernels/common/rms_row.cuh mg_norm.cuh<kernels/common/norm.cuh mg_convert.cuh<kernels/common/convert.cuh mg_launch_norm.cuh<kernels/common/launch_norm.cuh mg_launch_convert.cuh<kernels/common/launch_convert.cuh " ..
    "mg_packed.cuh<kernels/common/packed.cuh mg_launch_packed.cuh<kernels/common/launch_packed.cuh " ..
    "rl.c<mamba1/model.c.tmpl mg_m1_pipeline.h<host/mamba1/pipeline.h mg_model_host.h<host/common/model_host.h mg_packed_host.h<host/common/packed_host.h " ..
    "model_alias.h<common/model_alias.h.tmpl rl_test.c<host/mamba1/test.c fwd_tests.h<host/common/fwd_tests.h rl_bench.c<host/mamba1/bench.c bench_util.h<host/common/bench_util.h " ..
    "rl_train.h<mamba1/train.h.tmpl rl_backward.cu<mamba1/backward.cu.tmpl " ..
    "mg_m1_train_norm.cuh<kernels/mamba1/train_norm.cuh mg_m1_train_conv.cuh<kernels/mamba1/train_conv.cuh mg_m1_scan_bwd.cuh<kernels/mamba1/scan_bwd.cuh mg_m1_launch_train.cuh<kernels/mamba1/launch_train.cuh mg_m1_launch_train.h<kernels/mamba1/launch_train.h mg_block_sum.cuh<kernels/common/block_sum.cuh mg_red_jobs.cuh<kernels/common/red_jobs.cuh mg_train_norm.cuh<kernels/common/train_norm.cuh mg_adamw.cuh<kernels/common/adamw.cuh mg_launch_train_norm.cuh<kernels/common/launch_train_norm.cuh mg_grad_norm.cuh<kernels/common/grad_norm.cuh mg_loss.cuh<kernels/common/loss.cuh mg_grad_accum.cuh<kernels/common/grad_accum.cuh " ..
    "rl_train.c<mamba1/train.c.tmpl mg_m1_train_pipeline.h<host/mamba1/train_pipeline.h mg_train_host.h<host/common/train_host.h " ..
    "rl_train_test.c<host/mamba1/train_test.c train_tests.h<host/common/train_tests.h rl_nccl.c<host/common/nccl_train.c " ..
    "rl.pc.in<common/pkgconfig.pc.tmpl rlConfig.cmake.in<common/cmake_config.cmake.tmpl " ..
    "rlConfigVersion.cmake<common/cmake_config_version.cmake.tmpl Makefile<common/Makefile.tmpl rl.py<common/torch_module.py.tmpl", "emit: file set and order (training)")
  is(files[1].content, "// Code generated by mamba-gen " .. mg.version .. " from rl.yaml (sha256 aaaaaaaaaaaaaaaa) " ..
    "with template mamba1/model.h.tmpl. DO NOT EDIT.\nrl RL 256 1e-05f 16\n", "emit: content of the header")
  check(files[#files - 1].content:find("^# Code generated by mamba%-gen ") ~= nil, "emit: Makefile provenance with #")
  check(files[#files].content:find("^# Code generated by mamba%-gen ") ~= nil, "emit: rl.py provenance with #")
end

args.command = "bogus"
check(not pcall(init.main, args), "unknown command is an error")

return T.done()
