-- tests/test_tmpl.lua: the template engine (mg/tmpl.lua) and the emit
-- helpers f32/int/provenance. Run: mamba-gen --lua-test FILE --templates DIR.
-- Prints one line per check; raises an error when any check failed.

local tmpl = require("mg.tmpl")
local emit = require("mg.emit")

local T = require("tests.harness").new("test_tmpl")
local check, is = T.check, T.is
local function render(text, env, name)
  return tmpl.render_string(text, name or "t.tmpl", env or {})
end
-- Error message of rendering, or nil when it succeeded.
local function err_of(text, env, name)
  local ok, e = pcall(render, text, env, name)
  if ok then return nil end
  return tostring(e)
end
local function like(got, pat, desc)
  check(got ~= nil and got:find(pat) ~= nil, desc,
    string.format("got:     %s\n    pattern: %s", tostring(got), pat))
end

-- Substitutions
is(render("a {{ x }} b\n", { x = "X" }), "a X b\n", "string substitution")
is(render("{{ n }}|{{ f }}|{{ g }}\n", { n = 42, f = 0.5, g = 2.0 }), "42|0.5|2\n",
  "integers as %d, floats as %.17g")
is(render("{{ 1e-5 }}\n"), "1.0000000000000001e-05\n", "float with %.17g")
is(render("{{ d.E * 2 }} {{ #list }}\n", { d = { E = 3 }, list = { 1, 2 } }), "6 2\n", "expressions")
is(render("{{x}}{{y}}", { x = "a", y = "b" }), "ab", "no spaces, no trailing newline")
is(render(""), "", "empty template")
is(render("plain \"quotes\" and \\ backslash\tand tab\n"), "plain \"quotes\" and \\ backslash\tand tab\n",
  "text with quotes, backslashes, tabs")
is(render("x = {{ '{{' }}0}};\n"), "x = {{0}};\n", "literal {{ through an expression")
is(render("{ a } {x}\n"), "{ a } {x}\n", "single braces are text")

-- Statements
is(render("{% for i = 1, 3 do %}\n[{{ i }}]\n{% end %}\nend\n"), "[1]\n[2]\n[3]\nend\n", "for loop")
is(render("  {% if on then %}\nyes\n  {% else %}\nno\n  {% end %}  \n", { on = false }), "no\n",
  "if/else with indented statement lines")
is(render("{% for _, p in ipairs(ps) do %}\n{{ p.name }}={{ p.v }}\n{% end %}\n",
  { ps = { { name = "a", v = 1 }, { name = "b", v = 2 } } }), "a=1\nb=2\n", "ipairs is available")
is(render("{% local s = string.format('%04d', 7) %}\n{{ s }} {{ math.max(1, 5) }}\n"), "0007 5\n",
  "string and math are available; locals persist across lines")
is(render("{% y = 5 %}\n{{ y }}\n"), "5\n", "assignments go to the per-render scope")
local env = { x = 1 }
render("{% x = 9 %}\n", env)
is(env.x, 1, "the caller's env is not modified")

-- Comments
is(render("a{# hidden #}b\n"), "ab\n", "inline comment dropped")
is(render("{# whole line #}\nnext\n"), "next\n", "comment-only line dropped with its newline")
is(render("  {# indented #}  \nnext\n"), "next\n", "indented comment-only line dropped")

-- Errors name template:line
like(err_of("line1\n{{ missing }}\n", {}, "mamba1/x.tmpl"), "^template:mamba1/x%.tmpl:2: undefined name 'missing'",
  "undefined global names template and line")
like(err_of("a\nb\n{{ d.nothing }}\n", { d = {} }, "k.tmpl"), "^template:k%.tmpl:3: {{ d%.nothing }} is nil",
  "nil substitution is an error with template:line")
like(err_of("{{ flag }}\n", { flag = true }), "^template:t%.tmpl:1: {{ flag }} is a boolean",
  "boolean substitution is an error")
like(err_of("{{ t }}\n", { t = {} }), "^template:t%.tmpl:1: {{ t }} is a table", "table substitution is an error")
like(err_of("x\ny\n{% local = 1 %}\n"), "^template:t%.tmpl:3:", "syntax error names the line")
like(err_of("a\n{% if x then %}\nb\n"), "^template:t%.tmpl:", "unclosed block is a compile error")
like(err_of("ok\nval {{ 1 + nil }}\n"), "^template:t%.tmpl:2:", "runtime error names the line")
like(err_of("x {% if a then %} y\n"), "^template:t%.tmpl:1: {%% %.%.%. %%} must be alone on its line",
  "inline statement refused")
like(err_of("\n\n{{ x\n"), "^template:t%.tmpl:3: unclosed {{", "unclosed {{")
like(err_of("{# x\n"), "^template:t%.tmpl:1: unclosed {#", "unclosed comment")
check(err_of("{{ pairs }}\n") ~= nil, "pairs is not offered")
like(err_of("{% print('x') %}\n"), "undefined name 'print'", "print is not offered")

-- Determinism: same input, same output; compiled function reusable.
local f = tmpl.compile("{% for i = 1, n do %}\n{{ i * 0.1 }}\n{% end %}\n", "d.tmpl")
is(f({ n = 3 }), f({ n = 3 }), "rendering is deterministic")
is(f({ n = 1 }), "0.10000000000000001\n", "a compiled template renders with different envs")

-- render() reads through mg.read and reports missing templates
like(select(2, pcall(tmpl.render, "no/such.tmpl", {})), "^template:no/such%.tmpl: cannot read template",
  "missing template file")

-- f32 / int / provenance
is(emit.f32(1e-5), "1e-05f", "f32(1e-5)")
is(emit.f32(1), "1.0f", "f32(1) has a '.'")
is(emit.f32(0.1), "0.1f", "f32(0.1)")
is(emit.f32(-2.5), "-2.5f", "f32(-2.5)")
is(emit.f32(1.0e-4), "0.0001f", "f32(1e-4)")
is(emit.f32(3.14159265358979), "3.1415927f", "f32(pi): 8 digits round-trip")
is(emit.f32(16777215), "16777215.0f", "f32(2^24-1) exact")
is(emit.f32(16777217), "16777216.0f", "f32 rounds to float first")
is(emit.f32(1e30), "1e+30f", "f32(1e30)")
check(not pcall(emit.f32, 1e39), "f32 out of float range is an error")
check(not pcall(emit.f32, 0 / 0), "f32(nan) is an error")
is(emit.int(48), "48", "int(48)")
is(emit.int(48.0), "48", "int(48.0)")
check(not pcall(emit.int, 2.5), "int(2.5) is an error")
is(emit.provenance_line("0.1.0", "m.yaml", string.rep("0123456789abcdef", 4), "mamba1/model.h.tmpl", "//"),
  "// Code generated by mamba-gen 0.1.0 from m.yaml (sha256 0123456789abcdef) with template mamba1/model.h.tmpl. DO NOT EDIT.",
  "provenance line")
local penv = emit.env({ name = "rl" }, {}, { spec_name = "rl.yaml", spec_hash = string.rep("f", 64) }, "mamba1/Makefile.tmpl")
is(render("{{ provenance('#') }}\n{{ NAME }} {{ name }}\n", penv),
  "# Code generated by mamba-gen " .. mg.version .. " from rl.yaml (sha256 ffffffffffffffff) with template mamba1/Makefile.tmpl. DO NOT EDIT.\nRL rl\n",
  "template env: provenance, NAME, name")

return T.done()
