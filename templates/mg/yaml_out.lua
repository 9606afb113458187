-- mg/yaml_out.lua: the --print-spec text. The canonical spec in schema key
-- order (every applicable key, defaults filled), then a `derived:` section:
-- dims, the weights blob table (name, shape, offset, numel) and the launch
-- shapes. Deterministic: only ordered lists are iterated.

local schema = require("mg.schema")

local Y = {}

-- A float as YAML: the shortest %g text that reads back to the same double,
-- always with a '.' or an exponent so it types as a float.
local function float_text(x)
  if x ~= x or x == math.huge or x == -math.huge then
    error("yaml_out: non-finite number")
  end
  local s
  for p = 1, 17 do
    s = string.format("%." .. p .. "g", x)
    if tonumber(s) == x then break end
  end
  if not s:find("[.eEn]") then s = s .. ".0" end
  return s
end
Y.float_text = float_text

local function scalar(v)
  local t = math.type(v)
  if t == "integer" then return string.format("%d", v) end
  if t == "float" then return float_text(v) end
  if type(v) == "boolean" then return v and "true" or "false" end
  if type(v) == "string" then
    -- Our strings are identifiers, enum words, tensor names: plain-safe.
    -- Anything else is quoted.
    if v:match("^[%a_][%w_%.]*$") and v ~= "true" and v ~= "false" and v ~= "null" then return v end
    return string.format("%q", v)
  end
  error("yaml_out: cannot print a " .. type(v))
end

-- The canonical spec, one `key: value` line per key (a section: `key:`,
-- its keys indented below it).
local function spec_lines(out, spec)
  schema.each_value(spec, spec.arch, function(e, v, _, depth)
    local line = string.rep("  ", depth) .. e.key .. ":"
    out[#out + 1] = e.type == "map" and line or line .. " " .. scalar(v)
  end)
end

-- Derived fields printed per arch, in this order (name in d, label).
local SECTIONS = {
  mamba1 = {
    dims = { "D", "E", "N", "K", "R", "L", "XP", "input_dim", "in_dim", "eps",
             "max_batch", "max_seq_len", "max_tokens", "batch", "seq_len",
             "dtype", "act_t", "act_size", "check_tol", "scan_mode_resolved", "chunk_size" },
    launch = { "norm_threads", "norm_iters", "conv_threads", "conv_blocks", "conv_tile",
               "cxp_fuse", "cxp_max_tokens", "scan_lanes", "scan_npt", "scan_threads", "scan_channels",
               "scan_blocks", "scan_tchunk", "scan_smem_bytes", "scan_base_lanes", "scan_base_channels",
               "scan_base_blocks", "scan_auto_prefill_blocks" },
  },
  mamba3_siso = {
    dims = { "D", "E", "N", "P", "H", "G", "S", "L", "in_proj_out", "input_dim", "in_dim",
             "eps", "a_floor", "max_batch", "max_seq_len", "max_tokens", "batch", "seq_len",
             "dtype", "act_t", "act_size", "scan_mode_resolved", "chunk_size" },
    launch = {},
  },
}

function Y.render(spec, d)
  local out = {}
  spec_lines(out, spec)
  out[#out + 1] = "derived:"
  local sec = SECTIONS[spec.arch]
  out[#out + 1] = "  dims:"
  for _, k in ipairs(sec.dims) do
    if d[k] ~= nil then out[#out + 1] = "    " .. k .. ": " .. scalar(d[k]) end
  end
  out[#out + 1] = "  weights_total: " .. scalar(d.weights_total)
  out[#out + 1] = "  layer_stride: " .. scalar(d.layer_stride)
  out[#out + 1] = "  params:"
  for _, p in ipairs(d.params) do
    local dims = {}
    for i, s in ipairs(p.shape) do dims[i] = string.format("%d", s) end
    out[#out + 1] = string.format("    - {name: %s, shape: [%s], offset: %d, numel: %d}",
      p.name, table.concat(dims, ", "), p.offset, p.numel)
  end
  if #sec.launch > 0 then
    out[#out + 1] = "  launch:"
    for _, k in ipairs(sec.launch) do
      out[#out + 1] = "    " .. k .. ": " .. scalar(d[k])
    end
  end
  return table.concat(out, "\n") .. "\n"
end

return Y
