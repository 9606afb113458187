-- mg/tmpl.lua: the template engine (syntax: doc/HACKING.md).
--
--   {{ expr }}          the value of a Lua expression: strings as they are,
--                       integers as %d, other numbers as %.17g; nil, booleans,
--                       tables and functions are errors naming template:line.
--   {% statements %}    alone on its line (leading/trailing blanks allowed):
--                       Lua code; the whole line, newline included, is dropped.
--   {# comment #}       dropped; a line holding only comments is dropped
--                       with its newline. Comments end on the line they start.
--   A literal "{{" in the output is written {{ "{{" }}.
--
-- A template compiles to one Lua chunk in which template line i is Lua line i,
-- so every error (compile or run time) reads `template:REL/PATH:LINE: ...`.
-- The chunk receives its environment as an argument: each render gets a fresh
-- scope whose reads fall back to the caller's env, then to a few read-only
-- builtins (string, table, math, ipairs, type, tostring, select, error,
-- assert; deliberately not pairs, whose order is unspecified); a name found
-- in none of them is an error. Assignments stay in that per-render scope.
-- Output is a pure function of the template text and env.

local T = {}

local BUILTINS = {
  string = string, table = table, math = math, ipairs = ipairs,
  type = type, tostring = tostring, select = select, error = error, assert = assert,
}

local function escape(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return string.format("\\%03d", c:byte()) end) .. '"'
end

local function fail(relpath, line, msg)
  error(string.format("template:%s:%d: %s", relpath, line, msg), 0)
end

-- Translate one text line (no newline) into Lua code appending its output.
local function text_line(relpath, lineno, line, nl, parts)
  local code = {}
  local pos = 1
  local only_comments = true
  local had_comment = false
  while pos <= #line do
    local a = line:find("{", pos, true)
    local two = a and line:sub(a, a + 1)
    while a and two ~= "{{" and two ~= "{#" and two ~= "{%" do
      a = line:find("{", a + 1, true)
      two = a and line:sub(a, a + 1)
    end
    local lit = line:sub(pos, (a or (#line + 1)) - 1)
    if lit ~= "" then
      code[#code + 1] = "_o(" .. escape(lit) .. ")"
      if lit:match("%S") then only_comments = false end
    end
    if not a then break end
    if two == "{#" then
      local b = line:find("#}", a + 2, true)
      if not b then fail(relpath, lineno, "unclosed {# comment (comments end on the line they start)") end
      had_comment = true
      pos = b + 2
    elseif two == "{%" then
      fail(relpath, lineno, "{% ... %} must be alone on its line")
    else
      local b = line:find("}}", a + 2, true)
      if not b then fail(relpath, lineno, "unclosed {{ (an expression ends on the line it starts)") end
      local expr = line:sub(a + 2, b - 1):match("^%s*(.-)%s*$")
      if expr == "" then fail(relpath, lineno, "empty {{ }}") end
      code[#code + 1] = string.format("_o(_s((%s), %d, %s))", expr, lineno, escape(expr))
      only_comments = false
      pos = b + 2
    end
  end
  if had_comment and only_comments then return "" end
  if nl then code[#code + 1] = '_o("\\n")' end
  return table.concat(code, " ")
end

-- Compile template text into a function(env) -> string.
function T.compile(text, relpath)
  assert(type(text) == "string", "tmpl.compile: text must be a string")
  relpath = relpath or "?"
  local lua = {}
  local pos, lineno = 1, 0
  while pos <= #text do
    lineno = lineno + 1
    local e = text:find("\n", pos, true)
    local line = text:sub(pos, (e or (#text + 1)) - 1)
    pos = e and (e + 1) or (#text + 1)
    local stmt = line:match("^%s*{%%(.*)%%}%s*$")
    if stmt then
      lua[lineno] = stmt
    else
      lua[lineno] = text_line(relpath, lineno, line, e ~= nil, lua)
    end
  end
  if lineno == 0 then lua[1] = "" end
  lua[1] = "local _ENV, _o, _s = ...; " .. lua[1]
  local code = table.concat(lua, "\n")
  local chunk, err = load(code, "=template:" .. relpath, "t", {})
  if not chunk then error(err, 0) end

  return function(env)
    local out = {}
    local function o(s) out[#out + 1] = s end
    local function s(v, line, expr)
      local mt = math.type(v)
      if mt == "integer" then return string.format("%d", v) end
      if mt == "float" then return string.format("%.17g", v) end
      local t = type(v)
      if t == "string" then return v end
      if v == nil then fail(relpath, line, "{{ " .. expr .. " }} is nil") end
      if t == "boolean" then
        fail(relpath, line, "{{ " .. expr .. " }} is a boolean (" .. tostring(v) .. "); use {% if %} to test it")
      end
      fail(relpath, line, "{{ " .. expr .. " }} is a " .. t .. ", not a string or number")
    end
    local scope = setmetatable({}, {
      __index = function(_, k)
        local v = env and env[k]
        if v == nil then v = BUILTINS[k] end
        if v == nil then error("undefined name '" .. tostring(k) .. "'", 2) end
        return v
      end,
    })
    chunk(scope, o, s)
    return table.concat(out)
  end
end

-- Render text directly (tests, small snippets).
function T.render_string(text, relpath, env)
  return T.compile(text, relpath)(env)
end

local cache = {}

-- Forget compiled templates (tests that stand in for mg.read use it).
function T.clear_cache() cache = {} end

-- Render the template file `relpath` (read through mg.read; compiled once).
function T.render(relpath, env)
  local f = cache[relpath]
  if not f then
    local text, msg = mg.read(relpath)
    if not text then
      error(string.format("template:%s: cannot read template: %s", relpath, tostring(msg)), 0)
    end
    f = T.compile(text, relpath)
    cache[relpath] = f
  end
  return f(env)
end

return T
