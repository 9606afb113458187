-- tests/test_tune.lua: mg/tune.lua's candidate sets and sources, in
-- particular the `generic` baseline (doc/tuning.md "Specialized vs
-- generic"): one per sweep, last, in the launch shape of the spec's own
-- chunked candidate (else the first chunked one), never for --no-generic;
-- its manifest lines; its source rendered from the same template with the
-- model dims as kernel arguments (struct tune_dims in the order of
-- generic_args), deterministic; the specialized sources carry no trace of it.
-- Run by tests/tune_compile.test (`mamba-gen --lua-test`).

local T = require("tests.harness").new("test_tune")
local check, is = T.check, T.is
local derive = require("mg.derive")
local tune = require("mg.tune")

-- The test specs: t1 (Mamba-1) and t3 (Mamba-3 SISO), chunked, inference only.
local T1 = { name = "t1", model = { d_model = 256, n_layers = 2, d_state = 64 }, scan = { mode = "chunked" },
             shapes = { max_batch = 8, max_seq_len = 4096 }, emit = { training = false } }
local T3 = { name = "t3", model = { d_model = 128, n_layers = 4, d_state = 64, headdim = 32, input_dim = 64 },
             scan = { mode = "chunked" }, shapes = { max_batch = 64, max_seq_len = 1024 }, emit = { training = false } }

local function find(list, id)
  for _, c in ipairs(list) do if c.id == id then return c end end
  return nil
end

local function count(list, pred)
  local n = 0
  for _, c in ipairs(list) do if pred(c) then n = n + 1 end end
  return n
end

local function files_by_path(files)
  local t = {}
  for _, f in ipairs(files) do t[f.path] = f.content end
  return t
end

local function args(spec, options)
  return { spec_name = spec.name .. ".yaml", spec_hash = string.rep("ab", 32), options = options or {} }
end

-- ------------------------------------------------------------ Mamba-1
local s1 = T.spec("mamba1", T1)
local d1 = derive.derive(s1)
local c1 = tune.candidates(s1, d1, {})
is(#c1, 97, "mamba1: 4 lane counts x 4 block sizes x (5 chunks + sequential) + generic")
is(count(c1, function(c) return c.generic end), 1, "mamba1: one generic candidate")
local g1 = c1[#c1]
is(g1.id, "generic", "mamba1: the generic candidate is last, id generic")
is(g1.mode, "generic", "mamba1: mode generic")
is(g1.same_as, "c64_t256", "mamba1: launch shape of the spec's own chunked candidate (chunk 64, 256 threads)")
is(g1.chunk .. "/" .. g1.threads .. "/" .. g1.channels .. "/" .. g1.blocks, "64/256/16/32",
  "mamba1: chunk, threads, channels, blocks of c64_t256")
is(g1.smem, d1.scan_smem_bytes, "mamba1: dynamic shared memory = the specialized B/C stage")
local names = {}
for i, a in ipairs(g1.args) do names[i] = a.name .. "=" .. a.value end
is(table.concat(names, " "), "E=512 E2=1024 N=64 R=16 XP=144 lanes=16 npt=4 channels=16 tchunk=32",
  "mamba1: the kernel's runtime dims, in struct order")
is(#tune.candidates(s1, d1, { generic = false }), 96, "mamba1: generic = false leaves it out")

-- lanes per channel: the spec's own count (16 at N = 64) / 4, / 2, x 1, 2; ids name
-- the others; channels and stage follow; the generic keeps the own count
is(table.concat(tune.lane_counts(d1), ","), "4,8,16,32", "mamba1 N=64: lanes 4, 8, 16, 32 by default")
is(count(c1, function(c) return c.lanes == 8 end), 24, "mamba1: 24 candidates with 8 lanes")
local l8 = find(c1, "c64_t128_l8")
check(l8 ~= nil, "mamba1: id c64_t128_l8 names its lanes")
is(l8 and (l8.channels .. "/" .. l8.blocks), "16/32", "c64_t128_l8: 16 channels per block, 32 blocks for E = 512")
check(find(c1, "c64_t256_l16") == nil and find(c1, "c64_t256") ~= nil and find(c1, "c64_t256_l4") ~= nil,
  "mamba1: the own lane count has the plain id, the others name theirs")
is(g1.lanes, 16, "mamba1: the generic candidate has the spec's own lanes")
local d16 = derive.derive(T.spec("mamba1", { name = "t16", model = { d_model = 128, n_layers = 1, d_state = 16 },
  shapes = { max_batch = 64, max_seq_len = 256 }, emit = { training = false } }))
is(table.concat(tune.lane_counts(d16), ","), "1,2,4,8,16", "mamba1 N=16 at batch 64: its 4 lanes / 4, / 2, x 1, 2, 4")
is(table.concat(tune.lane_counts(d16, { lanes = { 8 } }), ","), "8", "opts.lanes replaces the default list")
local d4 = derive.derive(T.spec("mamba1", { name = "t4", model = { d_model = 128, n_layers = 1, d_state = 4 },
  shapes = { max_batch = 8, max_seq_len = 256 }, emit = { training = false } }))
is(table.concat(tune.lane_counts(d4), ","), "1,2,4", "mamba1 N=4: up to 4 lanes (one state each)")
check(tune.lanes_ok(16, 16) and not tune.lanes_ok(16, 32) and not tune.lanes_ok(64, 2) and not tune.lanes_ok(64, 3),
  "lanes_ok: 16 of 16 yes; 32 of 16, 2 of 64 (32 states), 3: no")
local f8 = files_by_path(tune.sources(s1, d1, args(s1, { chunks = "64", threads = "128", lanes = "8" })))
local src8 = f8["tune_c64_t128_l8.cu"]
check(src8 ~= nil and src8:find("static constexpr int lanes = 8;", 1, true) ~= nil
  and src8:find("static constexpr int npt = 8;", 1, true) ~= nil
  and src8:find("static constexpr int channels = 16;", 1, true) ~= nil, "--lanes 8: the candidate's dims policy")
local okl, errl = pcall(tune.sources, s1, d1, args(s1, { lanes = "2" }))
check(not okl and tostring(errl):find("--lanes 2: 2 lanes leave 32 states per thread", 1, true) ~= nil,
  "--lanes 2 at N = 64: a clear error", errl)

-- the spec's shape not in the sweep: the first chunked candidate's
local c1b = tune.candidates(s1, d1, { chunks = { 32, 256 }, threads = { 256 } })
is(c1b[#c1b].same_as, "c32_t256", "mamba1: own shape not swept -> the first chunked candidate")
local c1c = tune.candidates(s1, d1, { chunks = { 128 }, threads = { 64, 128 } })
is(c1c[#c1c].same_as, "c128_t64", "mamba1: chunk 128 only -> c128_t64")

-- sources: manifest lines, the generic file, determinism
local f1 = tune.sources(s1, d1, args(s1, { chunks = "64", threads = "256" }))
local by1 = files_by_path(f1)
check(by1["tune_generic.cu"] ~= nil, "mamba1 sources: tune_generic.cu")
local man1 = by1["manifest.txt"]
check(man1:find("\ncandidate generic generic 64 256 16 32 tune_generic.cu " .. d1.scan_smem_bytes .. "\n", 1, true) ~= nil,
  "mamba1 manifest: candidate generic line (SMEM = the stage)", man1)
check(man1:find("\ngeneric_same_as c64_t256\n", 1, true) ~= nil, "mamba1 manifest: generic_same_as")
check(man1:find("\ngeneric_args E=512 E2=1024 N=64 R=16 XP=144 lanes=16 npt=4 channels=16 tchunk=32\n", 1, true) ~= nil,
  "mamba1 manifest: generic_args")
check(man1:find("\ncandidate c64_t256 chunked 64 256 16 32 tune_c64_t256.cu 0\n", 1, true) ~= nil,
  "mamba1 manifest: specialized candidates keep SMEM 0")
local gsrc = by1["tune_generic.cu"]
check(gsrc:find("GENERIC VARIANT", 1, true) ~= nil, "generic source: says what it is")
check(gsrc:find("struct tune_dims {\n    int E;", 1, true) ~= nil, "generic source: struct tune_dims")
check(gsrc:find("constexpr int E =", 1, true) == nil and gsrc:find("constexpr int N =", 1, true) == nil,
  "generic source: no model dimension is a constant")
check(gsrc:find("constexpr int SCAN_CHUNK = 64;", 1, true) ~= nil and gsrc:find("constexpr int SCAN_THREADS = 256;", 1, true) ~= nil,
  "generic source: the launch shape is")
check(gsrc:find("static constexpr int NPT_MAX = 16;", 1, true) ~= nil and
  gsrc:find("for (int j = 0; j < Dm::NPT_MAX; ++j) if (j < dm.npt)", 1, true) ~= nil,
  "generic source: state loops to the bound with a runtime guard")
check(gsrc:find("tune_scan_seq", 1, true) == nil, "generic source: the chunked kernels only")
local ssrc = by1["tune_c64_t256.cu"]
check(ssrc:find("    int E;", 1, true) == nil and ssrc:find("GENERIC", 1, true) == nil,
  "specialized source: no trace of the generic variant (its dims policy is constants)")
check(ssrc:find("constexpr int N = 64;", 1, true) ~= nil, "specialized source: N is a constant")
local f1b = tune.sources(s1, d1, args(s1, { chunks = "64", threads = "256" }))
local same = #f1 == #f1b
for i = 1, math.min(#f1, #f1b) do same = same and f1[i].path == f1b[i].path and f1[i].content == f1b[i].content end
check(same, "mamba1 sources: deterministic")
local f1n = files_by_path(tune.sources(s1, d1, args(s1, { chunks = "64", threads = "256", generic = "0" })))
check(f1n["tune_generic.cu"] == nil and not f1n["manifest.txt"]:find("generic", 1, true),
  "mamba1 sources: options.generic = 0 leaves it out")

-- bf16, d_state 256 (32 lanes): npt stays within the bound
local sb = T.spec("mamba1", T1, { model = { d_state = 256 }, precision = "bf16" })
local db = derive.derive(sb)
local cb = tune.candidates(sb, db, {})
is(cb[#cb].args[7].name .. "=" .. cb[#cb].args[7].value, "npt=8", "bf16 N 256: npt 8 (<= SCAN_NPT_MAX)")

-- ------------------------------------------------------------ Mamba-3 SISO
local s3 = T.spec("mamba3_siso", T3)
local d3 = derive.derive(s3)
local c3 = tune.candidates(s3, d3, {})
is(#c3, 13, "mamba3: 4 chunks x 3 block sizes + generic")
local g3 = c3[#c3]
is(g3.id .. " " .. g3.mode, "generic generic", "mamba3: generic last")
is(g3.same_as, string.format("c%d_t%d", d3.ck_chunk, d3.ck_threads), "mamba3: the spec's own chunked shape")
is(g3.smem, find(c3, g3.same_as).smem, "mamba3: the same dynamic shared memory")
names = {}
for i, a in ipairs(g3.args) do names[i] = a.name .. "=" .. a.value end
is(table.concat(names, " "), string.format("N=64 P=32 H=8 E=256 NP=%d OFF_X=%d nw=%d pw=%d ny=%d ldn=%d",
  d3.in_proj_out, d3.split_x, d3.ck_nw, d3.ck_pw, d3.ck_ny, d3.ck_ldn), "mamba3: the kernel's runtime dims")
local f3 = files_by_path(tune.sources(s3, d3, args(s3, {})))
local m3src = f3["tune_generic.cu"]
check(m3src ~= nil and m3src:find("GENERIC VARIANT", 1, true) ~= nil, "mamba3 sources: tune_generic.cu, commented")
check(m3src:find("constexpr int N =", 1, true) == nil and m3src:find("const int N = dm.N", 1, true) ~= nil,
  "mamba3 generic: N is a kernel argument")
check(m3src:find("float hs[Dm::NW_MAX / 8][4];", 1, true) ~= nil and
  m3src:find("static constexpr int NW_MAX = 128;", 1, true) ~= nil, "mamba3 generic: the state tile has the bound")
check(m3src:find("    int ldn;", 1, true) ~= nil and m3src:find("static constexpr bool FIXED = false;", 1, true) ~= nil,
  "mamba3 generic: the N-wide tile stride is an argument")
local m3s = f3["tune_c64_t256.cu"]
check(m3s:find("static constexpr bool FIXED = true;", 1, true) ~= nil and m3s:find("static constexpr int N = ", 1, true) ~= nil
  and m3s:find("GENERIC", 1, true) == nil, "mamba3 specialized: the same body, the dims as constants")
check(f3["manifest.txt"]:find("\ngeneric_same_as " .. g3.same_as .. "\ngeneric_args N=64 ", 1, true) ~= nil,
  "mamba3 manifest: generic lines")
-- own shape left out of the sweep (chunk 32 only)
local c3b = tune.candidates(s3, d3, { chunks = { 32 } })
is(c3b[#c3b].same_as, c3b[1].id, "mamba3: own shape not swept -> the first candidate's shape")

-- resolve: the queried GPU's SM count goes to derive (sms), named in the
-- note when it is not the default's 132; none for a name given by hand
local sa = T.spec("mamba1", T1, { scan = { chunk_size = "auto" } })
local host_cache = mg.tune_cache
local served
mg.tune_cache = function() return served end
served = { gpu = "NVIDIA L40S", cc = "8.9", sms = 142, gpu_source = "device 0", dir = "/nonexistent", entries = {} }
local r142 = tune.resolve(sa, {})
is(r142.chunk_size .. "/" .. r142.source .. "/" .. tostring(r142.sms), "64/default/142", "resolve: the GPU's SM count with the default chunk")
check(r142.note:find("; launch shapes sized for its 142 SMs", 1, true) ~= nil, "resolve: the note names the SM count", r142.note)
served = { gpu = "NVIDIA H200", cc = "9.0", sms = 132, gpu_source = "device 0", dir = "/nonexistent", entries = {} }
local r132 = tune.resolve(sa, {})
check(r132.sms == 132 and not r132.note:find("SMs", 1, true), "resolve: 132 SMs (the default) not in the note", r132.note)
served = { gpu = "NVIDIA H200", gpu_source = "--gpu", dir = "/nonexistent", entries = {} }
is(tostring(tune.resolve(sa, {}).sms), "nil", "resolve: a GPU named by hand has no SM count")
served = { gpu = "X", sms = 0, gpu_source = "device 0", entries = {} }
is(tostring(tune.resolve(sa, {}).sms), "nil", "resolve: an SM count out of range is dropped")
mg.tune_cache = host_cache
local d142 = derive.derive(sa, { tuned = r142 })
is(d142.sms .. "/" .. d142.sms_source, "142/gpu", "resolve's SM count is derive's d.sms")

-- crossover: the best chunked candidate against the sequential scan of the
-- same block and lanes, at the longest measured seqlen, batches ascending
local function entry(rows, shapes, best)
  return { best = best or { chunk_size = 32, scan_threads = 128, scan_lanes = 4 },
           shapes = shapes or { { batch = 1, seqlen = 256 }, { batch = 16, seqlen = 256 }, { batch = 64, seqlen = 256 },
                                { batch = 64, seqlen = 64 } },
           results = rows }
end
local function row(mode, ms, o)
  o = o or {}
  return { mode = mode, chunk_size = o.chunk or (mode == "chunked" and 32 or 0), scan_threads = o.threads or 128,
           lanes = o.lanes or 4, verified = o.verified == nil and true or o.verified, median_ms = ms }
end
local xo = tune.crossover(entry({ row("chunked", { 1, 1, 1, 9 }), row("sequential", { 2, 2, 0.5, 1 }) }))
is(xo.seqlen .. "/" .. xo.chunk_max_batch .. "/" .. tostring(xo.seq_min_batch), "256/16/64",
  "crossover: chunked wins at 1 and 16, sequential at 64 (at 256 steps; the 64-step shape is not read)")
xo = tune.crossover(entry({ row("chunked", { 1, 3, 1, 9 }), row("sequential", { 2, 2, 2, 1 }) }))
is(xo.chunk_max_batch .. "/" .. tostring(xo.seq_min_batch), "1/16",
  "crossover: the chunked bound stops at the first batch the sequential scan wins")
xo = tune.crossover(entry({ row("chunked", { 1, 1, 1, 9 }),
                            row("sequential", { 0.1, 0.1, 0.1, 0.1 }, { lanes = 8 }),
                            row("sequential", { 0.1, 0.1, 0.1, 0.1 }, { verified = false }),
                            row("sequential", { 2, 2, 2, 2 }) }))
is(xo.chunk_max_batch .. "/" .. tostring(xo.seq_min_batch), "64/nil",
  "crossover: sequential rows of other lanes and unverified ones are not the baseline")
is(tune.crossover(entry({ row("chunked", { 1, 1, 1, 1 }) })), nil, "crossover: no sequential baseline -> nil")
is(tune.crossover(entry({ row("chunked", { 1, 1, 1, 1 }), row("sequential", { 2, 2, 2, 2 }) },
  nil, { chunk_size = 32, scan_threads = 128 })), nil, "crossover: an entry without scan_lanes (Mamba-3) -> nil")
is(tune.crossover({ best = {} }), nil, "crossover: a malformed entry -> nil")
local dxo = derive.derive(sa, { tuned = { chunk_size = 64, source = "tuned", scan_threads = 128,
  crossover = { seqlen = 4096, chunk_max_batch = 2, seq_min_batch = 8 } } })
is(dxo.scan_auto_tuned_len .. "/" .. dxo.scan_auto_chunk_batch .. "/" .. dxo.scan_auto_seq_batch, "4096/2/8",
  "derive: a tuned crossover's bounds")
local dno = derive.derive(sa, { tuned = { chunk_size = 64, source = "default",
  crossover = { seqlen = 4096, chunk_max_batch = 2, seq_min_batch = 8 } } })
is(dno.scan_auto_tuned_len .. "/" .. dno.scan_auto_chunk_batch .. "/" .. dno.scan_auto_seq_batch, "0/0/0",
  "derive: no crossover unless the entry was tuned")

-- default shapes: batch 1, a power of two near sqrt(max_batch), max_batch
local function batches_of(mb)
  local _, b = tune.default_shapes({ max_seq_len = 256, max_batch = mb })
  return table.concat(b, ",")
end
for _, c in ipairs({ { 1, "1" }, { 2, "1,2" }, { 8, "1,2,8" }, { 64, "1,8,64" }, { 1024, "1,32,1024" } }) do
  is(batches_of(c[1]), c[2], string.format("default batches: max_batch %d -> %s", c[1], c[2]))
end

return T.done()
