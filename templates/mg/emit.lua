-- mg/emit.lua: which templates make which files, and the template
-- environment (doc/HACKING.md "Template environment").
--
-- files(spec, d, args, pos) -> list of {path=, content=, template=} in a fixed
-- order. args supplies spec_name and spec_hash for the provenance line; pos
-- (from validate) positions spec errors.

local tmpl = require("mg.tmpl")
local validate = require("mg.validate")

local E = {}

-- The file set: one list for every arch, in the order of the output. An
-- entry: output path pattern (NAME = spec.name), template, comment prefix of
-- the provenance line ("//" unless given), `when = "training"` for the
-- training half (spec.emit.training only). An entry with `copy` instead of
-- `template` names a plain source file under the template root (kernel
-- bodies in templates/kernels/, host programs in templates/host/): it is
-- emitted as it is, under the provenance line, with no substitution.
-- {dir} in a source stands for the arch's template directory and {k} in a
-- path for the prefix of its plain headers (E.ARCHES); a group
-- `{ arch = ..., entry, ... }` holds entries of that arch only (one
-- without arch, such as bodies(), entries of every arch).
E.ARCHES = {
  mamba1 = { dir = "mamba1", k = "m1" },
  mamba3_siso = { dir = "mamba3", k = "m3" },
}

-- A group of the arch's plain kernel headers, in the order named (NAME ...,
-- space-separated): kernels/{dir}/NAME copied as mg_{k}_NAME.
local function bodies(names)
  local group = {}
  for n in names:gmatch("%S+") do
    group[#group + 1] = { path = "mg_{k}_" .. n, copy = "kernels/{dir}/" .. n }
  end
  return group
end

E.FILES = {
  { path = "%s.h",          template = "{dir}/model.h.tmpl" },
  { path = "%s_common.cuh", template = "{dir}/common.cuh.tmpl" },
  { path = "mg_dtype.cuh",  copy = "kernels/common/dtype.cuh" },   -- included by NAME_common.cuh
  { arch = "mamba1",   -- the kernels, then the kernel bodies they include (plain CUDA, one header per phase)
    { path = "%s_kernels.cu",        template = "mamba1/kernels.cu.tmpl" },
    { path = "mg_warp_sums.cuh", copy = "kernels/common/warp_sums.cuh" },   -- also the Mamba-3 scan backward's
    bodies("starts.cuh util.cuh conv.cuh conv_xproj.cuh scan_body.cuh scan_fwd.cuh decode.cuh launch.cuh launch.h"),
  },
  { arch = "mamba3_siso",   -- the kernel bodies (templates/kernels/mamba3/), then the kernels that include them
    bodies("prep.cuh angles.cuh scan.cuh tiles.cuh chunked_body.cuh chunked_fwd.cuh gate.cuh chunked_fused.cuh"
        .. " decode.cuh launch_fwd.cuh launch_decode.cuh launch.h"),
    { path = "mg_pdl.cuh", copy = "kernels/common/pdl.cuh" },   -- the decode kernels' chained launches
    { path = "%s_kernels.cu",          template = "mamba3/kernels.cu.tmpl" },
  },
  -- the inference kernels every arch shares (templates/kernels/common/)
  { path = "mg_rms_row.cuh", copy = "kernels/common/rms_row.cuh" },
  { path = "mg_norm.cuh",    copy = "kernels/common/norm.cuh" },
  { path = "mg_convert.cuh", copy = "kernels/common/convert.cuh" },
  { path = "mg_launch_norm.cuh",    copy = "kernels/common/launch_norm.cuh" },
  { path = "mg_launch_convert.cuh", copy = "kernels/common/launch_convert.cuh" },
  { path = "mg_packed.cuh",         copy = "kernels/common/packed.cuh" },
  { path = "mg_launch_packed.cuh",  copy = "kernels/common/launch_packed.cuh" },
  { path = "%s.c",              template = "{dir}/model.c.tmpl" },
  { path = "mg_{k}_pipeline.h", copy = "host/{dir}/pipeline.h" },
  { path = "mg_model_host.h",  copy = "host/common/model_host.h" },
  { path = "mg_packed_host.h", copy = "host/common/packed_host.h" },
  -- the test and bench programs (plain C; model_alias.h names the model)
  { path = "model_alias.h", template = "common/model_alias.h.tmpl" },
  { path = "%s_test.c",     copy = "host/{dir}/test.c" },
  { path = "fwd_tests.h",   copy = "host/common/fwd_tests.h" },
  { path = "%s_bench.c",    copy = "host/{dir}/bench.c" },
  { path = "bench_util.h",  copy = "host/common/bench_util.h" },
  -- training half (spec.emit.training only)
  { path = "%s_train.h", template = "{dir}/train.h.tmpl", when = "training" },
  { arch = "mamba1", when = "training",
    { path = "%s_backward.cu",         template = "mamba1/backward.cu.tmpl" },
    bodies("train_norm.cuh train_conv.cuh scan_bwd.cuh launch_train.cuh launch_train.h"),
    { path = "mg_block_sum.cuh",       copy = "kernels/common/block_sum.cuh" },
    { path = "mg_red_jobs.cuh",        copy = "kernels/common/red_jobs.cuh" },
  },
  { arch = "mamba3_siso", when = "training",
    bodies("prep_rot.cuh angles_bwd.cuh"),
    { path = "mg_block_sum.cuh",       copy = "kernels/common/block_sum.cuh" },
    { path = "mg_warp_sums.cuh",       copy = "kernels/common/warp_sums.cuh" },   -- the scan backward's column sums
    bodies("train_util.cuh train_fwd.cuh norm_bwd.cuh gate_bwd.cuh scan_bwd.cuh chunked_bwd.cuh prep_bwd.cuh"
        .. " launch_train.cuh launch_train.h"),
    { path = "%s_backward.cu",         template = "mamba3/backward.cu.tmpl" },
  },
  -- the training kernels every arch shares (templates/kernels/common/, train_optim parts)
  { path = "mg_train_norm.cuh", copy = "kernels/common/train_norm.cuh", when = "training" },
  { path = "mg_adamw.cuh",     copy = "kernels/common/adamw.cuh",     when = "training" },
  { path = "mg_launch_train_norm.cuh", copy = "kernels/common/launch_train_norm.cuh", when = "training" },
  { path = "mg_grad_norm.cuh", copy = "kernels/common/grad_norm.cuh", when = "training" },
  { path = "mg_loss.cuh",      copy = "kernels/common/loss.cuh",      when = "training" },
  { path = "mg_grad_accum.cuh", copy = "kernels/common/grad_accum.cuh", when = "training" },
  { path = "%s_train.c",       template = "{dir}/train.c.tmpl",       when = "training" },
  { path = "mg_{k}_train_pipeline.h", copy = "host/{dir}/train_pipeline.h", when = "training" },
  { path = "mg_train_host.h",  copy = "host/common/train_host.h",     when = "training" },
  { path = "%s_train_test.c",  copy = "host/{dir}/train_test.c",      when = "training" },
  { path = "train_tests.h",    copy = "host/common/train_tests.h",    when = "training" },
  { path = "%s_nccl.c",        copy = "host/common/nccl_train.c",     when = "training" },
  -- packaging: pkg-config and CMake files, completed by `make install`
  { path = "%s.pc.in",                 template = "common/pkgconfig.pc.tmpl",              prefix = "#" },
  { path = "%sConfig.cmake.in",        template = "common/cmake_config.cmake.tmpl",        prefix = "#" },
  { path = "%sConfigVersion.cmake",    template = "common/cmake_config_version.cmake.tmpl", prefix = "#" },
  { path = "Makefile",         template = "common/Makefile.tmpl", prefix = "#" },
  -- the PyTorch module (ctypes over libNAME.so; the code is python/torch_module.py)
  { path = "%s.py",            template = "common/torch_module.py.tmpl", prefix = "#" },
}

-- A C float literal for x that reads back to exactly float(x): the shortest
-- %.Ng (N <= 9) of the float-rounded value that round-trips through float,
-- with a '.' or an exponent, and an 'f' suffix. Non-finite or out of float
-- range is an error.
local function to_float(x) return (string.unpack("<f", string.pack("<f", x))) end

function E.f32(x)
  if type(x) ~= "number" then error("f32(): expected a number, got " .. type(x), 2) end
  local f = to_float(x + 0.0)
  if f ~= f or f == math.huge or f == -math.huge then
    error("f32(): " .. tostring(x) .. " is not a finite float", 2)
  end
  local s
  for p = 1, 9 do
    s = string.format("%." .. p .. "g", f)
    if to_float(tonumber(s)) == f then break end
  end
  if not s:find("[.e]") then s = s .. ".0" end
  return s .. "f"
end

-- A decimal integer string (integers, or floats with an integral value).
function E.int(x)
  local i = math.tointeger(x)
  if not i then error("int(): " .. tostring(x) .. " is not an integer", 2) end
  return string.format("%d", i)
end

-- The generated library's own version {major, minor, patch, text = "x.y.z"}:
-- the spec schema has no version key, so every library is 0.1.0 (its
-- generator's version is NAME_GENERATOR_VERSION, its spec's hash
-- NAME_SPEC_SHA256).
E.LIB_VERSION = { 0, 1, 0 }

function E.lib_version(spec)
  local v = E.LIB_VERSION
  return { major = v[1], minor = v[2], patch = v[3], text = string.format("%d.%d.%d", v[1], v[2], v[3]) }
end

function E.provenance_line(version, spec_name, spec_hash, template, prefix)
  return string.format("%s Code generated by mamba-gen %s from %s (sha256 %s) with template %s. DO NOT EDIT.",
    prefix, version, spec_name, spec_hash:sub(1, 16), template)
end

function E.env(spec, d, args, template)
  local version = (mg and mg.version) or "?"
  local env
  env = {
    -- include(path[, vars]): the fragment template `path` rendered with this
    -- environment (plus `vars`), its final newline dropped, so that
    -- `{{ include(...) }}` on a line of its own adds the fragment's lines.
    -- Fragments hold code that more than one arch emits word for word.
    include = function(path, vars)
      local fenv = setmetatable(vars or {}, { __index = env })
      return (tmpl.render(path, fenv):gsub("\n$", ""))
    end,
    -- inline(path): the plain source file `path` (no substitution), its
    -- final newline dropped: for sources that must be one translation unit
    -- (the tune candidates NVRTC compiles).
    inline = function(path) return (E.plain(path):gsub("\n$", "")) end,
    spec = spec,
    d = d,
    name = spec.name,
    NAME = spec.name:upper(),
    provenance = function(prefix)
      return E.provenance_line(version, args.spec_name or "?", args.spec_hash or "", template, prefix or "//")
    end,
    f32 = E.f32,
    int = E.int,
    -- the versions and the spec's hash in the generated library (NAME.h
    -- macros, the Makefile's SONAME, NAME.pc, the CMake package)
    lib_version = E.lib_version(spec),
    generator_version = version,
    spec_hash = args.spec_hash or "",
  }
  return env
end

-- The text of a plain source file of the template root (an error names it
-- when it is missing).
function E.plain(path)
  local text, err = mg.read(path)
  if not text then error("plain source " .. path .. ": " .. tostring(err), 0) end
  return text
end

-- The entries of E.FILES this spec emits, in order, with {dir} and {k}
-- filled in: {path=, template= or copy=, prefix=}.
function E.entries(spec, arch)
  local list = {}
  local function walk(entries, when)
    for _, f in ipairs(entries) do
      -- `when = "training"`: emitted only when spec.emit.training is true
      local w = f.when or when
      if w and not spec.emit[w] then
        -- not emitted
      elseif f.path then
        list[#list + 1] = {
          path = f.path:gsub("{k}", arch.k),
          template = f.template and f.template:gsub("{dir}", arch.dir),
          copy = f.copy and f.copy:gsub("{dir}", arch.dir),
          prefix = f.prefix or "//",
        }
      elseif f.arch == nil or f.arch == spec.arch then   -- a group
        walk(f, w)
      end
    end
  end
  walk(E.FILES)
  return list
end

function E.files(spec, d, args, pos)
  local arch = E.ARCHES[spec.arch]
  if not arch then
    validate.spec_error(pos, "arch",
      "arch " .. spec.arch .. ": code generation is not available yet in this version")
  end
  local out = {}
  for _, f in ipairs(E.entries(spec, arch)) do
    local src = f.template or f.copy
    local env = E.env(spec, d, args, src)
    local content
    if f.copy then
      content = env.provenance(f.prefix) .. "\n" .. E.plain(f.copy)
    else
      content = tmpl.render(f.template, env)
      local first = content:match("^[^\n]*")
      if first ~= env.provenance(f.prefix) then
        error(string.format("template:%s:1: the first line must be {{ provenance(%q) }}", f.template, f.prefix), 0)
      end
    end
    out[#out + 1] = { path = string.format(f.path, spec.name), content = content, template = src }
  end
  return out
end

return E
