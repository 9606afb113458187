-- mg/cost.lua: the cost model the benchmarks quote figures against: floating
-- point operations and bytes moved through device memory per token, and the
-- bytes of the weights a call reads once. Lua holds this arithmetic so the
-- bench templates only print it; the bench divides by measured time and the
-- measured ceilings (copy bandwidth, GEMM rate) of the GPU it runs on.
--
-- Bytes are what the emitted pipeline moves by design (each kernel's reads and
-- writes of activations; the residual stream f32), not a lower bound: the
-- fraction of the copy ceiling then says how well each pass streams.

local M = {}

-- Mamba-1 forward (prefill) per token, and the per-call weight bytes.
function M.mamba1(d)
  local a = d.act_size
  local D, E, N, K, R, XP, L = d.D, d.E, d.N, d.K, d.R, d.XP, d.L
  local gemm = 2 * (2 * E * D) + 2 * (XP * E) + 2 * (E * R) + 2 * (D * E)
  -- scan: dA = exp (1), s = dA*s + dB*x (3), y += s*C (2) per state; conv 2K per channel
  local other = 6 * E * N + 2 * K * E + 10 * E + 8 * D
  local layer_bytes =
      D * 4 + D * a            -- rmsnorm: read h (f32), write hn
    + D * a + 2 * E * a        -- in_proj: read hn, write xz
    + E * a + E * a            -- conv: read x, write xc
    + E * a + XP * a           -- x_proj: read xc, write dbl
    + R * a + E * a            -- dt_proj: read dt_low, write dt
    + 3 * E * a + 2 * N * a + E * a  -- scan: read xc, dt, z, B, C; write g
    + E * a + 2 * D * 4        -- out_proj: read g, read+write h
  local io_bytes = d.in_dim * 4 + D * 4 + 2 * D * 4  -- u in, h init, norm_f in/out
  local in_gemm = d.input_dim > 0 and 2 * d.input_dim * D or 0
  -- weights each call reads: GEMM weights in the storage dtype, the rest f32
  local gemm_w = L * (2 * E * D + XP * E + E * R + D * E) + (d.input_dim > 0 and d.input_dim * D or 0)
  local small_w = d.weights_total - gemm_w
  return {
    gemm_flops_per_token = L * gemm + in_gemm,
    other_flops_per_token = L * other,
    bytes_per_token = L * layer_bytes + io_bytes,
    weight_bytes = gemm_w * a + small_w * 4,
    -- one decode step per stream: the state is read and written once per token
    state_bytes_per_seq = L * (E * (K - 1) + E * N) * 4 * 2,
    -- a training step, approximately: backward = 2x the forward's GEMM work
    -- and traffic; AdamW reads weights, grads, m, v and writes weights, m, v
    -- (f32) once
    train_flops_per_token = 3 * (L * gemm + in_gemm) + 3 * L * other,
    train_bytes_per_token = 3 * (L * layer_bytes + io_bytes),
    train_weight_bytes = 3 * (gemm_w * a + small_w * 4) + 7 * 4 * d.weights_total,
  }
end

-- The shapes a model's bench program measures: prefill at the largest batch
-- for a short window (32 tokens, the RL replay case) and the longest sequence,
-- and one stream at the longest sequence; decode at batch 1 and the largest.
function M.bench_shapes(d)
  local B, T = d.max_batch, d.max_seq_len
  local prefill, seen = {}, {}
  local function add(b, t)
    local k = b .. "x" .. t
    if not seen[k] then seen[k] = true; prefill[#prefill + 1] = { b, t } end
  end
  add(B, math.min(32, T))
  add(B, T)
  add(1, T)
  local decode = { 1 }
  if B > 1 then decode[2] = B end
  return { prefill = prefill, decode = decode }
end

return M
