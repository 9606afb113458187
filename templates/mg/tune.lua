-- mg/tune.lua: the Lua half of autotuning (doc/tuning.md). Pure functions of
-- the spec, the templates and what the host passes in; no io.
--
--   M.key(spec)              the parts of the tune cache key that Lua knows:
--                            { spec = sha256 of the canonical key text,
--                              spec_name, generator = mg.version,
--                              templates = sha256 of the template set }
--   M.key_text(spec)         the canonical spec text hashed into key.spec:
--                            every key in schema order, defaults filled, the
--                            tuned keys (scan.chunk_size) written as `auto`,
--                            so tuning with chunk_size 64 or auto gives one key
--   M.candidates(spec, d, opts)  the variants a sweep compiles and times
--                            (mamba1: chunk x scan block size x lanes per
--                            channel + sequential;
--                            mamba3_siso: chunk x block size of the chunked
--                            SSM kernel, shapes from mg/derive_mamba3.lua
--                            ck_variant, chunks that do not fit left out;
--                            both: + the `generic` baseline, last)
--   M.generic(spec, d, cands) the generic candidate: the chunked kernel of
--                            the same template with the model dims as
--                            kernel arguments, in the launch shape of the
--                            spec's own chunked candidate (else the first
--                            chunked one); nil when there is none
--   M.sources(spec, d, args) the files of command "tune-sources": one CUDA
--                            translation unit per candidate + manifest.txt
--   M.resolve(spec, args)    chunk_size auto: the best cached entry for the
--                            current GPU, or the default, with a note; and
--                            the GPU's SM count when it was queried (sms:
--                            mg/derive.lua sizes its few SM-count-bound
--                            launch shapes with it, doc/tuning.md)
--
-- mg.tune_cache() (served by the host; only resolve asks, and only for an
-- auto value; nil when the host serves no cache, as in mamba-tune):
--   { gpu = "NVIDIA H200" | nil, cc = "9.0" | nil, driver = "13.0" | nil,
--     sms = 132 | nil (the device's multiprocessors, when it was queried),
--     gpu_source = "how the GPU was found (or why not)",
--     dir = "cache directory",
--     entries = { { path = "file", tree = <spec-tree-style node> }, ... },
--     bad = { "file: why it was ignored", ... } }

local schema = require("mg.schema")
local yaml_out = require("mg.yaml_out")

local M = {}

M.FORMAT = "mamba-gen-tune 1"
-- Chunk sizes and scan block sizes a sweep tries by default.
M.CHUNKS = { 16, 32, 64, 128, 256 }
M.THREADS = { 64, 128, 256, 512 }
-- Mamba-1: threads sharing one channel's state a sweep tries by default,
-- as the spec's own count (mg/derive_mamba1.lua: the fewest lanes keeping
-- N / lanes <= 16, spread further while the scan would run few threads at
-- max_batch) divided or multiplied by these factors. More lanes per
-- channel mean fewer states per thread and more warps for the same work:
-- at small d_state and large batch a one-lane scan runs a few warps per SM
-- and waits on its own dependency chains; fewer lanes repeat less of the
-- per-channel work (softplus, the y shuffles). The sweep measures both
-- sides of the default.
M.LANE_DIVISORS = { 4, 2 }
M.LANE_FACTORS = { 1, 2, 4 }
-- The chunk length used for `chunk_size: auto` without a cache entry
-- (mg/derive.lua's DEFAULT_CHUNK; repeated here for the messages).
M.DEFAULT_CHUNK = require("mg.derive").DEFAULT_CHUNK
M.DEFAULT_SMS = require("mg.derive").DEFAULT_SMS
-- Block sizes of the Mamba-3 chunked SSM kernel a sweep tries by default
-- (4, 8, 16 warps; those the state split allows, mg/derive_mamba3.lua).
M.THREADS_M3 = { 128, 256, 512 }
-- Archs with a tune template.
M.TEMPLATE = { mamba1 = "mamba1/tune_scan.cu.tmpl", mamba3_siso = "mamba3/tune_scan.cu.tmpl" }
-- The files whose text decides what a tuned variant computes and how fast,
-- per arch: their combined hash is the key's `templates` part (any change in
-- them invalidates earlier tuning results). The candidates compile the
-- shipped kernel bodies (the plain headers under kernels/), so those files
-- are part of the set.
M.TEMPLATE_SETS = {
  mamba1 = {
    "kernels/common/dtype.cuh", "kernels/mamba1/starts.cuh", "kernels/mamba1/scan_body.cuh", "kernels/mamba1/tune_args.h", "kernels/common/tune_params.h",
    "mamba1/tune_scan.cu.tmpl",
    "mg/derive.lua", "mg/derive_mamba1.lua", "mg/tune.lua",
  },
  mamba3_siso = {
    "kernels/mamba3/tiles.cuh", "kernels/mamba3/chunked_body.cuh", "kernels/mamba3/tune_args.h", "kernels/common/tune_params.h",
    "mamba3/tune_scan.cu.tmpl",
    "mg/derive.lua", "mg/derive_mamba3.lua", "mg/tune.lua",
  },
}
M.TEMPLATE_SET = M.TEMPLATE_SETS.mamba1
-- The generic candidate's register-array bounds (the template's bounds, for
-- any spec the schema allows): Mamba-1 states per scan thread (derive_mamba1
-- picks scan_lanes so that N / lanes <= 16); Mamba-3 state columns per warp
-- (ck_variant: at most 64 state registers per thread = CK_NW / 2) and output
-- columns per item (derive_mamba3: ck_pw <= 64).
M.GENERIC_M1_NPT_MAX = require("mg.derive_mamba1").SCAN_NPT_MAX
M.GENERIC_M3_NW_MAX = 128
M.GENERIC_M3_PW_MAX = 64

local function scalar_text(v)
  if math.type(v) == "float" then return yaml_out.float_text(v) end
  if type(v) == "boolean" then return v and "true" or "false" end
  return tostring(v)
end

local function key_lines(out, entries, tbl, prefix, arch)
  for _, e in ipairs(entries) do
    local v = tbl[e.key]
    if schema.applies(e, arch) and v ~= nil then
      if e.type == "map" then
        key_lines(out, e.keys, v, prefix .. e.key .. ".", arch)
      else
        local path = prefix .. e.key
        if path == "scan.chunk_size" then v = "auto" end
        out[#out + 1] = path .. "=" .. scalar_text(v)
      end
    end
  end
end

function M.key_text(spec)
  local out = { M.FORMAT }
  key_lines(out, schema.keys, spec, "", spec.arch)
  return table.concat(out, "\n") .. "\n"
end

function M.templates_hash(arch)
  local parts = {}
  for _, f in ipairs(M.TEMPLATE_SETS[arch or "mamba1"] or M.TEMPLATE_SET) do
    local text, msg = mg.read(f)
    if not text then error("tune: cannot read template " .. f .. ": " .. tostring(msg), 0) end
    parts[#parts + 1] = f .. "\n" .. mg.sha256(text) .. "\n"
  end
  return mg.sha256(table.concat(parts))
end

function M.key(spec)
  return {
    spec = mg.sha256(M.key_text(spec)),
    spec_name = spec.name,
    generator = mg.version,
    templates = M.templates_hash(spec.arch),
  }
end

-- ---------------------------------------------------------------- candidates

-- One candidate: the scan kernels with chunk length `chunk` (0: the
-- sequential scan), block size `threads` and `lanes` threads per channel.
-- Derived launch values are computed here so the template does no
-- arithmetic. Ids name the lanes only where they differ from the spec's own
-- (c64_t128 is the spec's lane count, c64_t128_l4 four lanes), so the ids of
-- earlier sweeps keep their meaning.
local function candidate(d, mode, chunk, threads, lanes)
  lanes = lanes or d.scan_lanes
  local channels = threads // lanes
  local c = {
    mode = mode, chunk = chunk, threads = threads, channels = channels, lanes = lanes,
    blocks = (d.E + channels - 1) // channels,
  }
  local lid = lanes ~= d.scan_lanes and string.format("_l%d", lanes) or ""
  local ldesc = lanes ~= d.scan_lanes and string.format(", %d lanes per channel", lanes) or ""
  c.id = (mode == "sequential" and string.format("seq_t%d", threads)
                                or string.format("c%d_t%d", chunk, threads)) .. lid
  c.desc = (mode == "sequential" and string.format("sequential, %d threads per block", threads)
                                  or string.format("chunked, chunk %d, %d threads per block", chunk, threads)) .. ldesc
  return c
end

-- Whether `lanes` threads can share one channel of a Mamba-1 scan with
-- d_state N (mg/derive_mamba1.lua scan_lanes_ok): -> true, or false and why.
function M.lanes_ok(N, lanes) return require("mg.derive_mamba1").scan_lanes_ok(N, lanes) end

-- The lane counts of a Mamba-1 sweep: opts.lanes (checked with lanes_ok by
-- the caller) or the spec's own count divided by M.LANE_DIVISORS (where it
-- divides) and times M.LANE_FACTORS, those that lanes_ok accepts, fewest
-- lanes first.
function M.lane_counts(d, opts)
  if opts and opts.lanes and #opts.lanes > 0 then return opts.lanes end
  local out = {}
  for _, q in ipairs(M.LANE_DIVISORS) do
    if d.scan_lanes % q == 0 and M.lanes_ok(d.N, d.scan_lanes // q) then out[#out + 1] = d.scan_lanes // q end
  end
  for _, f in ipairs(M.LANE_FACTORS) do
    if M.lanes_ok(d.N, d.scan_lanes * f) then out[#out + 1] = d.scan_lanes * f end
  end
  return out
end

local function list_or(v, default)
  if v == nil or #v == 0 then return default end
  return v
end

-- Mamba-3 SISO: the chunked SSM kernel (one block per (batch, head)) with
-- chunk length `chunk` and `threads` threads per block; v carries the
-- ck_* fields of mg/derive_mamba3.lua ck_variant. blocks = H (grid x).
local function candidate_m3(d, chunk, threads, v)
  return {
    mode = "chunked", chunk = chunk, threads = threads, channels = threads // 32, blocks = d.H,
    smem = v.ck_smem_bytes, ck = v,
    id = string.format("c%d_t%d", chunk, threads),
    desc = string.format("chunked SSM, chunk %d, %d warps per block, %d bytes of shared memory",
      chunk, threads // 32, v.ck_smem_bytes),
  }
end

-- The Mamba-3 candidates: every chunk x block size whose shape exists
-- (ck_variant), in option order; `skipped` gets "ID: why" for the others.
local function candidates_m3(d, opts, skipped)
  local d3 = require("mg.derive_mamba3")
  -- the variant of the spec's own shape must be exactly what derive chose
  local own = d3.ck_variant(d, d.ck_chunk, d.ck_warps)
  for k, v in pairs(own or {}) do
    if d[k] ~= v then
      error(string.format("tune: mg/derive_mamba3.lua ck_variant disagrees with derive_inference on %s (%s vs %s)",
        k, tostring(v), tostring(d[k])), 0)
    end
  end
  local out = {}
  for _, t in ipairs(list_or(opts.threads, M.THREADS_M3)) do
    for _, c in ipairs(list_or(opts.chunks, M.CHUNKS)) do
      local v, why = nil, "block size not a multiple of 32"
      if t % 32 == 0 then v, why = d3.ck_variant(d, c, t // 32) end
      if v then
        out[#out + 1] = candidate_m3(d, c, t, v)
      elseif skipped then
        skipped[#skipped + 1] = string.format("c%d_t%d: %s", c, t, why)
      end
    end
  end
  return out
end

-- The generic candidate (see M.generic): a copy of the launch shape of
-- `base` (a chunked candidate) with mode "generic", id "generic",
-- `same_as` = base.id, and `args`: the kernel's runtime dimensions in the
-- order of its struct tune_dims, { name =, value =, doc = } each.
local function arg(name, value, doc) return { name = name, value = value, doc = doc } end

-- The Mamba-1 dims policy of a candidate (kernels/mamba1/scan_body.cuh):
-- the members of its struct tune_dims, in order; the specialized
-- candidates make them constants, the generic one kernel arguments.
function M.m1_dims(d, channels)
  return {
    arg("E", d.E, "d_inner"),
    arg("E2", d.E2, "in_proj outputs x | z (row stride of xz)"),
    arg("N", d.N, "d_state"),
    arg("R", d.R, "dt_rank"),
    arg("XP", d.XP, "x_proj outputs R + 2N (row stride of dbl)"),
    arg("lanes", d.scan_lanes, "threads sharing one channel's state (a power of two dividing 32)"),
    arg("npt", d.scan_npt, "states per thread = N / lanes (<= NPT_MAX)"),
    arg("channels", channels, "channels per block = SCAN_THREADS / lanes"),
    arg("tchunk", (require("mg.derive_mamba1").scan_stage(d.N, channels)),
        "timesteps staged in shared memory per pass"),
  }
end

-- The Mamba-3 dims policy of a candidate (kernels/mamba3/chunked_body.cuh)
-- with the ck_* shape v: the members of its struct tune_dims, in order; the
-- specialized candidates make them constants, the generic one kernel
-- arguments.
function M.m3_dims(d, v)
  return {
    arg("N", d.N, "d_state"),
    arg("P", d.P, "headdim"),
    arg("H", d.H, "nheads"),
    arg("E", d.E, "d_inner = H * P (row stride of y)"),
    arg("NP", d.in_proj_out, "in_proj outputs (row stride of proj)"),
    arg("OFF_X", d.split_x, "column of x (v) in the in_proj output"),
    arg("nw", v.ck_nw, "state columns per warp (<= NW_MAX)"),
    arg("pw", v.ck_pw, "output columns per item (<= PW_MAX)"),
    arg("ny", v.ck_ny, "output items per chunk"),
    arg("ldn", v.ck_ldn, "row stride of the staged N-wide tiles = N + CK_PAD"),
  }
end

function M.generic(spec, d, cands)
  local own_chunk = spec.arch == "mamba3_siso" and d.ck_chunk or d.scan_chunk
  local own_threads = spec.arch == "mamba3_siso" and d.ck_threads or d.scan_threads
  local base
  for _, c in ipairs(cands) do
    if c.mode == "chunked" and c.chunk == own_chunk and c.threads == own_threads
       and (c.lanes == nil or c.lanes == d.scan_lanes) then base = c; break end
  end
  if not base then
    for _, c in ipairs(cands) do
      if c.mode == "chunked" and (c.lanes == nil or c.lanes == d.scan_lanes) then base = c; break end
    end
  end
  if not base then return nil end
  local g = {
    mode = "generic", generic = true, id = "generic", same_as = base.id,
    chunk = base.chunk, threads = base.threads, channels = base.channels, blocks = base.blocks,
    lanes = base.lanes,
  }
  if spec.arch == "mamba3_siso" then
    local v = base.ck
    assert(v.ck_nw <= M.GENERIC_M3_NW_MAX and v.ck_pw <= M.GENERIC_M3_PW_MAX, "tune: generic bounds")
    g.ck, g.smem = v, v.ck_smem_bytes
    g.nw_max, g.pw_max = M.GENERIC_M3_NW_MAX, M.GENERIC_M3_PW_MAX
    g.args = M.m3_dims(d, v)
  else
    assert(d.scan_npt <= M.GENERIC_M1_NPT_MAX, "tune: generic bound")
    local _, _, bytes = require("mg.derive_mamba1").scan_stage(d.N, base.channels)
    g.smem = bytes   -- the stage, now dynamic shared memory
    g.npt_max = M.GENERIC_M1_NPT_MAX
    g.args = M.m1_dims(d, base.channels)
  end
  g.desc = string.format("generic: %s with the model dimensions as kernel arguments", base.desc)
  return g
end

-- opts.chunks, opts.threads, opts.lanes (mamba1): lists overriding the
-- defaults (validated by the caller); opts.sequential = false leaves out the sequential baseline
-- (mamba1 only: the Mamba-3 sweep has no sequential candidate);
-- opts.generic = false leaves out the generic candidate.
-- opts.skipped (a list) collects the Mamba-3 shapes left out, with why.
function M.candidates(spec, d, opts)
  opts = opts or {}
  local out
  if spec.arch == "mamba3_siso" then
    out = candidates_m3(d, opts, opts.skipped)
  else
    local chunks = list_or(opts.chunks, M.CHUNKS)
    local threads = list_or(opts.threads, M.THREADS)
    out = {}
    for _, l in ipairs(M.lane_counts(d, opts)) do
      for _, t in ipairs(threads) do
        if t % 32 == 0 and t >= 32 and t <= 1024 and t >= l then
          if opts.sequential ~= false then out[#out + 1] = candidate(d, "sequential", 0, t, l) end
          for _, c in ipairs(chunks) do out[#out + 1] = candidate(d, "chunked", c, t, l) end
        end
      end
    end
  end
  if opts.generic ~= false then out[#out + 1] = M.generic(spec, d, out) end
  return out
end

-- Default sweep shapes: sequence lengths max/16, max/4 and max (those >= 16,
-- at least max itself), batch 1 and max_batch.
function M.default_shapes(d)
  local T, seen, seqlens = d.max_seq_len, {}, {}
  for _, t in ipairs({ T // 16, T // 4, T }) do
    if t >= 16 and not seen[t] then seen[t] = true; seqlens[#seqlens + 1] = t end
  end
  if #seqlens == 0 then seqlens[1] = T end
  -- batch 1, max_batch, and the power of two nearest their geometric mean
  -- between them: the scan crossover (M.crossover) needs a batch between
  -- the latency-bound and the full case to be worth more than the SM rule
  local batches = { 1 }
  local mid = 1
  while mid * mid * 2 < d.max_batch do mid = mid * 2 end
  if mid > 1 and mid < d.max_batch then batches[#batches + 1] = mid end
  if d.max_batch > 1 then batches[#batches + 1] = d.max_batch end
  return seqlens, batches
end

-- ---------------------------------------------------------------- sources

-- Parses "16,32,64" (host option text) into a list of integers, or nil.
local function int_list(s)
  if s == nil or s == "" then return nil end
  local out = {}
  for w in (s .. ","):gmatch("([^,]*),") do
    local v = math.tointeger(tonumber(w))
    if not v then error("tune: bad integer list '" .. s .. "'", 0) end
    out[#out + 1] = v
  end
  return out
end

-- The manifest lines every arch's candidate set starts with (format, spec,
-- cache key parts).
local function manifest_head(spec, key)
  return {
    "format " .. M.FORMAT,
    "spec_name " .. spec.name,
    "arch " .. spec.arch,
    "precision " .. spec.precision,
    "target " .. spec.target,
    "key_spec " .. key.spec,
    "key_templates " .. key.templates,
    "generator " .. key.generator,
  }
end

-- The generic candidate's manifest lines (after its `candidate` line).
function M.generic_manifest(man, c)
  local a = {}
  for i, x in ipairs(c.args) do a[i] = x.name .. "=" .. x.value end
  man[#man + 1] = "generic_same_as " .. c.same_as
  man[#man + 1] = "generic_args " .. table.concat(a, " ")
end

-- The files of a sweep, for every arch: the manifest (its head, the arch's
-- `lines`, the sweep defaults, the shapes left out) and one source per
-- candidate, rendered from `template` with the environment cand_env(c),
-- each with its manifest line(s); the manifest first.
local function sources_of(spec, d, template, cands, skipped, lines, cand_env)
  local tmpl = require("mg.tmpl")
  local seqlens, batches = M.default_shapes(d)
  local man = manifest_head(spec, M.key(spec))
  for _, line in ipairs(lines) do man[#man + 1] = line end
  for _, line in ipairs({
    "max_batch " .. d.max_batch,
    "max_seq_len " .. d.max_seq_len,
    "default_chunk " .. M.DEFAULT_CHUNK,
    "default_seqlens " .. table.concat(seqlens, ","),
    "default_batches " .. table.concat(batches, ","),
  }) do man[#man + 1] = line end
  for _, sk in ipairs(skipped) do man[#man + 1] = "skipped " .. sk end
  local files = { { path = "manifest.txt" } }
  for _, c in ipairs(cands) do
    local env = cand_env(c)
    local path = "tune_" .. c.id .. ".cu"
    files[#files + 1] = { path = path, content = tmpl.render(template, env), template = template }
    man[#man + 1] = string.format("candidate %s %s %d %d %d %d %s %d", c.id, c.mode, c.chunk, c.threads,
      c.channels, c.blocks, path, c.smem or 0)
    if c.generic then M.generic_manifest(man, c) end
  end
  files[1].content = table.concat(man, "\n") .. "\n"
  return files
end

-- The manifest (read by mamba-tune, tune/tune_main.c): `key value` lines,
-- then one `candidate` line per variant:
--   candidate ID MODE CHUNK THREADS CHANNELS BLOCKS FILE SMEM
-- (mamba1: CHANNELS per scan block, BLOCKS scan blocks per sequence, SMEM 0;
-- mamba3_siso: CHANNELS = warps per block, BLOCKS = H, SMEM the dynamic
-- shared memory of a block), and a `skipped ID: why` line per Mamba-3 shape
-- left out. The generic candidate is `candidate generic generic ...` (its
-- SMEM the dynamic shared memory of its blocks, for mamba1 the B/C stage),
-- followed by `generic_same_as ID` (the specialized candidate of the same
-- launch shape) and `generic_args NAME=VALUE ...`: the int fields of its
-- kernels' last argument (struct tune_dims), in order.
function M.sources(spec, d, args)
  local emit = require("mg.emit")
  local validate = require("mg.validate")
  local template = M.TEMPLATE[spec.arch]
  if not template then
    validate.spec_error(args.pos, "arch", "arch " .. spec.arch ..
      ": autotuning is available for mamba1 and mamba3_siso only (chunk_size auto uses the default "
      .. M.DEFAULT_CHUNK .. ")")
  end
  local o = args.options or {}
  local skipped = {}
  local lanes = int_list(o.lanes)
  if lanes and spec.arch ~= "mamba1" then
    error("tune: --lanes is for mamba1 specs (the mamba3_siso sweep has no lanes per channel)", 0)
  end
  if lanes then
    for _, l in ipairs(lanes) do
      local ok, why = M.lanes_ok(d.N, l)
      if not ok then error("tune: --lanes " .. o.lanes .. ": " .. why, 0) end
    end
  end
  local cands = M.candidates(spec, d, { chunks = int_list(o.chunks), threads = int_list(o.threads), lanes = lanes,
                                        sequential = o.sequential ~= "0", generic = o.generic ~= "0",
                                        skipped = skipped })
  if spec.arch == "mamba3_siso" then return M.sources_m3(spec, d, args, template, cands, skipped) end
  return sources_of(spec, d, template, cands, skipped, {
    "dims " .. string.format("E=%d N=%d R=%d XP=%d lanes=%d", d.E, d.N, d.R, d.XP, d.scan_lanes),
    "E " .. d.E, "N " .. d.N, "R " .. d.R, "XP " .. d.XP,
    "act_size " .. d.act_size,
    "tolerance " .. yaml_out.float_text(d.check_tol),
    "combine_threads " .. d.scan_combine_threads,
  }, function(c)
    local td = setmetatable({
      scan_threads = c.threads, scan_channels = c.channels, scan_blocks = c.blocks,
      scan_lanes = c.lanes, scan_npt = d.N // c.lanes,
      scan_chunk = c.chunk > 0 and c.chunk or M.DEFAULT_CHUNK,
    }, { __index = d })
    local env = emit.env(spec, td, args, template)
    env.cand = c
    c.dims = c.args or M.m1_dims(td, c.channels)
    return env
  end)
end

-- The Mamba-3 SISO sources and manifest (see M.sources): one chunked SSM
-- kernel per candidate, from mamba3/tune_scan.cu.tmpl with the candidate's
-- ck_* fields over d.
function M.sources_m3(spec, d, args, template, cands, skipped)
  local emit = require("mg.emit")
  return sources_of(spec, d, template, cands, skipped, {
    "dims " .. string.format("H=%d P=%d N=%d E=%d NP=%d", d.H, d.P, d.N, d.E, d.in_proj_out),
    "E " .. d.E, "N " .. d.N, "H " .. d.H, "P " .. d.P,
    "NP " .. d.in_proj_out, "off_x " .. d.split_x,
    "act_size " .. d.act_size,
    "tolerance " .. yaml_out.float_text(d.check_tol),
  }, function(c)
    local td = setmetatable({}, { __index = function(_, k)
      local v = c.ck[k]
      if v ~= nil then return v end
      return d[k]
    end })
    local env = emit.env(spec, td, args, template)
    env.cand = c
    env.dims = c.args or M.m3_dims(d, c.ck)
    return env
  end)
end

-- ---------------------------------------------------------------- lookup

-- A spec-tree node (kind/value/keys/values/items) as plain Lua data:
-- scalars stay strings.
local function plain(node)
  if type(node) ~= "table" then return nil end
  if node.kind == "scalar" then return node.value end
  if node.kind == "seq" then
    local t = {}
    for i, it in ipairs(node.items or {}) do t[i] = plain(it) end
    return t
  end
  if node.kind == "map" then
    local t = {}
    for i, k in ipairs(node.keys or {}) do
      if k.kind == "scalar" then t[k.value] = plain(node.values[i]) end
    end
    return t
  end
  return nil
end
M.plain = plain

-- The measured crossover of the Mamba-1 scans, from a cache entry `v` (plain
-- tables, as mamba-tune writes it): at the longest measured seqlen L, the
-- best chunked candidate (v.best: chunk size, block, lanes) against the
-- sequential scan of the same block (the library runs both with that block
-- and those lanes), per measured batch in ascending order.
-- -> { seqlen = L, chunk_max_batch = CW, seq_min_batch = SW }: CW the
-- largest batch up to which the chunked scan was faster at every measured
-- batch (0: not even at the smallest), SW the smallest batch at which the
-- sequential one was (nil: at none). nil when the entry has no such pair
-- (no sequential baseline, not both timed at L, a Mamba-3 entry).
function M.crossover(v)
  if type(v) ~= "table" or type(v.best) ~= "table" or type(v.shapes) ~= "table" or type(v.results) ~= "table" then
    return nil
  end
  local function num(x) return math.tointeger(tonumber(x)) end
  local chunk, threads, lanes = num(v.best.chunk_size), num(v.best.scan_threads), num(v.best.scan_lanes)
  if not chunk or not threads or not lanes then return nil end   -- Mamba-3 entries name no lanes
  local cr, sr
  for _, r in ipairs(v.results) do
    if type(r) == "table" and (r.verified == true or r.verified == "true") and num(r.scan_threads) == threads
       and (r.lanes == nil or num(r.lanes) == lanes) and type(r.median_ms) == "table" then
      if r.mode == "chunked" and num(r.chunk_size) == chunk and not cr then cr = r end
      if r.mode == "sequential" and not sr then sr = r end
    end
  end
  if not cr or not sr then return nil end
  local L = 0
  for _, sh in ipairs(v.shapes) do
    local s = type(sh) == "table" and num(sh.seqlen)
    if s and s > L then L = s end
  end
  local rows = {}
  for i, sh in ipairs(v.shapes) do
    local b, s = type(sh) == "table" and num(sh.batch), type(sh) == "table" and num(sh.seqlen)
    local tc, ts = tonumber(cr.median_ms[i]), tonumber(sr.median_ms[i])
    if b and s == L and tc and ts then rows[#rows + 1] = { b = b, chunk_wins = tc < ts } end
  end
  if #rows == 0 then return nil end
  table.sort(rows, function(x, y) return x.b < y.b end)
  local cw, sw = 0, nil
  for _, r in ipairs(rows) do
    if sw == nil then
      if r.chunk_wins then cw = r.b else sw = r.b end
    end
  end
  return { seqlen = L, chunk_max_batch = cw, seq_min_batch = sw }
end

local function valid_chunk(v)
  v = math.tointeger(tonumber(v))
  for _, c in ipairs(M.CHUNKS) do if c == v then return v end end
  return nil
end

-- -> tuned = { chunk_size =, scan_threads = (or nil), scan_lanes = (mamba1,
-- or nil), crossover = (M.crossover of the entry, or nil), source = "tuned" |
-- "default", note = "message for stderr" }, or nil when nothing is auto.
function M.resolve(spec, args)
  if spec.scan.chunk_size ~= "auto" then return nil end
  local t = mg.tune_cache() or {}
  -- the queried device's SM count (none for a name given by --gpu / MG_GPU)
  local sms = math.tointeger(t.sms)
  if sms and (sms < 1 or sms > 65536) then sms = nil end
  local sms_note = (sms and sms ~= M.DEFAULT_SMS)
    and string.format("; launch shapes sized for its %d SMs", sms) or ""
  local function default(why)
    return { chunk_size = M.DEFAULT_CHUNK, source = "default", sms = sms,
             note = string.format("scan.chunk_size: auto -> %d (the default: %s)%s", M.DEFAULT_CHUNK, why, sms_note) }
  end
  if not M.TEMPLATE[spec.arch] then
    return default("autotuning is available for mamba1 and mamba3_siso only")
  end
  if not t.gpu then
    return default((t.gpu_source or "no GPU known") ..
      "; pass --gpu NAME or set MG_GPU to use the tune cache of that GPU")
  end
  local key = M.key(spec)
  local best, best_path
  for _, e in ipairs(t.entries or {}) do
    local v = plain(e.tree)
    local kp = type(v) == "table" and v.key_parts
    if type(kp) == "table" and v.format == M.FORMAT and kp.spec == key.spec
       and kp.generator == key.generator and kp.templates == key.templates and kp.gpu == t.gpu
       and (t.cc == nil or kp.cc == t.cc) and type(v.best) == "table" and valid_chunk(v.best.chunk_size) then
      -- prefer the entry made with this driver, then the newest
      local rank = { (t.driver and kp.driver == t.driver) and 1 or 0, tostring(v.created or "") }
      if not best or rank[1] > best.rank[1] or (rank[1] == best.rank[1] and rank[2] > best.rank[2]) then
        best, best_path = { v = v, rank = rank }, e.path
      end
    end
  end
  if not best then
    local why = string.format("no tune cache entry for this spec on %s%s in %s; run `mamba-gen tune %s`",
      t.gpu, t.cc and (" (cc " .. t.cc .. ")") or "", t.dir or "the cache directory",
      args.spec_path or "SPEC.yaml")
    if t.bad and #t.bad > 0 then why = why .. "; ignored: " .. table.concat(t.bad, "; ") end
    return default(why)
  end
  local v = best.v
  local chunk = valid_chunk(v.best.chunk_size)
  local threads = math.tointeger(tonumber(v.best.scan_threads))
  local lanes = math.tointeger(tonumber(v.best.scan_lanes))   -- mamba1 entries since lanes are swept
  return {
    chunk_size = chunk, scan_threads = threads, scan_lanes = lanes, source = "tuned", file = best_path,
    sms = sms, crossover = M.crossover(v),
    note = string.format("scan.chunk_size: auto -> %d (tuned on %s, %s, %s)%s", chunk, t.gpu,
      tostring(v.created or "?"), best_path, sms_note),
  }
end

return M
