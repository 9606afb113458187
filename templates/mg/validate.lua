-- mg/validate.lua: spec tree (from gen/spec_yaml.c) -> canonical spec.
--
-- validate(tree) returns spec, pos:
--   spec: plain Lua values, every applicable key present, defaults filled
--         (ints are Lua integers, numbers are floats, `auto` stays "auto");
--   pos:  path ("model.d_state") -> {line=, col=, default=bool}: where the value
--         came from (for defaults: the enclosing mapping), so later stages can
--         report spec errors with positions (see V.spec_error).
-- On any error it collects ALL errors and raises
--   error({ spec_errors = { {line=, col=, msg=}, ... } }, 0)
-- sorted by position. Messages name the full key path and what would be valid.
--
-- Typing of plain scalars follows the YAML 1.2 core schema: null (~, null,
-- empty), bool (true/false only), int (decimal, 0o octal, 0x hex), float
-- (1.5, 1.0e-4, .5, .inf, .nan); anything else is a string. Quoted and block
-- scalars are always strings.

local schema = require("mg.schema")

local V = {}

-- ------------------------------------------------------------ scalar typing

local function is_float_text(s)
  local rest = s:gsub("^[-+]", "", 1)
  local mant, exp = rest:match("^([%d%.]+)([eE][-+]?%d+)$")
  if not mant then mant, exp = rest, "" end
  if mant == "" then return false end
  -- mantissa: .digits | digits | digits.digits*
  if mant:match("^%.%d+$") or mant:match("^%d+$") or mant:match("^%d+%.%d*$") then
    return true
  end
  return false
end

-- Classify a scalar node: returns {t=, v=} with t one of
-- "null", "bool", "int", "float", "str"; `big` = true for an int too large
-- to represent; `quoted` = true for non-plain scalars.
function V.classify(node)
  local s = node.value
  if not node.plain then return { t = "str", v = s, quoted = true } end
  if s == "" or s == "~" or s == "null" or s == "Null" or s == "NULL" then
    return { t = "null" }
  end
  if s == "true" or s == "True" or s == "TRUE" then return { t = "bool", v = true } end
  if s == "false" or s == "False" or s == "FALSE" then return { t = "bool", v = false } end
  if s:match("^[-+]?%d+$") then
    local digits = s:gsub("^[-+]", ""):gsub("^0+", "")
    if #digits > 15 then return { t = "int", big = true } end
    local v = math.tointeger(tonumber(s:gsub("^%+", ""), 10))
    return { t = "int", v = v }
  end
  if s:match("^0o[0-7]+$") then
    if #s:sub(3):gsub("^0+", "") > 15 then return { t = "int", big = true } end
    return { t = "int", v = math.tointeger(tonumber(s:sub(3), 8)) }
  end
  if s:match("^0x%x+$") then
    if #s:sub(3):gsub("^0+", "") > 12 then return { t = "int", big = true } end
    return { t = "int", v = math.tointeger(tonumber(s:sub(3), 16)) }
  end
  if s:match("^[-+]?%.inf$") or s:match("^[-+]?%.Inf$") or s:match("^[-+]?%.INF$") then
    return { t = "float", v = (s:sub(1, 1) == "-") and -math.huge or math.huge, nonfinite = true }
  end
  if s == ".nan" or s == ".NaN" or s == ".NAN" then
    return { t = "float", v = 0 / 0, nonfinite = true }
  end
  if is_float_text(s) then
    return { t = "float", v = tonumber(s) + 0.0 }
  end
  return { t = "str", v = s }
end

-- How a value is described in messages ("got ...").
local function describe(node, cls)
  if node.kind == "map" then return "a mapping" end
  if node.kind == "seq" then return "a sequence" end
  cls = cls or V.classify(node)
  if cls.t == "null" then return "an empty value (null)" end
  if cls.quoted then return string.format("the string %q", node.value) end
  if cls.t == "str" then return "'" .. node.value .. "'" end
  return node.value
end

-- ------------------------------------------------------------ helpers

local function levenshtein(a, b)
  local la, lb = #a, #b
  local prev, cur = {}, {}
  for j = 0, lb do prev[j] = j end
  for i = 1, la do
    cur[0] = i
    local ca = a:sub(i, i)
    for j = 1, lb do
      local cost = (ca == b:sub(j, j)) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[lb]
end
V.levenshtein = levenshtein

-- The closest of `candidates` (list of strings, in order) to `word`, when
-- close enough to be a plausible typo; nil otherwise.
function V.suggest(word, candidates)
  local lw = word:lower()
  local best, bestd
  for _, c in ipairs(candidates) do
    local d = levenshtein(lw, c:lower())
    if not bestd or d < bestd then best, bestd = c, d end
  end
  if not best then return nil end
  local limit = math.min(3, math.max(1, #word // 3))
  if bestd <= limit and bestd < #word then return best end
  return nil
end

local function join(list, sep, last)
  local out = {}
  for i, v in ipairs(list) do out[i] = tostring(v) end
  if last and #out > 1 then
    return table.concat(out, sep, 1, #out - 1) .. last .. out[#out]
  end
  return table.concat(out, sep)
end

local function fmt_num(x)
  if math.type(x) == "integer" then return string.format("%d", x) end
  if x == math.floor(x) and math.abs(x) < 1e15 then return string.format("%.1f", x) end
  for p = 1, 17 do
    local s = string.format("%." .. p .. "g", x)
    if tonumber(s) == x then return s end
  end
  return string.format("%.17g", x)
end
V.fmt_num = fmt_num

local function contains(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

local function pow2_list(lo, hi)
  local l, p = {}, 1
  while p <= hi do if p >= lo then l[#l + 1] = p end; p = p * 2 end
  return l
end

local function is_pow2(v) return v >= 1 and (v & (v - 1)) == 0 end

-- ------------------------------------------------------------ checks per type

-- Each returns value, or nil + message (without the "path: " prefix).
local check = {}

function check.identifier(e, node, cls, arch)
  if node.kind ~= "scalar" or cls.t == "null" then
    return nil, "expected a C identifier (lower-case letters, digits, '_'), got " .. describe(node, cls)
  end
  local s = node.value
  if not s:match("^[a-z_][a-z0-9_]*$") then
    return nil, string.format("'%s' is not a valid name; expected a C identifier of lower-case letters, digits and '_', not starting with a digit", s)
  end
  if #s > schema.name_max_len then
    return nil, string.format("'%s' is %d characters long; at most %d are allowed", s, #s, schema.name_max_len)
  end
  if schema.c_keywords[s] then
    return nil, string.format("'%s' is a C keyword; choose another name", s)
  end
  if s:sub(1, 2) == "__" then
    return nil, string.format("'%s' starts with '__', which C reserves; choose another name", s)
  end
  if s == "mg" or s:sub(1, 3) == "mg_" then
    return nil, string.format("'%s' would clash with the runtime's mg_ symbols; choose a name that is not mg or mg_*", s)
  end
  return s
end

function check.enum(e, node, cls, arch)
  local values = schema.field(e, "values", arch)
  local expected = "expected one of " .. join(values, ", ")
  if node.kind ~= "scalar" or cls.t == "null" then
    return nil, "expected one of " .. join(values, ", ") .. ", got " .. describe(node, cls)
  end
  if contains(values, node.value) then return node.value end
  local msg = string.format("'%s' is not valid; %s", node.value, expected)
  local sug = V.suggest(node.value, values)
  if sug then msg = msg .. string.format("; did you mean '%s'?", sug) end
  return nil, msg
end

function check.bool(e, node, cls, arch)
  if node.kind == "scalar" and cls.t == "bool" then return cls.v end
  local got = describe(node, cls)
  if node.kind == "scalar" then
    local l = node.value:lower()
    if cls.quoted and (l == "true" or l == "false") then
      return nil, "expected true or false, got " .. got .. " (quoted values are strings; remove the quotes)"
    end
    if not cls.quoted and (l == "yes" or l == "no" or l == "on" or l == "off" or l == "y" or l == "n") then
      return nil, "expected true or false, got " .. got .. " (YAML 1.2 reads yes/no/on/off as strings; write true or false)"
    end
  end
  return nil, "expected true or false, got " .. got
end

local function int_constraints(e, v, arch, text)
  local values = schema.field(e, "values", arch)
  local auto = e.auto and ", or auto" or ""
  if values and not contains(values, v) then
    return string.format("%s is not valid; expected one of %s%s", text, join(values, ", "), auto)
  end
  local min, max = schema.field(e, "min", arch), schema.field(e, "max", arch)
  if (min and v < min) or (max and v > max) then
    if min and max then
      return string.format("%s is out of range %d..%d%s", text, min, max, auto)
    elseif min then
      return string.format("%s is out of range; expected an integer >= %d%s", text, min, auto)
    else
      return string.format("%s is out of range; expected an integer <= %d%s", text, max, auto)
    end
  end
  if schema.field(e, "pow2", arch) and not is_pow2(v) then
    return string.format("%s is not a power of two; expected one of %s", text,
      join(pow2_list(min or 1, max or 65536), ", "))
  end
  local m = schema.field(e, "multiple_of", arch)
  if m and v % m ~= 0 then
    return string.format("%s is not a multiple of %d (rows are read as 16-byte vectors)", text, m)
  end
  return nil
end

function check.int(e, node, cls, arch)
  local what = e.auto and "an integer or auto" or "an integer"
  if node.kind ~= "scalar" or cls.t == "null" then
    return nil, "expected " .. what .. ", got " .. describe(node, cls)
  end
  if e.auto and node.value == "auto" then return "auto" end
  if cls.t == "int" then
    if cls.big then
      local min, max = schema.field(e, "min", arch), schema.field(e, "max", arch)
      if min and max then
        return nil, string.format("%s is out of range %d..%d", node.value, min, max)
      end
      return nil, string.format("%s is too large", node.value)
    end
    local err = int_constraints(e, cls.v, arch, node.value)
    if err then return nil, err end
    return cls.v
  end
  if cls.quoted and V.classify({ value = node.value, plain = true }).t == "int" then
    return nil, "expected " .. what .. ", got " .. describe(node, cls) .. " (quoted values are strings; remove the quotes)"
  end
  return nil, "expected " .. what .. ", got " .. describe(node, cls)
end

function check.number(e, node, cls, arch)
  if node.kind ~= "scalar" or cls.t == "null" then
    return nil, "expected a number, got " .. describe(node, cls)
  end
  if cls.t == "float" and cls.nonfinite then
    return nil, "expected a finite number, got " .. node.value
  end
  if cls.t ~= "int" and cls.t ~= "float" then
    local extra = ""
    if cls.quoted and V.classify({ value = node.value, plain = true }).t ~= "str" then
      extra = " (quoted values are strings; remove the quotes)"
    end
    return nil, "expected a number, got " .. describe(node, cls) .. extra
  end
  if cls.big then return nil, string.format("%s is out of range", node.value) end
  local v = cls.v + 0.0
  local values = schema.field(e, "values", arch)
  if values and not contains(values, v) then
    local vs = {}
    for i, x in ipairs(values) do vs[i] = fmt_num(x) end
    return nil, string.format("%s is not valid; expected one of %s", node.value, join(vs, ", "))
  end
  local gt, lt = schema.field(e, "gt", arch), schema.field(e, "lt", arch)
  local min, max = schema.field(e, "min", arch), schema.field(e, "max", arch)
  local bad = (gt and not (v > gt)) or (lt and not (v < lt)) or (min and v < min) or (max and v > max)
  if bad then
    local parts = {}
    if gt then parts[#parts + 1] = "> " .. fmt_num(gt) end
    if min then parts[#parts + 1] = ">= " .. fmt_num(min) end
    if lt then parts[#parts + 1] = "< " .. fmt_num(lt) end
    if max then parts[#parts + 1] = "<= " .. fmt_num(max) end
    return nil, string.format("%s is out of range; expected a number %s", node.value, join(parts, " and "))
  end
  return v
end

-- ------------------------------------------------------------ the walk

local function key_list(entries, arch)
  local l = {}
  for _, e in ipairs(entries) do
    if schema.applies(e, arch) then l[#l + 1] = e.key end
  end
  return l
end

local function all_keys(entries)
  local l = {}
  for _, e in ipairs(entries) do l[#l + 1] = e.key end
  return l
end

function V.validate(tree)
  local errors = {}
  local bad = {}   -- path -> true when that value failed its own checks
  local pos = {}
  local function err(node, msg)
    errors[#errors + 1] = { line = node.line or 1, col = node.col or 1, msg = msg, seq = #errors + 1 }
  end
  local function finish()
    if #errors > 0 then
      table.sort(errors, function(a, b)
        if a.line ~= b.line then return a.line < b.line end
        if a.col ~= b.col then return a.col < b.col end
        return a.seq < b.seq
      end)
      local out = {}
      for i, x in ipairs(errors) do out[i] = { line = x.line, col = x.col, msg = x.msg } end
      error({ spec_errors = out }, 0)
    end
  end

  if type(tree) ~= "table" or tree.kind ~= "map" then
    local what = type(tree) == "table" and describe(tree) or "nothing"
    err(type(tree) == "table" and tree or {}, "the spec must be a mapping of keys (name: ..., arch: ..., model: ...), got " .. what)
    finish()
  end

  -- Pass 1: the arch, needed to know which keys apply.
  local arch
  for i, k in ipairs(tree.keys) do
    if k.kind == "scalar" and k.value == "arch" then
      local v = tree.values[i]
      if v.kind == "scalar" and contains(schema.archs, v.value) then arch = v.value end
    end
  end

  local function walk(node, entries, prefix)
    local out = {}
    local present = {}   -- key -> index of its first occurrence
    local where = prefix == "" and "at the top level" or ("in " .. prefix:sub(1, -2))
    for i, k in ipairs(node.keys) do
      local v = node.values[i]
      if k.kind ~= "scalar" then
        err(k, string.format("keys must be plain scalars %s, got %s", where, describe(k)))
      else
        local name = k.value
        local e
        for _, x in ipairs(entries) do if x.key == name then e = x end end
        if present[name] then
          err(k, string.format("duplicate key '%s%s' (first at line %d)", prefix, name, node.keys[present[name]].line or 0))
        elseif not e then
          local msg = string.format("unknown key '%s' %s", name, where)
          local sug = V.suggest(name, all_keys(entries))
          if sug then
            msg = msg .. string.format("; did you mean '%s'?", sug)
          else
            msg = msg .. "; valid keys: " .. join(key_list(entries, arch), ", ")
          end
          err(k, msg)
          present[name] = i
        elseif not schema.applies(e, arch) then
          err(k, string.format("%s%s applies to arch %s only", prefix, name, join(e.archs, ", ")))
          present[name] = i
        else
          present[name] = i
        end
      end
    end
    for _, e in ipairs(entries) do
      if schema.applies(e, arch) then
        local path = prefix .. e.key
        local idx = present[e.key]
        local v = idx and node.values[idx]
        if v then
          pos[path] = { line = v.line, col = v.col }
          if e.type == "map" then
            if v.kind == "map" then
              out[e.key] = walk(v, e.keys, path .. ".")
            else
              err(v, string.format("%s: expected a mapping of keys (%s), got %s", path,
                join(key_list(e.keys, arch), ", "), describe(v)))
              bad[path] = true
            end
          else
            local cls = v.kind == "scalar" and V.classify(v) or nil
            local val, msg = check[e.type](e, v, cls, arch)
            if msg then
              err(v, path .. ": " .. msg)
              bad[path] = true
            else
              out[e.key] = val
            end
          end
        else
          pos[path] = { line = node.line, col = node.col, default = true }
          if e.type == "map" then
            local any_required = false
            for _, c in ipairs(e.keys) do if c.required and schema.applies(c, arch) then any_required = true end end
            if e.required or any_required then
              err(node, string.format("missing required key '%s'", path))
              bad[path] = true
            else
              out[e.key] = walk({ kind = "map", keys = {}, values = {}, line = node.line, col = node.col }, e.keys, path .. ".")
            end
          elseif e.required then
            err(node, string.format("missing required key '%s'", path))
            bad[path] = true
          else
            local dv = schema.default(e, arch)
            if dv == nil then bad[path] = true end -- arch unknown: no default
            out[e.key] = dv
          end
        end
      end
    end
    return out
  end

  local spec = walk(tree, schema.keys, "")

  -- Cross-key rules, only over values that passed their own checks.
  if arch then
    for _, r in ipairs(schema.rules) do
      local ok = schema.applies(r, arch)
      for _, p in ipairs(r.reads) do
        local sec = p:match("^(%w+)%.")
        if bad[p] or (sec and bad[sec]) then ok = false end
      end
      if ok then
        local path, msg = r.check(spec)
        if path then
          local p = pos[path] or { line = tree.line, col = tree.col }
          if p.default then msg = msg .. " (the default; set " .. path .. " explicitly)" end
          err(p, path .. ": " .. msg)
        end
      end
    end
  end

  finish()
  return spec, pos
end

-- Raise a spec error at the position of `path` (for later stages).
function V.spec_error(pos, path, msg)
  local p = (pos and pos[path]) or { line = 1, col = 1 }
  error({ spec_errors = { { line = p.line, col = p.col, msg = msg } } }, 0)
end

return V
