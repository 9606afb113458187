-- tests/test_validate.lua: mg/validate.lua and mg/schema.lua. Specs are
-- written as YAML text and turned into the host's tree format by a tiny
-- block-YAML reader below (the subset these tests use: `key: value`, nested
-- block mappings, `- item` lists, flow lists [a, b], quoted scalars,
-- comments). Positions follow libyaml: 1-based line and column of the node.
-- Prints one line per check; raises an error when any check failed.

local validate = require("mg.validate")
local schema = require("mg.schema")

-- ------------------------------------------------------------ mini YAML
local function yaml_tree(text)
  local lines = {}
  local ln = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    ln = ln + 1
    local body = line
    if not body:match("^%s*[\"']") and not body:match(":%s*[\"']") then
      body = body:gsub("%s+#.*$", "")
    end
    body = body:gsub("^%s*#.*$", "")
    if body:match("%S") then
      lines[#lines + 1] = { n = ln, text = body, ind = #body:match("^ *") }
    end
  end
  local i = 1
  local function scalar(s, line, col)
    local q = s:match('^"(.*)"$') or s:match("^'(.*)'$")
    if q then return { kind = "scalar", value = q, plain = false, line = line, col = col } end
    if s:match("^%[.*%]$") then
      local node = { kind = "seq", items = {}, line = line, col = col }
      local inner = s:sub(2, -2)
      local p = 1
      for item in inner:gmatch("[^,]+") do
        local lead = #item:match("^%s*")
        local a = inner:find(item, p, true)
        node.items[#node.items + 1] = scalar(item:match("^%s*(.-)%s*$"), line, col + a + lead)
        p = a + #item
      end
      return node
    end
    return { kind = "scalar", value = s, plain = true, line = line, col = col }
  end
  local function block(ind)
    local first = lines[i]
    if first.text:sub(ind + 1, ind + 2) == "- " then
      local node = { kind = "seq", items = {}, line = first.n, col = ind + 1 }
      while lines[i] and lines[i].ind == ind and lines[i].text:sub(ind + 1, ind + 2) == "- " do
        node.items[#node.items + 1] = scalar(lines[i].text:sub(ind + 3):match("^(.-)%s*$"), lines[i].n, ind + 3)
        i = i + 1
      end
      return node
    end
    if not first.text:find(":") then
      i = i + 1
      return scalar(first.text:match("^%s*(.-)%s*$"), first.n, ind + 1)
    end
    local node = { kind = "map", keys = {}, values = {}, line = first.n, col = ind + 1 }
    while lines[i] and lines[i].ind == ind do
      local L = lines[i]
      local k, rest = L.text:match("^ *([^:]+):(.*)$")
      node.keys[#node.keys + 1] = { kind = "scalar", value = k, plain = true, line = L.n, col = ind + 1 }
      i = i + 1
      local vs = rest:match("^%s*(.-)%s*$")
      local val
      if vs == "" then
        if lines[i] and (lines[i].ind > ind or (lines[i].ind == ind and lines[i].text:sub(ind + 1, ind + 2) == "- ")) then
          val = block(lines[i].ind)
        else
          val = { kind = "scalar", value = "", plain = true, line = L.n, col = ind + #k + 2 }
        end
      else
        local col = L.text:find(vs, ind + #k + 2, true)
        val = scalar(vs, L.n, col)
      end
      node.values[#node.values + 1] = val
    end
    return node
  end
  return block(lines[1].ind)
end

-- ------------------------------------------------------------ harness
local T = require("tests.harness").new("test_validate")
local check, is = T.check, T.is

-- validate text -> spec or nil, {"line:col: msg", ...}
local function run(text)
  local ok, r, pos = pcall(validate.validate, yaml_tree(text))
  if ok then return r, pos end
  if type(r) ~= "table" or not r.spec_errors then error(r, 0) end
  local out = {}
  for k, e in ipairs(r.spec_errors) do out[k] = string.format("%d:%d: %s", e.line, e.col, e.msg) end
  return nil, out
end

local BASE_M1 = [[
name: m
arch: mamba1
model:
  d_model: 128
  n_layers: 4
shapes:
  max_batch: 8
  max_seq_len: 256
]]

-- Replace/add lines of a base spec: edits = { ["  d_model: 128"] = "  d_model: 100" }
local function edit(base, from, to)
  local a, b = base:find(from, 1, true)
  assert(a, "edit: no " .. from)
  return base:sub(1, a - 1) .. to .. base:sub(b + 1)
end

-- Exactly these errors.
local function errors_are(text, want, desc)
  local spec, errs = run(text)
  if spec then check(false, desc, "no error; expected: " .. table.concat(want, " | ")) return end
  local got = table.concat(errs, " | ")
  is(got, table.concat(want, " | "), desc)
end

-- One error per edit of a base spec: cases = { { description, from, to,
-- error [, base = another base text] }, ... }, each checked in order as
-- errors_are(edit(base, from, to), { error }, description).
local function edit_errors(base, cases)
  for _, c in ipairs(cases) do errors_are(edit(c.base or base, c[2], c[3]), { c[4] }, c[1]) end
end

-- ------------------------------------------------------------ canonical spec
local spec, pos = run(BASE_M1)
check(spec ~= nil, "minimal mamba1 spec is valid", spec == nil and table.concat(pos, " | "))
if spec then
  is(spec.name, "m", "name")
  is(spec.precision, "f32", "precision default f32")
  is(spec.allow_tf32, false, "allow_tf32 default false")
  is(spec.target, "sm_90", "target default sm_90")
  is(spec.scan.mode, "auto", "scan.mode default auto")
  is(spec.scan.chunk_size, 64, "scan.chunk_size default 64")
  is(spec.shapes.batch, nil, "no shapes.batch (removed)")
  is(spec.emit.training, true, "emit.training default true")
  is(spec.emit.inference, true, "emit.inference default true")
  is(spec.emit.deterministic, true, "emit.deterministic default true")
  is(spec.model.d_state, 16, "mamba1 d_state default 16")
  is(spec.model.expand, 2, "expand default 2")
  is(spec.model.d_conv, 4, "d_conv default 4")
  is(spec.model.dt_rank, "auto", "dt_rank default auto")
  is(spec.model.input_dim, 0, "input_dim default 0")
  is(spec.model.norm_eps, 1e-5, "norm_eps default 1e-5")
  is(math.type(spec.model.norm_eps), "float", "norm_eps is a float")
  is(math.type(spec.model.d_model), "integer", "d_model is an integer")
  is(spec.model.headdim, nil, "mamba3 keys absent for mamba1")
  is(pos["model.d_model"].line, 4, "position of model.d_model")
  is(pos["model.d_model"].col, 12, "column of model.d_model")
  check(pos["model.d_conv"].default, "defaulted keys are marked in pos")
end

local m3 = run([[
name: m3
arch: mamba3_siso
model:
  d_model: 128
  n_layers: 2
shapes:
  max_batch: 1
  max_seq_len: 64
]])
check(m3 ~= nil, "minimal mamba3_siso spec is valid")
if m3 then
  is(m3.model.d_state, 128, "mamba3 d_state default 128")
  is(m3.model.headdim, 64, "headdim default 64")
  is(m3.model.ngroups, 1, "ngroups default 1")
  is(m3.model.rope_fraction, 0.5, "rope_fraction default 0.5")
  is(m3.model.a_activation, "heavy_tail", "a_activation default heavy_tail")
  is(m3.model.a_floor, 1e-4, "a_floor default 1e-4")
  is(m3.model.outproj_norm, true, "outproj_norm default true")
  is(m3.model.d_conv, nil, "mamba1 keys absent for mamba3")
end

-- YAML 1.2 core schema typing
local full = run([[
name: m_2
arch: mamba1
model:
  d_model: 0x80
  n_layers: 0o10
  d_state: +32
  expand: 1
  d_conv: 2
  dt_rank: 7
  input_dim: 0
  norm_eps: 1e-6
precision: "bf16"
scan:
  mode: chunked
  chunk_size: auto
shapes:
  max_batch: 4
  max_seq_len: 1024
emit:
  training: False
  inference: TRUE
  deterministic: false
target: 'sm_80'
]])
check(full ~= nil, "full spec with hex, octal, +int, quoted enums is valid")
if full then
  is(full.model.d_model, 128, "0x80 = 128")
  is(full.model.n_layers, 8, "0o10 = 8")
  is(full.model.d_state, 32, "+32 = 32")
  is(full.model.dt_rank, 7, "dt_rank 7")
  is(full.model.norm_eps, 1e-6, "1e-6 is a float")
  is(full.precision, "bf16", "quoted enum value accepted")
  is(full.scan.chunk_size, "auto", "chunk_size auto")
  is(full.emit.training, false, "False is false")
  is(full.emit.inference, true, "TRUE is true")
  is(full.target, "sm_80", "target sm_80")
end

local function cls(s, plain) return validate.classify({ value = s, plain = plain ~= false }) end
is(cls("~").t, "null", "~ is null")
is(cls("").t, "null", "empty is null")
is(cls("Null").t, "null", "Null is null")
is(cls("1.0e-4").t, "float", "1.0e-4 is a float")
is(cls(".5").t, "float", ".5 is a float")
is(cls("5.").t, "float", "5. is a float")
is(cls("-.inf").t, "float", "-.inf is a float")
is(cls(".NaN").t, "float", ".NaN is a float")
is(cls("1e3").t, "float", "1e3 is a float")
is(cls("0x1F").v, 31, "0x1F: upper-case hex digits are ints")
is(cls("0x1f").v, 31, "0x1f = 31")
is(cls("0o17").v, 15, "0o17 = 15")
is(cls("017").v, 17, "017 = 17 (decimal in YAML 1.2)")
is(cls("yes").t, "str", "yes is a string in YAML 1.2")
is(cls("1_000").t, "str", "1_000 is a string in YAML 1.2")
is(cls("128", false).t, "str", "quoted 128 is a string")
check(cls("99999999999999999999").big, "huge ints are flagged")

-- Suggestions
is(validate.suggest("d_sate", { "d_model", "n_layers", "d_state" }), "d_state", "suggest d_state for d_sate")
is(validate.suggest("zzz", { "d_model", "d_state" }), nil, "no suggestion when far")
is(validate.suggest("D_MODEL", { "d_model", "d_state" }), "d_model", "case-insensitive suggestion")

-- ------------------------------------------------------------ errors
edit_errors(BASE_M1, {
  { "unknown key with suggestion", "  n_layers: 4", "  n_layers: 4\n  d_sate: 16",
    "6:3: unknown key 'd_sate' in model; did you mean 'd_state'?" },
  { "unknown key without suggestion lists the valid keys", "name: m", "name: m\nfrobnicate: 1",
    "2:1: unknown key 'frobnicate' at the top level; valid keys: name, arch, model, precision, allow_tf32, scan, shapes, emit, target" },
  { "missing required key at the parent mapping", "  d_model: 128\n", "",
    "4:3: missing required key 'model.d_model'" },
  { "missing name", "name: m\n", "",
    "1:1: missing required key 'name'" },
  { "missing required section", "shapes:\n  max_batch: 8\n  max_seq_len: 256\n", "",
    "1:1: missing required key 'shapes'" },
  { "float where an int is needed", "  n_layers: 4", "  n_layers: 4\n  expand: 2.5",
    "6:11: model.expand: expected an integer, got 2.5" },
  { "quoted int is a type error that says so", "  d_model: 128", '  d_model: "128"',
    '4:12: model.d_model: expected an integer, got the string "128" (quoted values are strings; remove the quotes)' },
  { "out of range", "  n_layers: 4", "  n_layers: 4\n  d_conv: 12",
    "6:11: model.d_conv: 12 is out of range 2..8" },
  { "d_model multiple of 8", "  d_model: 128", "  d_model: 100",
    "4:12: model.d_model: 100 is not a multiple of 8 (rows are read as 16-byte vectors)" },
  { "mamba1 d_state power of two", "  n_layers: 4", "  n_layers: 4\n  d_state: 24",
    "6:12: model.d_state: 24 is not a power of two; expected one of 1, 2, 4, 8, 16, 32, 64, 128, 256" },
  { "mamba1 d_state range", "  n_layers: 4", "  n_layers: 4\n  d_state: 512",
    "6:12: model.d_state: 512 is out of range 1..256" },
  { "mamba3 key under mamba1", "  n_layers: 4", "  n_layers: 4\n  headdim: 32",
    "6:3: model.headdim applies to arch mamba3_siso only" },
  { "dt_rank <= d_model", "  n_layers: 4", "  n_layers: 4\n  dt_rank: 200",
    "6:12: model.dt_rank: 200 is out of range 1..128 (d_model)" },
  { "dt_rank bad word", "  n_layers: 4", "  n_layers: 4\n  dt_rank: automatic",
    "6:12: model.dt_rank: expected an integer or auto, got 'automatic'" },
  { "norm_eps > 0", "  n_layers: 4", "  n_layers: 4\n  norm_eps: 0",
    "6:13: model.norm_eps: 0 is out of range; expected a number > 0 and < 1" },
  { ".inf rejected", "  n_layers: 4", "  n_layers: 4\n  norm_eps: .inf",
    "6:13: model.norm_eps: expected a finite number, got .inf" },
  { ".nan rejected", "  n_layers: 4", "  n_layers: 4\n  norm_eps: .nan",
    "6:13: model.norm_eps: expected a finite number, got .nan" },
  { "number expected", "  n_layers: 4", "  n_layers: 4\n  norm_eps: small",
    "6:13: model.norm_eps: expected a number, got 'small'" },
  { "duplicate key (defence in depth)", "  n_layers: 4", "  n_layers: 4\n  n_layers: 5",
    "6:3: duplicate key 'model.n_layers' (first at line 5)" },
  { "upper-case name", "name: m", "name: M1",
    "1:7: name: 'M1' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "name starting with a digit", "name: m", "name: 1m",
    "1:7: name: '1m' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "C keyword name", "name: m", "name: int",
    "1:7: name: 'int' is a C keyword; choose another name" },
  { "mg_ prefix", "name: m", "name: mg_model",
    "1:7: name: 'mg_model' would clash with the runtime's mg_ symbols; choose a name that is not mg or mg_*" },
  { "name too long", "name: m", "name: " .. string.rep("a", 49),
    "1:7: name: '" .. string.rep("a", 49) .. "' is 49 characters long; at most 48 are allowed" },
  { "bad arch", "arch: mamba1", "arch: mamba2",
    "2:7: arch: 'mamba2' is not one of the architectures mamba-gen supports: mamba1, mamba3_siso" },
  { "bad precision", "name: m", "name: m\nprecision: fp32",
    "2:12: precision: 'fp32' is not valid; expected one of f32, bf16, f16; did you mean 'f32'?" },
  { "allow_tf32 with bf16", "name: m", "name: m\nprecision: bf16\nallow_tf32: true",
    "3:13: allow_tf32: true needs precision: f32 (precision is bf16, whose GEMMs already run on tensor cores)" },
  { "allow_tf32 not a bool", "name: m", "name: m\nallow_tf32: yes please",
    "2:13: allow_tf32: expected true or false, got 'yes please'" },
  { "bad target", "name: m", "name: m\ntarget: sm_75",
    "2:9: target: 'sm_75' is not one of the targets mamba-gen supports: sm_80, sm_86, sm_89, sm_90, sm_100, sm_120" },
  { "target sm_99: the list, no near miss", "name: m", "name: m\ntarget: sm_99",
    "2:9: target: 'sm_99' is not one of the targets mamba-gen supports: sm_80, sm_86, sm_89, sm_90, sm_100, sm_120" },
  { "yes rejected with a hint", "name: m", "name: m\nemit:\n  training: yes",
    "3:13: emit.training: expected true or false, got 'yes' (YAML 1.2 reads yes/no/on/off as strings; write true or false)" },
  { "quoted true rejected", "name: m", "name: m\nemit:\n  training: \"true\"",
    '3:13: emit.training: expected true or false, got the string "true" (quoted values are strings; remove the quotes)' },
  { "chunk_size set", "name: m", "name: m\nscan:\n  chunk_size: 48",
    "3:15: scan.chunk_size: 48 is not valid; expected one of 16, 32, 64, 128, 256, or auto" },
  { "scan.mode", "name: m", "name: m\nscan:\n  mode: parallel",
    "3:9: scan.mode: 'parallel' is not valid; expected one of sequential, chunked, auto" },
  { "shapes.batch removed", "  max_seq_len: 256", "  max_seq_len: 256\n  batch: 8",
    "9:3: shapes.batch is no longer a spec key: the batch is given at run time by every call; use shapes.max_batch to bound it" },
  { "shapes.seq_len removed", "  max_seq_len: 256", "  max_seq_len: 256\n  seq_len: 256",
    "9:3: shapes.seq_len is no longer a spec key: the sequence length is given at run time by every call; use shapes.max_seq_len to bound it" },
  { "max_batch range", "  max_batch: 8", "  max_batch: 0",
    "7:14: shapes.max_batch: 0 is out of range 1..65535" },
  { "max_batch is a grid dimension", "  max_batch: 8", "  max_batch: 65536",
    "7:14: shapes.max_batch: 65536 is out of range 1..65535" },
  { "huge int", "  max_batch: 8", "  max_batch: 99999999999999999999",
    "7:14: shapes.max_batch: 99999999999999999999 is out of range 1..65535" },
  { "32-bit indices: tokens x widest row", "  max_batch: 8", "  max_batch: 16384",
    "9:16: shapes.max_seq_len: max_batch*max_seq_len*W = 16384*256*512 = 2147483648 does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648; W = 512 is the widest row of a token); lower max_batch or max_seq_len",
    base = edit(BASE_M1, "  d_model: 128", "  d_model: 256\n  expand: 1") },
  { "32-bit indices: input_dim counts when wider", "  max_seq_len: 256", "  max_seq_len: 65536",
    "9:16: shapes.max_seq_len: max_batch*max_seq_len*W = 8*65536*65536 = 34359738368 does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648; W = 65536 is the widest row of a token); lower max_batch or max_seq_len",
    base = edit(BASE_M1, "  n_layers: 4", "  n_layers: 4\n  input_dim: 65536") },
  { "32-bit indices: states", "  max_batch: 8", "  max_batch: 65535",
    "8:14: shapes.max_batch: max_batch*d_inner*d_state = 65535*16384*256 = 274873712640 does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648); lower max_batch",
    base = edit(edit(BASE_M1, "  d_model: 128", "  d_model: 8192\n  d_state: 256"), "  max_seq_len: 256", "  max_seq_len: 1") },
  { "name starting with '_'", "name: m", "name: _",
    "1:7: name: '_' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "name _x", "name: m", "name: _x",
    "1:7: name: '_x' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "name ending in '_'", "name: m", "name: m_",
    "1:7: name: 'm_' contains '__' or ends with '_': the emitted symbols (m__create, ...) would contain '__', which C++ reserves; choose another name" },
  { "libc header name", "name: m", "name: stdint",
    "1:7: name: 'stdint' cannot be used: its header stdint.h would shadow the system header <stdint.h> (the package compiles with -I.); choose another name" },
  { "CUDA header name", "name: m", "name: cuda_bf16",
    "1:7: name: 'cuda_bf16' cannot be used: its header cuda_bf16.h would shadow the system header <cuda_bf16.h> (the package compiles with -I.); choose another name" },
  { "POSIX header name", "name: m", "name: pthread",
    "1:7: name: 'pthread' cannot be used: its header pthread.h would shadow the system header <pthread.h> (the package compiles with -I.); choose another name" },
  { "the package's own file", "name: m", "name: model_alias",
    "1:7: name: 'model_alias' cannot be used: its file model_alias.h would collide with the package's own model_alias.h; choose another name" },
  { "the package's own file (bench_util)", "name: m", "name: bench_util",
    "1:7: name: 'bench_util' cannot be used: its file bench_util.h would collide with the package's own bench_util.h; choose another name" },
  { "norm_eps as a float: zero", "  n_layers: 4", "  n_layers: 4\n  norm_eps: 1e-50",
    "6:13: model.norm_eps: 1e-50 is too small for a C float (it would be stored as 0); the smallest accepted value is 1.1754944e-38" },
  { "norm_eps as a float: subnormal", "  n_layers: 4", "  n_layers: 4\n  norm_eps: 1e-40",
    "6:13: model.norm_eps: 1e-40 is too small for a C float (it would be stored as a subnormal); the smallest accepted value is 1.1754944e-38" },
  { "control characters are escaped", "name: m", 'name: "a\27[2J\tb\0c"',
    "1:7: name: 'a\\x1b[2J\\tb\\0c' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "long text is cut", "name: m", "name: " .. string.rep("A", 100),
    "1:7: name: '" .. string.rep("A", 64) .. "...' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter" },
  { "sequence where a mapping is needed", "model:\n  d_model: 128\n  n_layers: 4\n", "model: [1, 2]\n",
    "3:8: model: expected a mapping of keys (d_model, n_layers, d_state, expand, d_conv, dt_rank, input_dim, norm_eps), got a sequence" },
  { "empty value where a mapping is needed", "model:\n  d_model: 128\n  n_layers: 4\n", "model:\n",
    "3:7: model: expected a mapping of keys (d_model, n_layers, d_state, expand, d_conv, dt_rank, input_dim, norm_eps), got an empty value (null)" },
  { "sequence where a scalar is needed", "  d_model: 128", "  d_model: [128]",
    "4:12: model.d_model: expected an integer, got a sequence" },
  { "null value", "  d_model: 128", "  d_model:",
    "4:11: model.d_model: expected an integer, got an empty value (null)" },
})
errors_are("- a\n- b\n", { "1:1: the spec must be a mapping of keys (name: ..., arch: ..., model: ...), got a sequence" },
  "root not a mapping")
errors_are("hello\n", { "1:1: the spec must be a mapping of keys (name: ..., arch: ..., model: ...), got 'hello'" },
  "root scalar")

-- All errors, in position order
errors_are([[
name: Bad
arch: mamba1
model:
  d_model: 100
  n_layers: 0
  d_sate: 16
  headdim: 64
precision: fp64
shapes:
  max_batch: 8
]], {
  "1:7: name: 'Bad' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter",
  "4:12: model.d_model: 100 is not a multiple of 8 (rows are read as 16-byte vectors)",
  "5:13: model.n_layers: 0 is out of range 1..256",
  "6:3: unknown key 'd_sate' in model; did you mean 'd_state'?",
  "7:3: model.headdim applies to arch mamba3_siso only",
  "8:12: precision: 'fp64' is not valid; expected one of f32, bf16, f16",
  "10:3: missing required key 'shapes.max_seq_len'",
}, "every error is reported, sorted by position")

-- Mamba-3 rules
local BASE_M3 = edit(BASE_M1, "arch: mamba1", "arch: mamba3_siso")
edit_errors(BASE_M3, {
  { "headdim set", "  n_layers: 4", "  n_layers: 4\n  headdim: 48",
    "6:12: model.headdim: 48 is not valid; expected one of 16, 32, 64, 128" },
  { "headdim (default) must divide d_inner", "  d_model: 128", "  d_model: 8",
    "4:3: model.headdim: 64 does not divide d_inner = 16 (expand*d_model) (the default; set model.headdim explicitly)" },
  { "duplicate", "  n_layers: 4", "  n_layers: 4\n  headdim: 128\n  expand: 1\n  d_model: 64",
    "8:3: duplicate key 'model.d_model' (first at line 4)" },
  { "d_model checked for mamba3", "  n_layers: 4", "  n_layers: 4\n  headdim: 16",
    "4:12: model.d_model: 204 is not a multiple of 8 (rows are read as 16-byte vectors)",
    base = edit(BASE_M3, "  d_model: 128", "  d_model: 204") },
  { "headdim must divide d_inner", "  n_layers: 4", "  n_layers: 4\n  headdim: 128\n  expand: 1",
    "6:12: model.headdim: 128 does not divide d_inner = 192 (expand*d_model)",
    base = edit(BASE_M3, "  d_model: 128", "  d_model: 192") },
  { "ngroups divides nheads", "  n_layers: 4", "  n_layers: 4\n  headdim: 32\n  ngroups: 3",
    "7:12: model.ngroups: 3 does not divide nheads = 8 (expand*d_model/headdim)" },
  { "mamba3 d_state set", "  n_layers: 4", "  n_layers: 4\n  d_state: 24",
    "6:12: model.d_state: 24 is not valid; expected one of 16, 32, 64, 128, 256" },
  { "rope_fraction set", "  n_layers: 4", "  n_layers: 4\n  rope_fraction: 0.25",
    "6:18: model.rope_fraction: 0.25 is not valid; expected one of 0.5, 1.0" },
  { "a_floor > 0", "  n_layers: 4", "  n_layers: 4\n  a_floor: -1.0e-4",
    "6:12: model.a_floor: -1.0e-4 is out of range; expected a number > 0" },
  { "a_floor beyond the float range", "  n_layers: 4", "  n_layers: 4\n  a_floor: 1e39",
    "6:12: model.a_floor: 1e39 is out of the float range (a C float is at most 3.4028235e+38 in magnitude)" },
  { "a_floor that would be 0 as a float", "  n_layers: 4", "  n_layers: 4\n  a_floor: 1e-46",
    "6:12: model.a_floor: 1e-46 is too small for a C float (it would be stored as 0); the smallest accepted value is 1.1754944e-38" },
  { "32-bit indices: mamba3_siso in_proj width", "  max_batch: 8", "  max_batch: 10331",
    "8:16: shapes.max_seq_len: max_batch*max_seq_len*W = 10331*256*812 = 2147525632 does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648; W = 812 is the widest row of a token); lower max_batch or max_seq_len",
  },
  { "a_activation", "  n_layers: 4", "  n_layers: 4\n  a_activation: relu",
    "6:17: model.a_activation: 'relu' is not valid; expected one of heavy_tail, softplus" },
  { "mamba1 key under mamba3", "  n_layers: 4", "  n_layers: 4\n  d_conv: 4",
    "6:3: model.d_conv applies to arch mamba1 only" },
})
local ok3 = run(edit(BASE_M3, "  n_layers: 4", "  n_layers: 4\n  rope_fraction: 1\n  d_state: 16\n  headdim: 16\n  ngroups: 4"))
check(ok3 ~= nil and ok3.model.rope_fraction == 1.0 and math.type(ok3.model.rope_fraction) == "float",
  "rope_fraction 1 (an int) accepted as 1.0")

-- The smallest accepted float and the largest are accepted
local okf = run(edit(BASE_M3, "  n_layers: 4", "  n_layers: 4\n  a_floor: 3.4028235e38\n  norm_eps: 1.1754944e-38"))
check(okf ~= nil, "a_floor 3.4028235e38 and norm_eps 1.1754944e-38 (float limits) are accepted")
local okb = run(edit(BASE_M1, "  max_batch: 8", "  max_batch: 65535"))
check(okb == nil, "max_batch 65535 x max_seq_len 256 x 512 is over 2^31")
okb = run(edit(edit(BASE_M1, "  max_batch: 8", "  max_batch: 65535"), "  max_seq_len: 256", "  max_seq_len: 64"))
check(okb ~= nil, "max_batch 65535 with max_seq_len 64 fits (65535*64*512 < 2^31)")
okb = run(edit(BASE_M3, "  max_batch: 8", "  max_batch: 10330"))
check(okb ~= nil, "mamba3_siso: max_batch 10330 fits (10330*256*812 < 2^31)")

-- Quoting user text in messages (same rules as sy_escape in gen/spec_yaml.c)
is(validate.text("a\nb"), "a\\nb", "text: newline escaped")
is(validate.text("\0\t\r\\"), "\\0\\t\\r\\\\", "text: NUL, tab, CR, backslash")
is(validate.text("\27[31m"), "\\x1b[31m", "text: ESC as \\x1b")
is(validate.text("\xc2\x85x"), "\\u0085x", "text: C1 control as \\u0085")
is(validate.text("\xe2\x80\xaeab"), "\\u202Eab", "text: bidi override")
is(validate.text("\xff"), "\\xff", "text: a byte that is not UTF-8")
is(validate.text("caf\xc3\xa9"), "caf\xc3\xa9", "text: printable UTF-8 kept")
is(validate.text(string.rep("\xc3\xa9", 70)), string.rep("\xc3\xa9", 64) .. "...", "text: 64 characters, then ...")

-- At most V.MAX_ERRORS errors, then "too many errors, stopping"
local many = { "name: m" }
for k = 1, 100 do many[#many + 1] = "k" .. k .. ": 1" end
local _, merrs = run(table.concat(many, "\n") .. "\n")
is(#merrs, validate.MAX_ERRORS + 1, "errors stop after MAX_ERRORS")
is(merrs[#merrs], "22:1: too many errors (more than 20), stopping", "... with a last line saying so")

-- Schema sanity: every entry has a doc line and a known type
local types = { identifier = true, enum = true, int = true, number = true, bool = true, map = true }
local function walk(entries, prefix)
  for _, e in ipairs(entries) do
    check(type(e.doc) == "string" and #e.doc > 10 and not e.doc:find("\n"), "doc line for " .. prefix .. e.key)
    check(types[e.type], "known type for " .. prefix .. e.key)
    if e.keys then walk(e.keys, prefix .. e.key .. ".") end
  end
end
walk(schema.keys, "")
for _, r in ipairs(schema.rules) do check(type(r.doc) == "string", "doc line for rule " .. r.doc) end

return T.done()
