-- mg/validate.lua: spec tree (from gen/spec_yaml.c) -> canonical spec.
--
-- validate(tree) returns spec, pos:
--   spec: plain Lua values, every applicable key present, defaults filled
--         (ints are Lua integers, numbers are floats, `auto` stays "auto");
--   pos:  path ("model.d_state") -> {line=, col=, default=bool}: where the value
--         came from (for defaults: the enclosing mapping), so later stages can
--         report spec errors with positions (see V.spec_error).
-- On any error it collects all errors (at most V.MAX_ERRORS, then one
-- "too many errors" line; user text in them quoted through V.text) and raises
--   error({ spec_errors = { {line=, col=, msg=}, ... } }, 0)
-- sorted by position. Messages name the full key path and what would be valid.
--
-- Typing of plain scalars follows the YAML 1.2 core schema: null (~, null,
-- empty), bool (true/false only), int (decimal, 0o octal, 0x hex), float
-- (1.5, 1.0e-4, .5, .inf, .nan); anything else is a string. Quoted and block
-- scalars are always strings.

local schema = require("mg.schema")

local V = {}

-- At most this many errors are reported; then "too many errors, stopping".
V.MAX_ERRORS = 20

-- ------------------------------------------------------------ quoting user text

-- Code points that must not reach a terminal as they are (as sy_escape in
-- gen/spec_yaml.c): C0/C1 controls, DEL, zero-width and bidi marks, line
-- and paragraph separators, BOM.
local function unsafe_cp(cp)
  return cp < 0x20 or cp == 0x7F or (cp >= 0x80 and cp <= 0x9F) or (cp >= 0x200B and cp <= 0x200F)
    or (cp >= 0x2028 and cp <= 0x202E) or (cp >= 0x2060 and cp <= 0x2069) or cp == 0xFEFF
end

local short_escapes = { [0] = "\\0", [9] = "\\t", [10] = "\\n", [13] = "\\r", [92] = "\\\\" }

-- User text (a key, a value) made safe to quote in a message: NUL, tab,
-- newline, CR and backslash as \0 \t \n \r \\, other controls and bytes
-- that are not UTF-8 as \xHH, unsafe code points as \uXXXX; at most
-- V.QUOTE_MAX characters, then "...". Same rules as gen/spec_yaml.c.
V.QUOTE_MAX = 64
function V.text(s)
  s = tostring(s)
  local out, i, n, chars = {}, 1, #s, 0
  while i <= n do
    if chars == V.QUOTE_MAX then out[#out + 1] = "..."; break end
    local ok, cp = pcall(utf8.codepoint, s, i)
    local len
    if ok then len = #utf8.char(cp) end
    if not ok or s:sub(i, i + len - 1) ~= utf8.char(cp) then
      out[#out + 1] = string.format("\\x%02x", s:byte(i)); len = 1
    elseif short_escapes[cp] then
      out[#out + 1] = short_escapes[cp]
    elseif unsafe_cp(cp) then
      out[#out + 1] = cp < 0x80 and string.format("\\x%02x", cp) or string.format("\\u%04X", cp)
    else
      out[#out + 1] = s:sub(i, i + len - 1)
    end
    i, chars = i + len, chars + 1
  end
  return table.concat(out)
end
local qtext = V.text

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
  if cls.quoted then return 'the string "' .. qtext(node.value) .. '"' end
  if cls.t == "str" then return "'" .. qtext(node.value) .. "'" end
  return qtext(node.value)
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
  if #word > 64 then return nil end -- no key is that long; keep it cheap
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

-- x rounded to a C float (IEEE binary32, round to nearest).
function V.to_float(x) return (string.unpack("<f", string.pack("<f", x))) end
V.FLT_MIN = 2.0 ^ -126                -- the smallest normal float
V.FLT_MIN_TEXT = "1.1754944e-38"      -- its shortest round-trip text (>= FLT_MIN)
V.FLT_MAX_TEXT = "3.4028235e+38"

local function is_pow2(v) return v >= 1 and (v & (v - 1)) == 0 end

-- ------------------------------------------------------------ checks per type

-- Each returns value, or nil + message (without the "path: " prefix).
local check = {}

-- Why model name NAME cannot be used for its package's file names, or nil:
-- a header NAME.h, NAME_train.h, .. of the package that would shadow a
-- system header (schema.system_headers: the package compiles with -I.), or
-- a file name the package already uses for a fixed file (mg/emit.lua).
function V.name_clash(name)
  local emit = require("mg.emit")  -- here: mg.emit itself requires this module
  local fixed, patterns = {}, {}
  for arch_name, arch in pairs(emit.ARCHES) do
    for _, f in ipairs(emit.entries({ arch = arch_name, emit = { training = true, inference = true } }, arch)) do
      if f.path:find("%s", 1, true) then patterns[f.path] = true else fixed[f.path] = true end
    end
  end
  local list = {}
  for p in pairs(patterns) do list[#list + 1] = p end
  table.sort(list)
  for _, p in ipairs(list) do
    local path = p:format(name)
    if fixed[path] then
      return string.format("its file %s would collide with the package's own %s", path, path)
    end
    local base = path:match("^(.*)%.h$")
    if base then
      local sys = schema.system_headers[base]
      for _, pre in ipairs(schema.system_header_prefixes) do
        if base:sub(1, #pre) == pre then sys = true end
      end
      if sys then
        return string.format("its header %s would shadow the system header <%s> (the package compiles with -I.)", path, path)
      end
    end
  end
  return nil
end

function check.identifier(e, node, cls, arch)
  if node.kind ~= "scalar" or cls.t == "null" then
    return nil, "expected a C identifier (lower-case letters, digits, '_'), got " .. describe(node, cls)
  end
  local s = node.value
  local q = qtext(s)
  if not s:match("^[a-z0-9_]*$") or not s:match("^[a-z]") then
    return nil, string.format("'%s' is not a valid name; expected a C identifier of lower-case letters, digits and '_', starting with a letter", q)
  end
  if #s > schema.name_max_len then
    return nil, string.format("'%s' is %d characters long; at most %d are allowed", q, #s, schema.name_max_len)
  end
  if s:find("__", 1, true) or s:sub(-1) == "_" then
    -- NAME_x symbols would then contain '__', reserved in C++ (the kernels)
    return nil, string.format("'%s' contains '__' or ends with '_': the emitted symbols (%s_create, ...) would contain '__', which C++ reserves; choose another name", q, q)
  end
  if schema.c_keywords[s] then
    return nil, string.format("'%s' is a C keyword; choose another name", q)
  end
  if s == "mg" or s:sub(1, 3) == "mg_" then
    return nil, string.format("'%s' would clash with the runtime's mg_ symbols; choose a name that is not mg or mg_*", q)
  end
  local clash = V.name_clash(s)
  if clash then
    return nil, string.format("'%s' cannot be used: %s; choose another name", q, clash)
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
  if e.list_values then
    return nil, string.format("'%s' is not one of the %s mamba-gen supports: %s", qtext(node.value),
      e.list_values, join(values, ", "))
  end
  local msg = string.format("'%s' is not valid; %s", qtext(node.value), expected)
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
        return nil, string.format("%s is out of range %d..%d", qtext(node.value), min, max)
      end
      return nil, string.format("%s is too large", qtext(node.value))
    end
    local err = int_constraints(e, cls.v, arch, qtext(node.value))
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
    return nil, "expected a finite number, got " .. qtext(node.value)
  end
  if cls.t ~= "int" and cls.t ~= "float" then
    local extra = ""
    if cls.quoted and V.classify({ value = node.value, plain = true }).t ~= "str" then
      extra = " (quoted values are strings; remove the quotes)"
    end
    return nil, "expected a number, got " .. describe(node, cls) .. extra
  end
  if cls.big then return nil, string.format("%s is out of range", qtext(node.value)) end
  local v = cls.v + 0.0
  local values = schema.field(e, "values", arch)
  if values and not contains(values, v) then
    local vs = {}
    for i, x in ipairs(values) do vs[i] = fmt_num(x) end
    return nil, string.format("%s is not valid; expected one of %s", qtext(node.value), join(vs, ", "))
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
    return nil, string.format("%s is out of range; expected a number %s", qtext(node.value), join(parts, " and "))
  end
  -- Every number key is emitted as a C float (f32() in the templates): it
  -- must be finite as a float, and a key that must be > 0 must not become
  -- 0 or a subnormal (flushed to 0 on the GPU).
  local f = V.to_float(v)
  if f ~= f or f == math.huge or f == -math.huge then
    return nil, string.format("%s is out of the float range (a C float is at most %s in magnitude)",
      qtext(node.value), V.FLT_MAX_TEXT)
  end
  if ((gt and gt >= 0) or (min and min > 0)) and math.abs(f) < V.FLT_MIN then
    return nil, string.format("%s is too small for a C float (it would be stored as %s); the smallest accepted value is %s",
      qtext(node.value), f == 0 and "0" or "a subnormal", V.FLT_MIN_TEXT)
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
  local too_many = {}  -- raised by err() past V.MAX_ERRORS, caught below
  local function err(node, msg)
    errors[#errors + 1] = { line = node.line or 1, col = node.col or 1, msg = msg, seq = #errors + 1 }
    if #errors > V.MAX_ERRORS then error(too_many, 0) end
  end
  local function finish()
    if #errors > 0 then
      table.sort(errors, function(a, b)
        if a.line ~= b.line then return a.line < b.line end
        if a.col ~= b.col then return a.col < b.col end
        return a.seq < b.seq
      end)
      local out = {}
      for i, x in ipairs(errors) do
        if i > V.MAX_ERRORS then
          out[i] = { line = x.line, col = x.col, msg = string.format("too many errors (more than %d), stopping", V.MAX_ERRORS) }
          break
        end
        out[i] = { line = x.line, col = x.col, msg = x.msg }
      end
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
          err(k, string.format("duplicate key '%s%s' (first at line %d)", prefix, qtext(name), node.keys[present[name]].line or 0))
        elseif not e then
          local msg = string.format("unknown key '%s' %s", qtext(name), where)
          local sug = V.suggest(name, all_keys(entries))
          local removed = schema.removed[prefix .. name]
          if removed then
            msg = string.format("%s%s is no longer a spec key: %s", prefix, name, removed)
          elseif sug then
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

  local spec
  local function rules()
    if not arch then return end
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
  -- The walk, then the cross-key rules (only over values that passed their
  -- own checks); err() cuts either short past V.MAX_ERRORS.
  local ok, e = pcall(function() spec = walk(tree, schema.keys, ""); rules() end)
  if not ok and e ~= too_many then error(e, 0) end

  finish()
  return spec, pos
end

-- Raise a spec error at the position of `path` (for later stages).
function V.spec_error(pos, path, msg)
  local p = (pos and pos[path]) or { line = 1, col = 1 }
  error({ spec_errors = { { line = p.line, col = p.col, msg = msg } } }, 0)
end

return V
