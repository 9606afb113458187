-- mg/schema.lua: the spec schema as data.
--
-- This table is the single source of truth for the public spec format: the
-- validator (mg/validate.lua) walks it, --print-spec (mg/yaml_out.lua) prints
-- keys in its order, and the README's spec reference is generated from / checked
-- against the `doc` strings. Keep every doc string one line, user-facing.
--
-- A key entry:
--   key       the YAML key
--   type      "identifier" | "enum" | "int" | "number" | "bool" | "map"
--   values    enum: allowed strings; int/number: allowed values (a set)
--   list_values  enum: what the values are ("targets"); a bad value is
--             answered with the whole list, never with a "did you mean" (the
--             values are names, not spellings: sm_99 is no typo of sm_90,
--             mamba2 none of mamba1)
--   auto      true: the string `auto` is also accepted (kept as "auto")
--   min, max  inclusive range (int/number); for numbers `gt`/`lt` are strict
--   pow2      int must be a power of two
--   multiple_of  int must be a multiple of this
--   required  true: must be present
--   default   value when absent (or default_by_arch = {arch = value})
--   archs     list of archs the key applies to (absent: all archs)
--   by_arch   per-arch overrides of the constraint fields {arch = {...}}
--   keys      for type "map": the child keys, in order
--   doc       one-line description
-- Cross-key rules (divisibility, bounds that depend on other keys) are in
-- M.rules, each with a doc line and a check function over the canonical spec.

local M = {}

M.archs = { "mamba1", "mamba3_siso" }

-- C keywords (C11 plus common extensions and C++ keywords that break headers
-- included from C++), refused as model names since every emitted symbol and
-- file starts with the name.
M.c_keywords = {}
for w in ([[auto break case char const continue default do double else enum
  extern float for goto if inline int long register restrict return short
  signed sizeof static struct switch typedef union unsigned void volatile
  while _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary
  _Noreturn _Static_assert _Thread_local asm typeof bool true false class
  delete new namespace template this throw try catch private public
  protected virtual operator friend using typename nullptr]]):gmatch("%S+") do
  M.c_keywords[w] = true
end

M.name_max_len = 48

-- Header basenames (without .h) a model name must not give to one of its
-- package's headers (NAME.h, NAME_train.h, ...): the package compiles with
-- -I., so NAME.h would shadow the system's <NAME.h> for every file of the
-- package, CUDA's and libc's own headers included. C11 and POSIX headers,
-- common glibc ones, and CUDA's (also every name with a prefix of
-- M.system_header_prefixes). Names that collide with the package's own
-- fixed file names (model_alias.h, ...) are found from mg/emit.lua's file
-- list (validate.lua).
M.system_headers = {}
for w in ([[assert complex ctype errno fenv float inttypes iso646 limits locale
  math setjmp signal stdalign stdarg stdatomic stdbool stddef stdint stdio
  stdlib stdnoreturn string tgmath threads time uchar wchar wctype
  aio cpio dirent dlfcn fcntl fmtmsg fnmatch ftw glob grp iconv langinfo
  libgen monetary mqueue ndbm netdb nl_types poll pthread pwd regex sched
  search semaphore spawn strings stropts syslog tar termios trace ulimit
  unistd utime utmp utmpx wordexp
  alloca byteswap elf endian err error execinfo features getopt link malloc
  memory paths sgtty shadow stab sysexits ttyent values xlocale argp argz
  envz fstab gnu_versions lastlog libintl mcheck mntent obstack printf
  pty resolv gshadow ifaddrs
  builtin_types channel_descriptor common_functions cooperative_groups
  device_atomic_functions device_functions device_launch_parameters
  device_types driver_functions driver_types host_config host_defines
  library_types math_constants math_functions sm_20_atomic_functions
  surface_types texture_types vector_functions vector_types nvtx3
  crt cub thrust nv cuda nvrtc nvml omp]]):gmatch("%S+") do
  M.system_headers[w] = true
end
M.system_header_prefixes = { "cuda", "cublas", "cufft", "curand", "cusparse", "cusolver", "cudnn",
  "nvrtc", "nvtx", "nvjitlink", "nvml", "sm_" }

-- Keys that were part of the spec format once and are refused now, with
-- what to write instead (validate.lua reports them by name).
M.removed = {
  ["shapes.batch"] = "the batch is given at run time by every call; use shapes.max_batch to bound it",
  ["shapes.seq_len"] = "the sequence length is given at run time by every call; use shapes.max_seq_len to bound it",
}

-- The largest flat index a kernel may compute in 32-bit int (the rule
-- "32-bit kernel indices" below keeps every buffer under it).
M.INDEX_LIMIT = 2 ^ 31

M.keys = {
  { key = "name", type = "identifier", required = true,
    doc = "model name: a C identifier [a-z][a-z0-9_]*, at most 48 characters, no '__', not ending in '_', not a C keyword, not mg or mg_*, not the name of a C, POSIX or CUDA header (NAME.h would shadow it); prefix of every emitted symbol and file" },
  { key = "arch", type = "enum", values = { "mamba1", "mamba3_siso" }, required = true, list_values = "architectures",
    doc = "architecture: mamba1 (selective SSM, Gu & Dao 2023) or mamba3_siso (Mamba-3 SISO, Lahoti et al. 2026)" },
  { key = "model", type = "map", required = true,
    doc = "model dimensions and options",
    keys = {
      { key = "d_model", type = "int", required = true, min = 1, max = 16384, multiple_of = 8,
        doc = "D, width of the residual stream; a multiple of 8 so rows load as 16-byte vectors in every storage dtype" },
      { key = "n_layers", type = "int", required = true, min = 1, max = 256,
        doc = "number of residual blocks" },
      { key = "d_state", type = "int", default_by_arch = { mamba1 = 16, mamba3_siso = 128 },
        min = 1, max = 256,
        by_arch = { mamba1 = { pow2 = true },
                    mamba3_siso = { values = { 16, 32, 64, 128, 256 } } },
        doc = "N, SSM state size per channel: mamba1 a power of two in 1..256 (default 16), mamba3_siso one of 16, 32, 64, 128, 256 (default 128)" },
      { key = "expand", type = "int", default = 2, min = 1, max = 8,
        doc = "E = expand * d_model, the inner (mixer) width" },
      { key = "d_conv", type = "int", default = 4, min = 2, max = 8, archs = { "mamba1" },
        doc = "K, width of the causal depthwise convolution (mamba1)" },
      { key = "dt_rank", type = "int", auto = true, default = "auto", min = 1, archs = { "mamba1" },
        doc = "R, rank of the dt projection, 1..d_model, or auto = ceil(d_model/16) (mamba1)" },
      { key = "headdim", type = "int", default = 64, values = { 16, 32, 64, 128 }, archs = { "mamba3_siso" },
        doc = "P, head size; nheads = expand*d_model/headdim must be a whole number (mamba3_siso)" },
      { key = "ngroups", type = "int", default = 1, min = 1, max = 256, archs = { "mamba3_siso" },
        doc = "G, number of B/C groups; must divide nheads (mamba3_siso)" },
      { key = "rope_fraction", type = "number", default = 0.5, values = { 0.5, 1.0 }, archs = { "mamba3_siso" },
        doc = "fraction of d_state that is rotated: n_angles = floor(d_state*rope_fraction)/2 (mamba3_siso)" },
      { key = "a_activation", type = "enum", default = "heavy_tail", values = { "heavy_tail", "softplus" },
        archs = { "mamba3_siso" },
        doc = "activation giving -A from dd_A: heavy_tail (current reference) or softplus (earlier form) (mamba3_siso)" },
      { key = "a_floor", type = "number", default = 1.0e-4, gt = 0, archs = { "mamba3_siso" },
        doc = "lower clamp of -A, > 0; a normal C float: 1.1754944e-38 to 3.4028235e+38 (mamba3_siso)" },
      { key = "outproj_norm", type = "bool", default = true, archs = { "mamba3_siso" },
        doc = "gated RMSNorm of y before out_proj; false: y*silu(z) (mamba3_siso)" },
      { key = "input_dim", type = "int", default = 0, min = 0, max = 65536,
        doc = "width of the model input; 0 = identity (the input is already d_model wide), else a Linear input_dim -> d_model with bias" },
      { key = "norm_eps", type = "number", default = 1.0e-5, gt = 0, lt = 1,
        doc = "epsilon of every RMSNorm, 0 < norm_eps < 1; a normal C float: at least 1.1754944e-38" },
    } },
  { key = "precision", type = "enum", default = "f32", values = { "f32", "bf16", "f16" },
    doc = "storage dtype of GEMM operands and activations; states, residual stream and reductions are always f32" },
  { key = "allow_tf32", type = "bool", default = false,
    doc = "precision f32 only: the cuBLAS projection GEMMs (input_proj, in_proj, x_proj, dt_proj, out_proj; forward and backward) run on TF32 tensor cores (inputs rounded to 10 mantissa bits, f32 accumulation); every other kernel stays f32; the library is then checked at f16's tolerances. false (default): f32 means f32" },
  { key = "scan", type = "map",
    doc = "selective scan options",
    keys = {
      { key = "mode", type = "enum", default = "auto", values = { "sequential", "chunked", "auto" },
        doc = "sequential (one pass over time), chunked (parallel over chunks), or auto: mamba1 picks per call (chunked from 2 chunks when batch x scan blocks is under 2 per SM, else sequential; with chunk_size: auto and a tuned cache entry, the crossover mamba-gen tune measured decides at the batches it measured); mamba3_siso is sequential when max_seq_len <= 256, else chunked from max(257, 4 chunks) steps" },
      { key = "chunk_size", type = "int", auto = true, default = 64, values = { 16, 32, 64, 128, 256 },
        doc = "timesteps per chunk of the chunked scan: 16, 32, 64, 128, 256, or auto (autotune cache; 64 until tuned)" },
    } },
  { key = "shapes", type = "map", required = true,
    doc = "bounds of the batch and sequence length every call gives at run time (they size the workspaces)",
    keys = {
      { key = "max_batch", type = "int", required = true, min = 1, max = 65535,
        doc = "largest batch a call may pass (sizes workspaces); at most 65535, a grid dimension of the kernels" },
      { key = "max_seq_len", type = "int", required = true, min = 1, max = 1048576,
        doc = "longest sequence a call may pass (sizes workspaces); max_batch*max_seq_len times the widest row must stay under 2^31 (see the rules)" },
    } },
  { key = "emit", type = "map",
    doc = "what the generated library contains",
    keys = {
      { key = "training", type = "bool", default = true,
        doc = "backward pass, saved activations and optimizer step" },
      { key = "inference", type = "bool", default = true,
        doc = "prefill with state in/out and single-step decode" },
      { key = "deterministic", type = "bool", default = true,
        doc = "no atomics in any reduction: bit-identical results run to run" },
    } },
  { key = "target", type = "enum", default = "sm_90",
    values = { "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120" }, list_values = "targets",
    doc = "CUDA architecture the kernels are compiled for (sm_100, sm_120: CUDA 12.8 or later)" },
}

-- The widest row of a token's activations, in elements: the in_proj output
-- (mamba1 2E; mamba3_siso 2E+2GN+3H+S) or the model input, whichever is
-- wider; and the state of one sequence (E*N for both archs).
function M.widest_row(m, arch)
  local E = m.expand * m.d_model
  local w = 2 * E
  if arch == "mamba3_siso" then
    local H = E // m.headdim
    local S = math.floor(m.d_state * m.rope_fraction) // 2
    w = 2 * E + 2 * m.ngroups * m.d_state + 3 * H + S
  end
  return math.max(w, m.input_dim, m.d_model)
end

-- Cross-key rules. check(spec) returns nil when fine, or (path, message)
-- where path names the key the error is reported at. Rules only run when
-- every key they read passed its own checks (see validate.lua).
M.rules = {
  { archs = { "mamba1" }, reads = { "model.dt_rank", "model.d_model" },
    doc = "model.dt_rank (when not auto) is at most d_model",
    check = function(s)
      local r = s.model.dt_rank
      if r ~= "auto" and r > s.model.d_model then
        return "model.dt_rank", string.format("%d is out of range 1..%d (d_model)", r, s.model.d_model)
      end
    end },
  { archs = { "mamba3_siso" }, reads = { "model.headdim", "model.expand", "model.d_model" },
    doc = "model.headdim divides d_inner = expand*d_model (nheads is a whole number)",
    check = function(s)
      local E = s.model.expand * s.model.d_model
      if E % s.model.headdim ~= 0 then
        return "model.headdim", string.format("%d does not divide d_inner = %d (expand*d_model)", s.model.headdim, E)
      end
    end },
  { archs = { "mamba3_siso" }, reads = { "model.ngroups", "model.headdim", "model.expand", "model.d_model" },
    doc = "model.ngroups divides nheads = expand*d_model/headdim",
    check = function(s)
      local E = s.model.expand * s.model.d_model
      if E % s.model.headdim ~= 0 then return nil end -- reported by the rule above
      local H = E // s.model.headdim
      if H % s.model.ngroups ~= 0 then
        return "model.ngroups", string.format("%d does not divide nheads = %d (expand*d_model/headdim)", s.model.ngroups, H)
      end
    end },
  { archs = { "mamba3_siso" }, reads = { "model.rope_fraction", "model.d_state" },
    doc = "2*n_angles <= d_state, n_angles = floor(d_state*rope_fraction)/2",
    check = function(s)
      local S = math.floor(s.model.d_state * s.model.rope_fraction) // 2
      if 2 * S > s.model.d_state then
        return "model.rope_fraction", string.format("gives 2*n_angles = %d > d_state = %d", 2 * S, s.model.d_state)
      end
    end },
  { reads = { "allow_tf32", "precision" },
    doc = "allow_tf32: true needs precision f32 (bf16 and f16 GEMMs already run on tensor cores)",
    check = function(s)
      if s.allow_tf32 and s.precision ~= "f32" then
        return "allow_tf32", string.format("true needs precision: f32 (precision is %s, whose GEMMs already run on tensor cores)",
                                           s.precision)
      end
    end },
  { reads = { "shapes.max_batch", "shapes.max_seq_len", "model.d_model", "model.expand", "model.d_state",
              "model.input_dim", "model.headdim", "model.ngroups", "model.rope_fraction" },
    doc = "32-bit kernel indices: max_batch * max(max_seq_len * W, d_inner * d_state) < 2^31, W the widest row of a token (the in_proj output: mamba1 2*d_inner, mamba3_siso 2*d_inner + 2*ngroups*d_state + 3*nheads + n_angles; or input_dim when wider)",
    check = function(s)
      local m, sh = s.model, s.shapes
      if s.arch == "mamba3_siso" and (m.expand * m.d_model) % m.headdim ~= 0 then return nil end -- reported above
      local W = M.widest_row(m, s.arch)
      local E = m.expand * m.d_model
      local tok = sh.max_batch * sh.max_seq_len * W
      local st = sh.max_batch * E * m.d_state
      if tok >= M.INDEX_LIMIT then
        return "shapes.max_seq_len", string.format(
          "max_batch*max_seq_len*W = %d*%d*%d = %d does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648; W = %d is the widest row of a token); lower max_batch or max_seq_len",
          sh.max_batch, sh.max_seq_len, W, tok, W)
      end
      if st >= M.INDEX_LIMIT then
        return "shapes.max_batch", string.format(
          "max_batch*d_inner*d_state = %d*%d*%d = %d does not fit the kernels' 32-bit indices (must be < 2^31 = 2147483648); lower max_batch",
          sh.max_batch, E, m.d_state, st)
      end
    end },
}

-- Helpers over the schema.

-- Does entry `e` apply to `arch` (nil arch: unknown, everything applies)?
function M.applies(e, arch)
  if not e.archs or not arch then return true end
  for _, a in ipairs(e.archs) do if a == arch then return true end end
  return false
end

-- Walks the values of a canonical spec (or of one of its sections) in schema
-- order: visit(e, v, path, depth) for every entry of `entries` (default: the
-- whole schema) that applies to `arch` and has a value v; a map entry is
-- visited first, then its keys at depth + 1. path is the dotted key path.
function M.each_value(tbl, arch, visit, entries, prefix, depth)
  entries, prefix, depth = entries or M.keys, prefix or "", depth or 0
  for _, e in ipairs(entries) do
    local v = tbl[e.key]
    if M.applies(e, arch) and v ~= nil then
      visit(e, v, prefix .. e.key, depth)
      if e.type == "map" then M.each_value(v, arch, visit, e.keys, prefix .. e.key .. ".", depth + 1) end
    end
  end
end

-- The constraint field `f` of entry `e` for `arch` (per-arch override first).
function M.field(e, f, arch)
  if arch and e.by_arch and e.by_arch[arch] and e.by_arch[arch][f] ~= nil then
    return e.by_arch[arch][f]
  end
  return e[f]
end

-- The default of entry `e` for `arch`.
function M.default(e, arch)
  if e.default_by_arch then return arch and e.default_by_arch[arch] end
  return e.default
end

return M
