-- mg/derive.lua: derived values common to every arch, then the per-arch
-- module (mg/derive_mamba1.lua, mg/derive_mamba3.lua). Templates do no
-- arithmetic: every number they print comes from d.
--
-- derive(spec) -> d. Common fields (all archs):
--   d.name, d.NAME           spec.name and its upper-case form
--   d.arch                   spec.arch
--   d.dtype                  spec.precision ("f32" | "bf16" | "f16")
--   d.act_t                  C storage type: "float" | "__nv_bfloat16" | "__half"
--   d.mg_dtype               runtime enum: "MG_F32" | "MG_BF16" | "MG_F16"
--   d.act_size               bytes per stored activation (4 | 2 | 2)
--   d.check_tol              relative-L2 tolerance of the selfcheck against the
--                            f64 reference for this storage dtype (f32 1e-5,
--                            bf16 2e-2, f16 5e-3; the README's tolerance table;
--                            f32 with allow_tf32: f16's)
--   d.unit_roundoff          the relative rounding error of a stored activation:
--                            f32 2^-24, bf16 2^-8, f16 2^-11 (f32 with
--                            allow_tf32: f16's, TF32 keeps f16's 10 mantissa
--                            bits); the tests perturb the reference by it
--                            to measure how well a gradient is determined
--   d.tf32                   spec.allow_tf32: the projection GEMMs on TF32
--                            tensor cores (mg_blas_set_tf32 at create)
--   d.target, d.sm           "sm_90" and 90
--   d.pdl                    programmatic dependent launch (sm_90 and later):
--                            chained decode kernels start while the one
--                            before them drains (kernels/common/pdl.cuh)
--   d.D, d.E, d.N, d.L       d_model, expand*d_model, d_state, n_layers
--   d.input_dim, d.in_dim    input_dim, and the model input width (input_dim or D)
--   d.eps                    norm_eps (a Lua float)
--   d.norm_vecs, d.norm_threads, d.norm_iters  RMSNorm launch: float4 vectors
--                            per row (D/4), block size, loop count
--   d.max_batch, d.max_seq_len, d.max_tokens (= max_batch*max_seq_len)
--   d.scan_mode_resolved     "sequential" | "chunked" (auto: sequential when
--                            max_seq_len <= 256, else chunked; mg/derive_mamba1.lua
--                            makes it "auto" where both scans exist and each
--                            call picks one)
--   d.chunk_size             chunk length; auto: the tuned value of the autotune
--                            cache for the current GPU (opts.tuned, from
--                            mg/tune.lua resolve), else DEFAULT_CHUNK
--   d.chunk_size_source      "spec" | "tuned" | "default"
--   d.tuned                  opts.tuned or nil: { chunk_size, scan_threads
--                            (the tuned scan block size, may be nil), source,
--                            note, sms (may be nil) }
--   d.sms, d.sms_source      the SM count the few launch shapes fixed at
--                            generation time are sized for (Mamba-1
--                            decode_min_blocks, Mamba-3 dec_blocks_target):
--                            with `chunk_size: auto`, the queried GPU's
--                            (opts.tuned.sms, source "gpu"), else
--                            DEFAULT_SMS (source "default"). The other
--                            SM-count choices are made at run time with the
--                            device's count (doc/tuning.md has the table).
--   d.training, d.inference, d.deterministic  spec.emit.* booleans
-- plus the per-arch fields documented in each arch's section.

local M = {}

local DTYPES = {
  f32  = { act_t = "float",         mg_dtype = "MG_F32",  act_size = 4, check_tol = 1e-5, unit_roundoff = 2^-24 },
  bf16 = { act_t = "__nv_bfloat16", mg_dtype = "MG_BF16", act_size = 2, check_tol = 2e-2, unit_roundoff = 2^-8 },
  f16  = { act_t = "__half",        mg_dtype = "MG_F16",  act_size = 2, check_tol = 5e-3, unit_roundoff = 2^-11 },
}

-- Sequences up to this length use the sequential scan under `scan.mode: auto`.
M.AUTO_SEQUENTIAL_MAX_LEN = 256
-- Chunk length used for `chunk_size: auto` when the autotune cache has no
-- entry for the spec on the current GPU, or no GPU is known (the Mamba-3
-- reference kernels use 64 as well). mg/tune.lua names it in its message.
M.DEFAULT_CHUNK = 64
-- SM count assumed at generation time when no GPU was queried: 132, the
-- H100/H200 SXM parts the defaults were measured on.
M.DEFAULT_SMS = 132
-- Every tensor of the weights blob starts at a multiple of this many floats
-- (256 bytes: aligned for any vector load and for cuBLAS).
M.ALIGN = 64
-- Largest shared memory a block may ask for, per target (the opt-in limit
-- per block, less 2 KiB of slack): sm_90 / sm_100 227 KiB, sm_80 163 KiB,
-- sm_86 / sm_89 / sm_120 99 KiB (CUDA C++ Programming Guide, technical
-- specifications per compute capability).
M.SMEM_BLOCK_MAX = { [80] = 161 * 1024, [86] = 97 * 1024, [89] = 97 * 1024, [90] = 225 * 1024,
                     [100] = 225 * 1024, [120] = 97 * 1024 }
-- Shared memory of one SM, per target: sm_90 / sm_100 228 KiB, sm_80 164
-- KiB, sm_86 / sm_89 / sm_120 100 KiB.
M.SM_SMEM = { [80] = 164 * 1024, [86] = 100 * 1024, [89] = 100 * 1024, [90] = 228 * 1024,
              [100] = 228 * 1024, [120] = 100 * 1024 }

function M.align(x, a)
  a = a or M.ALIGN
  return (x + a - 1) // a * a
end

function M.next_pow2(x)
  local p = 1
  while p < x do p = p * 2 end
  return p
end

function M.ceil_div(a, b) return (a + b - 1) // b end

local function common(spec, opts)
  local d = {}
  local m = spec.model
  d.name = spec.name
  d.NAME = spec.name:upper()
  d.arch = spec.arch
  d.dtype = spec.precision
  local dt = DTYPES[spec.precision]
  d.act_t, d.mg_dtype, d.act_size = dt.act_t, dt.mg_dtype, dt.act_size
  d.check_tol = dt.check_tol
  d.unit_roundoff = dt.unit_roundoff
  -- allow_tf32 (f32 only): the projection GEMMs round their inputs to TF32's
  -- 10 mantissa bits, as f16 storage rounds activations: f16's tolerances
  d.tf32 = spec.allow_tf32 == true
  if d.tf32 then d.check_tol, d.unit_roundoff = DTYPES.f16.check_tol, DTYPES.f16.unit_roundoff end
  d.target = spec.target
  d.sm = math.tointeger(tonumber(spec.target:match("^sm_(%d+)$")))
  d.pdl = d.sm >= 90
  d.D = m.d_model
  d.E = m.expand * m.d_model
  d.N = m.d_state
  d.L = m.n_layers
  d.input_dim = m.input_dim
  d.in_dim = m.input_dim > 0 and m.input_dim or m.d_model
  d.eps = m.norm_eps
  -- RMSNorm (block pre-norm, norm_f): one block per token row of D values,
  -- read as float4 vectors (D is a multiple of 8, so D/4 is whole). One
  -- vector per thread when the row fits: next power of two of D/4 (power of
  -- two for the tree reduction), at least a warp (32), at most 1024 (the
  -- block limit; larger rows loop norm_iters times).
  d.norm_vecs = d.D // 4
  d.norm_threads = math.min(1024, math.max(32, M.next_pow2(d.norm_vecs)))
  d.norm_iters = M.ceil_div(d.norm_vecs, d.norm_threads)
  local sh = spec.shapes
  d.max_batch, d.max_seq_len = sh.max_batch, sh.max_seq_len
  d.max_tokens = sh.max_batch * sh.max_seq_len
  if spec.scan.mode == "auto" then
    d.scan_mode_resolved = (sh.max_seq_len <= M.AUTO_SEQUENTIAL_MAX_LEN) and "sequential" or "chunked"
  else
    d.scan_mode_resolved = spec.scan.mode
  end
  if spec.scan.chunk_size == "auto" then
    local t = opts.tuned
    d.tuned = t
    d.chunk_size = (t and t.chunk_size) or M.DEFAULT_CHUNK
    d.chunk_size_source = (t and t.source == "tuned") and "tuned" or "default"
  else
    d.chunk_size = spec.scan.chunk_size
    d.chunk_size_source = "spec"
  end
  local sms = d.tuned and math.tointeger(d.tuned.sms)
  if sms and sms >= 1 then
    d.sms, d.sms_source = sms, "gpu"
  else
    d.sms, d.sms_source = M.DEFAULT_SMS, "default"
  end
  d.training = spec.emit.training
  d.inference = spec.emit.inference
  d.deterministic = spec.emit.deterministic
  return d
end

-- Which scans a spec emits under scan.mode (both archs, the forward and
-- Mamba-1's backward alike): whether the chunked kernel is emitted, and the
-- runtime mode id (0 sequential, 1 chunked, 2 auto). Under auto both
-- kernels exist only when a call can reach min_len, the length from which
-- the chunked one runs.
function M.scan_choice(mode, max_seq_len, min_len)
  if mode == "sequential" then return false, 0 end
  if mode == "chunked" then return true, 1 end
  local chunked = max_seq_len >= min_len
  return chunked, chunked and 2 or 0
end

-- Append a tensor to a blob layout under construction (shared by the archs).
-- layout = { params = {}, next = 0 }.
function M.add_param(layout, name, shape, key, layer)
  local numel = 1
  for _, s in ipairs(shape) do numel = numel * s end
  local off = M.align(layout.next)
  local p = { name = name, shape = shape, offset = off, numel = numel, layer = layer, key = key }
  layout.params[#layout.params + 1] = p
  layout.next = off + numel
  return p
end

-- The blob layout every arch shares (doc/HACKING.md): optional input_proj
-- weight and bias, then n_layers copies of the arch's layer tensors
-- (`tensors`: list of {key, name suffix, shape}), then norm_f.weight; each
-- tensor 64-aligned. `prefix` is the state_dict prefix ("backbone." for the
-- Hugging Face Mamba-1 names, "" for Mamba-3's). Returns params, the offsets
-- of the non-layer tensors, layer 0's offsets by key, the layer stride and
-- the total, in floats.
function M.blob_layout(d, tensors, prefix)
  local lay = { params = {}, next = 0 }
  local off = {}
  if d.input_dim > 0 then
    off.input_proj_w = M.add_param(lay, prefix .. "input_proj.weight", { d.D, d.input_dim }, "input_proj_w").offset
    off.input_proj_b = M.add_param(lay, prefix .. "input_proj.bias", { d.D }, "input_proj_b").offset
  end
  local starts, layer0 = {}, {}
  for l = 0, d.L - 1 do
    for i, t in ipairs(tensors) do
      local p = M.add_param(lay, prefix .. "layers." .. l .. "." .. t[2], t[3], t[1], l)
      if i == 1 then starts[l] = p.offset end
      if l == 0 then layer0[t[1]] = p.offset end
    end
  end
  -- Every tensor starts 64-aligned, so each layer starts 64-aligned and all
  -- layers have the same size: the stride is the aligned size of one layer.
  local layer_end = M.align(lay.next)
  local stride = d.L > 1 and (starts[1] - starts[0]) or (layer_end - starts[0])
  for l = 1, d.L - 1 do
    assert(starts[l] - starts[l - 1] == stride, "derive: non-uniform layer stride")
  end
  off.norm_f_w = M.add_param(lay, prefix .. "norm_f.weight", { d.D }, "norm_f_w").offset
  return lay.params, off, layer0, stride, M.align(lay.next)
end

-- What the training templates of every arch share: the AdamW segments (the
-- blob split into layer-0 tensors, repeated every layer_stride floats, and
-- the non-layer tensors; class 1 = a weight matrix in `matrix_keys`, which
-- wd_matrices_only decays, 2 = the rest), the span of the layers, and the
-- gradient tolerance of the storage dtype (GPU vs the f64 reference).
function M.training_common(d, matrix_keys)
  d.layers_begin = d.layer0.norm_w
  d.layers_end = d.layer0.norm_w + d.L * d.layer_stride
  d.adamw_layer, d.adamw_global = {}, {}
  for _, p in ipairs(d.params) do
    local cls = matrix_keys[p.key] and 1 or 2
    if p.layer == 0 then
      local lo = p.offset - d.layers_begin
      d.adamw_layer[#d.adamw_layer + 1] = { lo, lo + p.numel, cls, p.numel }
    elseif p.layer == nil then
      d.adamw_global[#d.adamw_global + 1] = { p.offset, p.offset + p.numel, cls, p.numel }
    end
  end
  local tol = { f32 = 1e-4, bf16 = 5e-2, f16 = 1e-2 }
  d.grad_tol = d.tf32 and tol.f16 or tol[d.dtype]
end

-- opts (optional): { tuned = mg/tune.lua resolve's result }.
function M.derive(spec, opts)
  local d = common(spec, opts or {})
  if spec.arch == "mamba1" then
    d = require("mg.derive_mamba1").derive(spec, d)
    -- the bench program's cost model and shapes (mg/cost.lua)
    local cost = require("mg.cost")
    d.cost = cost.mamba1(d)
    d.bench = cost.bench_shapes(d)
    return d
  elseif spec.arch == "mamba3_siso" then
    d = require("mg.derive_mamba3").derive(spec, d)
    -- the bench program's cost model and shapes (mg/cost.lua)
    local cost = require("mg.cost")
    d.cost = cost.mamba3(d)
    d.bench = cost.bench_shapes(d)
    return d
  end
  error("derive: unknown arch " .. tostring(spec.arch))
end

return M
