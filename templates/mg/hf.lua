-- mg/hf.lua: `mamba-gen --from-hf CONFIG.json`: a spec from a Hugging Face
-- MambaConfig (the config.json of the Mamba-1 `*-hf` checkpoints, e.g.
-- state-spaces/mamba-130m-hf).
--
-- from_hf(text, path, name) returns the spec as YAML text: every key of the
-- arch mamba1 in schema order, commented with where its value came from.
-- The same input gives the same bytes. The spec is checked the way --check
-- checks a file (mg/validate.lua, mg/derive.lua) before it is returned.
-- Errors are raised as error({spec_errors = {{line=, col=, msg=}, ...}}, 0)
-- with positions in the JSON file (line 0: no position, e.g. --name).
--
-- The JSON decoder (M.decode) is a strict RFC 8259 parser: every value is a
-- node {t = "object"|"array"|"string"|"number"|"bool"|"null", v = ...,
-- line =, col =, int = true for numbers written without '.' or exponent};
-- an object's v is {keys = {name, ...} (file order), map = {name = node}}.

local schema = require("mg.schema")
local validate = require("mg.validate")
local yaml_out = require("mg.yaml_out")

local M = {}

M.MAX_DEPTH = 64

local function fail(line, col, msg)
  error({ spec_errors = { { line = line, col = col, msg = msg } } }, 0)
end

-- ------------------------------------------------------------ JSON

function M.decode(text)
  local pos, line, lstart = 1, 1, 1 -- lstart: index of the current line's first byte
  local n = #text
  local function col() -- in characters (bytes where the line is not UTF-8)
    local c = utf8.len(text, lstart, pos - 1)
    return (c or (pos - lstart)) + 1
  end
  local function err(msg) fail(line, col(), msg) end
  local function ws()
    while pos <= n do
      local c = text:byte(pos)
      if c == 10 then line, pos = line + 1, pos + 1; lstart = pos
      elseif c == 32 or c == 9 or c == 13 then pos = pos + 1
      else break end
    end
  end
  local function near()
    if pos > n then return "the end of the file" end
    local c = text:sub(pos, pos)
    return "'" .. validate.text(c) .. "'"
  end
  local value
  local function str()
    local out = {}
    pos = pos + 1 -- the opening quote
    while true do
      if pos > n then err("unterminated string") end
      local c = text:byte(pos)
      if c == 34 then pos = pos + 1; break end
      if c == 10 then err("unterminated string (a newline before its closing quote)") end
      if c < 32 then err("control character in a string (write it as an escape)") end
      if c == 92 then
        local e = text:sub(pos + 1, pos + 1)
        local simple = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
        if simple[e] then
          out[#out + 1] = simple[e]; pos = pos + 2
        elseif e == "u" then
          local h = text:sub(pos + 2, pos + 5)
          if not h:match("^%x%x%x%x$") then err("bad \\u escape: expected 4 hex digits") end
          local cp = tonumber(h, 16)
          pos = pos + 6
          if cp >= 0xD800 and cp <= 0xDBFF then
            local h2 = text:match("^\\u(%x%x%x%x)", pos)
            local lo = h2 and tonumber(h2, 16)
            if not lo or lo < 0xDC00 or lo > 0xDFFF then err("bad \\u escape: a high surrogate without its low surrogate") end
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            pos = pos + 6
          elseif cp >= 0xDC00 and cp <= 0xDFFF then
            err("bad \\u escape: a lone low surrogate")
          end
          out[#out + 1] = utf8.char(cp)
        else
          err("bad escape '\\" .. validate.text(e) .. "' in a string")
        end
      else
        local s, e = text:find('^[^"\\%c]+', pos)
        if not s then s, e = pos, pos end
        out[#out + 1] = text:sub(s, e)
        pos = e + 1
      end
    end
    local s = table.concat(out)
    if not utf8.len(s) then err("string is not valid UTF-8") end
    return s
  end
  -- -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [-+]? [0-9]+)?
  local function number()
    local s = text:match("^-?0", pos) or text:match("^-?[1-9]%d*", pos)
    if not s then err("malformed number near " .. near()) end
    local int = true
    local frac = text:match("^%.%d*", pos + #s)
    if frac then
      if #frac == 1 then pos = pos + #s + 1; err("malformed number: a digit must follow '.'") end
      s, int = s .. frac, false
    end
    local exp = text:match("^[eE][-+]?%d*", pos + #s)
    if exp then
      if not exp:match("%d$") then pos = pos + #s + #exp; err("malformed number: digits must follow the exponent") end
      s, int = s .. exp, false
    end
    if text:match("^[%w.]", pos + #s) then pos = pos + #s; err("malformed number: unexpected " .. near()) end
    pos = pos + #s
    local v = int and math.tointeger(tonumber(s)) or tonumber(s)
    if int and not v then v, int = tonumber(s .. ".0"), false end -- too large for an integer
    return v, int
  end
  value = function(depth)
    ws()
    if depth > M.MAX_DEPTH then err("nested deeper than " .. M.MAX_DEPTH .. " levels") end
    local l, c0 = line, col()
    local node = { line = l, col = c0 }
    local ch = text:sub(pos, pos)
    if ch == "{" then
      pos = pos + 1
      local obj = { keys = {}, map = {} }
      ws()
      if text:sub(pos, pos) == "}" then pos = pos + 1
      else
        while true do
          ws()
          if text:sub(pos, pos) ~= '"' then err("expected a string key, got " .. near()) end
          local kl, kc = line, col()
          local k = str()
          if obj.map[k] then
            fail(kl, kc, string.format("duplicate key \"%s\" (first at line %d)", validate.text(k), obj.map[k].kline))
          end
          ws()
          if text:sub(pos, pos) ~= ":" then err("expected ':' after the key, got " .. near()) end
          pos = pos + 1
          local v = value(depth + 1)
          v.kline = kl
          obj.keys[#obj.keys + 1] = k
          obj.map[k] = v
          ws()
          local d = text:sub(pos, pos)
          pos = pos + 1
          if d == "}" then break end
          if d ~= "," then pos = pos - 1; err("expected ',' or '}' in an object, got " .. near()) end
        end
      end
      node.t, node.v = "object", obj
    elseif ch == "[" then
      pos = pos + 1
      local arr = {}
      ws()
      if text:sub(pos, pos) == "]" then pos = pos + 1
      else
        while true do
          arr[#arr + 1] = value(depth + 1)
          ws()
          local d = text:sub(pos, pos)
          pos = pos + 1
          if d == "]" then break end
          if d ~= "," then pos = pos - 1; err("expected ',' or ']' in an array, got " .. near()) end
        end
      end
      node.t, node.v = "array", arr
    elseif ch == '"' then
      node.t, node.v = "string", str()
    elseif ch == "-" or ch:match("%d") then
      node.t = "number"
      node.v, node.int = number()
    elseif text:sub(pos, pos + 3) == "true" then
      node.t, node.v = "bool", true; pos = pos + 4
    elseif text:sub(pos, pos + 4) == "false" then
      node.t, node.v = "bool", false; pos = pos + 5
    elseif text:sub(pos, pos + 3) == "null" then
      node.t = "null"; pos = pos + 4
    elseif text:sub(pos, pos + 2) == "NaN" or text:sub(pos, pos + 7) == "Infinity" then
      err("NaN and Infinity are not JSON values")
    else
      err("expected a JSON value, got " .. near())
    end
    return node
  end
  if text:sub(1, 3) == "\239\187\191" then pos = 4; lstart = 4 end -- a UTF-8 BOM
  local root = value(1)
  ws()
  if pos <= n then err("unexpected " .. near() .. " after the JSON value") end
  return root
end

-- ------------------------------------------------------------ the mapping

local function describe(node)
  if node.t == "string" then return '"' .. validate.text(node.v) .. '"' end
  if node.t == "number" then return node.int and string.format("%d", node.v) or yaml_out.float_text(node.v) end
  if node.t == "bool" then return tostring(node.v) end
  if node.t == "null" then return "null" end
  return "an " .. node.t
end

-- Spec path -> the MambaConfig key it comes from (messages, comments).
M.SOURCES = {
  ["model.d_model"] = "hidden_size", ["model.n_layers"] = "num_hidden_layers",
  ["model.d_state"] = "state_size", ["model.expand"] = "expand", ["model.d_conv"] = "conv_kernel",
  ["model.dt_rank"] = "time_step_rank", ["model.norm_eps"] = "layer_norm_epsilon",
  ["precision"] = "torch_dtype",
}

-- MambaConfig keys that configure what mamba-gen does not build or only the
-- initialization of new weights; listed in the spec's comment.
local NOT_MAPPED = {
  vocab_size = "embedding", pad_token_id = "embedding", bos_token_id = "embedding", eos_token_id = "embedding",
  tie_word_embeddings = "embedding", pad_vocab_size_multiple = "embedding",
  initializer_range = "init", rescale_prenorm_residual = "init", time_step_scale = "init",
  time_step_min = "init", time_step_max = "init", time_step_init_scheme = "init", time_step_floor = "init",
}

local DTYPES = { float32 = "f32", bfloat16 = "bf16", float16 = "f16" }

-- Model name from a checkpoint id ("state-spaces/mamba-130m-hf" ->
-- "mamba_130m_hf"), or nil when that is no valid name.
local function name_from_id(id)
  local s = id:match("([^/\\]+)[/\\]*$") or id
  s = s:lower():gsub("[^a-z0-9]+", "_"):gsub("^_+", ""):gsub("_+$", "")
  s = s:sub(1, schema.name_max_len):gsub("_+$", "")
  if not s:match("^[a-z]") or schema.c_keywords[s] or s == "mg" or s:sub(1, 3) == "mg_"
     or validate.name_clash(s) then
    return nil
  end
  return s
end

-- Lines of the spec, keys in schema order, and the tree validate() reads.
function M.from_hf(text, path, name)
  local root = M.decode(text)
  if root.t ~= "object" then
    fail(root.line, root.col, "expected a JSON object (a MambaConfig config.json), got " .. describe(root))
  end
  local map = root.v.map
  local rl, rc = root.line, root.col
  local function at(key) local v = map[key]; return v and v.line or rl, v and v.col or rc end
  local function kerr(key, msg) local l, c = at(key); fail(l, c, key .. ": " .. msg) end

  local mt = map.model_type
  if not mt then
    local hint = (map.d_model or map.n_layer) and
      " (d_model/n_layer: this looks like a mamba_ssm config; use the config.json of the *-hf checkpoint)" or ""
    fail(rl, rc, "not a Hugging Face MambaConfig: no model_type key (expected \"mamba\")" .. hint)
  end
  if mt.t ~= "string" or mt.v ~= "mamba" then
    local extra = ""
    if mt.t == "string" and mt.v:match("^mamba") then
      extra = "; only Mamba-1 configs (model_type \"mamba\") can be converted: arch mamba3_siso specs are written by hand"
    end
    kerr("model_type", "expected \"mamba\" (a Mamba-1 MambaConfig), got " .. describe(mt) .. extra)
  end

  local function int_key(key, default)
    local v = map[key]
    if not v then
      return default
    end
    if v.t ~= "number" or not v.int then kerr(key, "expected an integer, got " .. describe(v)) end
    return v.v
  end
  local function bool_key(key, default)
    local v = map[key]
    if not v then return default end
    if v.t ~= "bool" then kerr(key, "expected true or false, got " .. describe(v)) end
    return v.v
  end

  local missing = {}
  for _, k in ipairs({ "hidden_size", "num_hidden_layers", "state_size", "expand", "conv_kernel" }) do
    if not map[k] then missing[#missing + 1] = '"' .. k .. '"' end
  end
  if #missing > 0 then
    fail(rl, rc, string.format("missing key%s %s (MambaConfig)", #missing > 1 and "s" or "", table.concat(missing, ", ")))
  end
  local D = int_key("hidden_size")
  local L = int_key("num_hidden_layers")
  local N = int_key("state_size")
  local X = int_key("expand")
  local K = int_key("conv_kernel")
  local R = "auto"
  if map.time_step_rank then
    local v = map.time_step_rank
    if v.t == "string" and v.v == "auto" then R = "auto"
    elseif v.t == "number" and v.int then R = v.v
    else kerr("time_step_rank", "expected an integer or \"auto\", got " .. describe(v)) end
  end
  local eps = 1e-5
  if map.layer_norm_epsilon then
    local v = map.layer_norm_epsilon
    if v.t ~= "number" then kerr("layer_norm_epsilon", "expected a number, got " .. describe(v)) end
    eps = v.v + 0.0
  end
  if map.intermediate_size then
    local v = map.intermediate_size
    if v.t ~= "number" or not v.int or v.v ~= X * D then
      kerr("intermediate_size", string.format("%s is not expand*hidden_size = %d: mamba-gen's inner width is always expand*d_model",
        describe(v), X * D))
    end
  end
  -- Options of the Mamba-1 block that mamba-gen builds one way only.
  if bool_key("use_bias", false) then
    kerr("use_bias", "true is not supported: mamba-gen's Mamba-1 has no in_proj/out_proj bias (the mamba *-hf checkpoints have use_bias false)")
  end
  if not bool_key("use_conv_bias", true) then
    kerr("use_conv_bias", "false is not supported: mamba-gen's Mamba-1 always has the conv1d bias (mixer.conv1d.bias)")
  end
  if not bool_key("rms_norm", true) then
    kerr("rms_norm", "false (LayerNorm) is not supported: mamba-gen's norms are RMSNorm")
  end
  local resid32 = bool_key("residual_in_fp32", true)
  if map.hidden_act then
    local v = map.hidden_act
    if v.t ~= "string" or v.v ~= "silu" then
      kerr("hidden_act", "expected \"silu\" (the activation of mamba-gen's Mamba-1), got " .. describe(v))
    end
  end
  local dkey = map.torch_dtype and "torch_dtype" or (map.dtype and "dtype") or nil
  local precision = "f32"
  if dkey then
    local v = map[dkey]
    if v.t ~= "string" or not DTYPES[v.v] then
      kerr(dkey, "expected \"float32\", \"bfloat16\" or \"float16\", got " .. describe(v))
    end
    precision = DTYPES[v.v]
  end

  local sources = setmetatable({ precision = dkey or "torch_dtype" }, { __index = M.SOURCES })

  -- The name: --name, else from _name_or_path, else from the dimensions.
  local given = name ~= nil
  if not given then
    local id = map._name_or_path
    name = id and id.t == "string" and name_from_id(id.v) or string.format("mamba1_d%d_l%d", D, L)
  end

  -- The spec's values (scalar nodes at the JSON positions of their sources).
  local values = {
    name = name, arch = "mamba1",
    ["model.d_model"] = D, ["model.n_layers"] = L, ["model.d_state"] = N, ["model.expand"] = X,
    ["model.d_conv"] = K, ["model.dt_rank"] = R, ["model.input_dim"] = 0, ["model.norm_eps"] = eps,
    precision = precision,
    ["shapes.max_batch"] = M.MAX_BATCH, ["shapes.max_seq_len"] = M.MAX_SEQ_LEN,
  }
  local comments = {
    name = given and "--name" or (map._name_or_path and "from _name_or_path" or "from the dimensions (--name NAME sets it)"),
    ["model.expand"] = string.format("expand (E = %d)", X * D),
    arch = "model_type mamba",
    ["model.dt_rank"] = R == "auto" and string.format("time_step_rank: auto = ceil(%d/16)", D) or nil,
    ["model.input_dim"] = "no input projection: the library takes d_model-wide embeddings",
    ["shapes.max_batch"] = "not in the config: the largest batch of a call; set it for your workload",
    ["shapes.max_seq_len"] = "not in the config: the longest sequence of a call; set it for your workload",
  }
  local function scalar_text(v)
    if math.type(v) == "float" then return yaml_out.float_text(v) end
    if type(v) == "boolean" then return tostring(v) end
    return tostring(v)
  end
  local function build(entries, prefix, out_lines, depth)
    local node = { kind = "map", keys = {}, values = {}, line = rl, col = rc }
    for _, e in ipairs(entries) do
      if schema.applies(e, "mamba1") then
        local p = prefix .. e.key
        local indent = string.rep("  ", depth)
        local src = sources[p]
        local l, c = rl, rc
        if src and map[src] then l, c = map[src].line, map[src].col end
        if p == "name" and given then l, c = 0, 0 end -- reported as --name
        node.keys[#node.keys + 1] = { kind = "scalar", value = e.key, plain = true, line = l, col = c }
        if e.type == "map" then
          if depth == 0 then out_lines[#out_lines + 1] = "" end
          out_lines[#out_lines + 1] = indent .. e.key .. ":"
          node.values[#node.values + 1] = build(e.keys, p .. ".", out_lines, depth + 1)
          node.values[#node.values].line, node.values[#node.values].col = l, c
        else
          local v = values[p]
          if v == nil then v = schema.default(e, "mamba1") end
          local t = scalar_text(v)
          local line = indent .. e.key .. ": " .. t
          local cm = comments[p] or (src and map[src] and src) or nil
          if cm then line = line .. string.rep(" ", math.max(1, 24 - #line)) .. "# " .. cm end
          if depth == 0 and e.key ~= "name" and e.key ~= "arch" then out_lines[#out_lines + 1] = "" end
          out_lines[#out_lines + 1] = line
          node.values[#node.values + 1] = { kind = "scalar", value = t, plain = true, line = l, col = c }
        end
      end
    end
    return node
  end
  local body = {}
  local tree = build(schema.keys, "", body, 0)

  -- Check it as --check would, messages naming the config key.
  local ok, e = pcall(function()
    local spec = validate.validate(tree)
    require("mg.derive").derive(spec, {})
  end)
  if not ok then
    if type(e) == "table" and e.spec_errors then
      for _, x in ipairs(e.spec_errors) do
        local p, rest = x.msg:match("^([%w_.]+): (.*)$")
        if p == "name" and given then
          x.line, x.col, x.msg = 0, 0, "--name: " .. rest
        elseif p and sources[p] then
          x.msg = string.format("%s (%s): %s", sources[p], p, rest)
        end
      end
    end
    error(e, 0)
  end

  local unused = {}
  for _, k in ipairs(root.v.keys) do
    if NOT_MAPPED[k] then unused[#unused + 1] = k end
  end
  table.sort(unused)
  local vocab = map.vocab_size and map.vocab_size.t == "number" and string.format(" (vocab_size %s)", describe(map.vocab_size)) or ""
  local head = {
    string.format("# %s.yaml: written by mamba-gen --from-hf from %s,", name, validate.text(path)),
    "# a Hugging Face MambaConfig (model_type mamba): the Mamba-1 backbone of the",
    "# checkpoint (backbone.layers.N.*, backbone.norm_f), whose tensors can be",
    "# copied into the weights blob as they are (mamba-gen --print-spec lists them).",
    "# The token embedding and the LM head" .. vocab .. " are not part of the",
    "# library: it takes embeddings (d_model-wide vectors) as input and returns the",
    "# final hidden states (after norm_f).",
  }
  if not resid32 then
    head[#head + 1] = "# residual_in_fp32 is false in the config: mamba-gen keeps the residual stream"
    head[#head + 1] = "# in f32 anyway (results differ from a low-precision residual by rounding)."
  end
  if #unused > 0 then
    -- wrapped at 78 columns
    local line = "# Not used (the embedding, and the initialization of new weights):"
    local words = { line }
    for i, k in ipairs(unused) do words[#words + 1] = k .. (i < #unused and "," or ".") end
    line = words[1]
    for i = 2, #words do
      if #line + 1 + #words[i] > 78 then head[#head + 1] = line; line = "#" end
      line = line .. " " .. words[i]
    end
    head[#head + 1] = line
  end
  return table.concat(head, "\n") .. "\n\n" .. table.concat(body, "\n"):gsub("^\n", "") .. "\n"
end

M.MAX_BATCH = 8
M.MAX_SEQ_LEN = 2048

return M
