-- tests/harness.lua: the checks every Lua unit test uses. A test file does
--   local T = require("tests.harness").new("test_x")
--   local check, is = T.check, T.is
--   local s = T.spec("mamba1", { name = "m", model = { d_model = 128, ... }, ... })
--   ...
--   return T.done()
-- and is run by `mamba-gen --lua-test FILE --templates DIR` (tests/lua_modules.test):
-- one line per check, and an error (non-zero exit) when any check failed.

local schema = require("mg.schema")

local M = {}

-- spec(arch, values, ...): a canonical spec of `arch` (what mg.validate
-- returns): the schema's defaults, overridden by the tables of values, each
-- over the ones before it: { name = "m", model = { d_model = 128 }, precision = "bf16" }.
-- Keys without a default (name, model.d_model, ...) must be given; a key the
-- schema does not have for `arch` is an error (a typo would test nothing).
function M.spec(arch, ...)
  local function fill(entries, layers, where)
    local t, known = {}, {}
    for _, e in ipairs(entries) do
      if schema.applies(e, arch) then
        known[e.key] = true
        if e.type == "map" then
          local sub = {}
          for _, l in ipairs(layers) do sub[#sub + 1] = l[e.key] end
          t[e.key] = fill(e.keys, sub, where .. e.key .. ".")
        else
          local v = schema.default(e, arch)
          for _, l in ipairs(layers) do if l[e.key] ~= nil then v = l[e.key] end end
          assert(v ~= nil, "harness.spec: no value for " .. where .. e.key)
          t[e.key] = v
        end
      end
    end
    for _, l in ipairs(layers) do
      for k in pairs(l) do assert(known[k], "harness.spec: no key " .. where .. k .. " for " .. arch) end
    end
    return t
  end
  return fill(schema.keys, { { arch = arch }, ... }, "")
end

function M.new(name)
  local T = { n = 0, failed = 0, spec = M.spec }
  -- check(cond, desc[, detail]): one check; detail is printed on failure.
  function T.check(cond, desc, detail)
    T.n = T.n + 1
    if cond then
      print("  pass " .. T.n .. ": " .. desc)
    else
      T.failed = T.failed + 1
      print("  FAIL " .. T.n .. ": " .. desc .. (detail and ("\n    " .. detail) or ""))
    end
  end
  -- is(got, want, desc): equality; strings are shown quoted (escapes visible).
  function T.is(got, want, desc)
    local fmt = (type(got) == "string" or type(want) == "string") and "%q" or "%s"
    T.check(got == want, desc, string.format("got:  " .. fmt .. "\n    want: " .. fmt, tostring(got), tostring(want)))
  end
  -- The summary line; raises when any check failed.
  function T.done()
    print(string.format("%s: %d checks, %d failed", name, T.n, T.failed))
    if T.failed > 0 then error(string.format("%s: %d of %d checks failed", name, T.failed, T.n), 0) end
    return true
  end
  return T
end

return M
