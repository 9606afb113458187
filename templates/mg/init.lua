-- mg/init.lua: the entry point the host calls (doc/HACKING.md "Host <-> Lua
-- contract"): main(args) validates the spec tree, derives every constant,
-- then runs the command:
--   check       -> {}
--   print-spec  -> { text = canonical spec + derived values as YAML }
--   emit        -> { files = { {path=, content=, template=}, ... } }
--   spec-reference -> { text = the Markdown spec reference } (no spec needed)
-- Spec errors are raised as error({spec_errors = {...}}, 0) by the modules.

local M = {}

function M.main(args)
  assert(type(args) == "table", "main: args must be a table")
  if args.command == "spec-reference" then
    return { text = require("mg.spec_doc").markdown() }
  end
  local validate = require("mg.validate")
  local derive = require("mg.derive")
  local spec, pos = validate.validate(args.spec)
  local d = derive.derive(spec)
  local cmd = args.command
  if cmd == "check" then
    return {}
  elseif cmd == "print-spec" then
    return { text = require("mg.yaml_out").render(spec, d) }
  elseif cmd == "emit" then
    return { files = require("mg.emit").files(spec, d, args, pos) }
  end
  error("main: unknown command " .. tostring(cmd))
end

return M
