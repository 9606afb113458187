-- mg/spec_doc.lua: the spec reference (Markdown) generated from mg/schema.lua,
-- printed by `mamba-gen --spec-reference`. The README embeds this text and a
-- test checks that it is still verbatim there, so the documented format and
-- the validator cannot drift apart.

local schema = require("mg.schema")
local yaml_out = require("mg.yaml_out")

local M = {}

local function value_text(v)
  if type(v) == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    return yaml_out.float_text(v)
  end
  return tostring(v)
end

local function list_text(vs)
  local t = {}
  for i, v in ipairs(vs) do t[i] = value_text(v) end
  return table.concat(t, ", ")
end

-- "valid" column: what a value may be (type, set, range, extra rules).
local function valid_text(e)
  local parts = {}
  local function add(arch_label, src)
    local vals = src.values
    local s
    if e.type == "enum" then s = list_text(vals)
    elseif e.type == "identifier" then s = "C identifier"
    elseif e.type == "bool" then s = "true, false"
    elseif e.type == "map" then s = "mapping"
    else
      if vals then s = list_text(vals)
      else
        local lo = src.min or (src.gt and ("> " .. value_text(src.gt)))
        local hi = src.max or (src.lt and ("< " .. value_text(src.lt)))
        if src.min and src.max then s = value_text(src.min) .. ".." .. value_text(src.max)
        elseif lo and hi then s = tostring(lo) .. ", " .. tostring(hi)
        elseif lo then s = src.min and (">= " .. value_text(src.min)) or lo
        elseif hi then s = src.max and ("<= " .. value_text(src.max)) or hi
        else s = e.type end
      end
      if src.pow2 then s = s .. ", power of two" end
      if src.multiple_of then s = s .. ", multiple of " .. src.multiple_of end
    end
    if e.auto then s = s .. ", or auto" end
    parts[#parts + 1] = arch_label and (arch_label .. ": " .. s) or s
  end
  if e.by_arch then
    for _, a in ipairs(schema.archs) do
      if schema.applies(e, a) then
        local src = {}
        for _, f in ipairs({ "values", "min", "max", "gt", "lt", "pow2", "multiple_of" }) do
          src[f] = schema.field(e, f, a)
        end
        add(a, src)
      end
    end
  else
    add(nil, e)
  end
  return table.concat(parts, "; ")
end

local function default_text(e)
  if e.required then return "required" end
  if e.type == "map" then return "" end
  if e.default_by_arch then
    local t = {}
    for _, a in ipairs(schema.archs) do
      if e.default_by_arch[a] ~= nil then t[#t + 1] = a .. ": " .. value_text(e.default_by_arch[a]) end
    end
    return table.concat(t, "; ")
  end
  if e.default == nil then return "" end
  return value_text(e.default)
end

local function archs_text(e)
  if not e.archs then return "all" end
  return table.concat(e.archs, ", ")
end

-- The whole reference: one table row per key (in schema order), then the
-- cross-key rules.
function M.markdown()
  local out = {
    "| key | valid values | default | arch | meaning |",
    "|---|---|---|---|---|",
  }
  local function walk(entries, prefix)
    for _, e in ipairs(entries) do
      local path = prefix .. e.key
      out[#out + 1] = string.format("| `%s` | %s | %s | %s | %s |", path, valid_text(e),
        default_text(e), archs_text(e), (e.doc:gsub("|", "\\|")))
      if e.type == "map" then walk(e.keys, path .. ".") end
    end
  end
  walk(schema.keys, "")
  out[#out + 1] = ""
  out[#out + 1] = "Rules across keys:"
  out[#out + 1] = ""
  for _, r in ipairs(schema.rules) do
    out[#out + 1] = string.format("- %s%s", r.doc, r.archs and (" (" .. table.concat(r.archs, ", ") .. ")") or "")
  end
  return table.concat(out, "\n") .. "\n"
end

return M
