-- tests/harness.lua: the checks every Lua unit test uses. A test file does
--   local T = require("tests.harness").new("test_x")
--   local check, is = T.check, T.is
--   ...
--   return T.done()
-- and is run by `mamba-gen --lua-test FILE --templates DIR` (tests/lua_modules.test):
-- one line per check, and an error (non-zero exit) when any check failed.

local M = {}

function M.new(name)
  local T = { n = 0, failed = 0 }
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
