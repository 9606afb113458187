-- mg/init.lua: the entry point the host calls (doc/HACKING.md "Host <-> Lua
-- contract"): main(args) validates the spec tree, derives every constant,
-- then runs the command:
--   check       -> {}
--   print-spec  -> { text = canonical spec + derived values as YAML }
--   emit        -> { files = { {path=, content=, template=}, ... } }
--   spec-reference -> { text = the Markdown spec reference } (no spec needed)
--   tune-sources -> { files = manifest.txt + one CUDA file per autotuning
--                  candidate } (mamba-tune; mg/tune.lua)
-- Every command that reads a spec resolves `auto` values that come from the
-- autotune cache first (mg/tune.lua resolve, which asks the host for the
-- cache through mg.tune_cache()) and returns the resulting messages as
-- `notes` (printed on stderr).
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
  local tune = require("mg.tune")
  local tuned = tune.resolve(spec, args)
  local d = derive.derive(spec, { tuned = tuned })
  local notes = (tuned and tuned.note) and { tuned.note } or nil
  local cmd = args.command
  if cmd == "check" then
    return { notes = notes }
  elseif cmd == "print-spec" then
    return { text = require("mg.yaml_out").render(spec, d), notes = notes }
  elseif cmd == "emit" then
    return { files = require("mg.emit").files(spec, d, args, pos), notes = notes }
  elseif cmd == "tune-sources" then
    args.pos = pos
    return { files = tune.sources(spec, d, args) }
  end
  error("main: unknown command " .. tostring(cmd))
end

return M
