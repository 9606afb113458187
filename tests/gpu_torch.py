"""tests/gpu_torch.py PKGDIR NAME: checks of the emitted PyTorch module
NAME.py against its built library (PKGDIR/libNAME.so), on the GPU; run by
tests/gpu_torch.test. Prints TAP (the plan last). Comparisons of two GPU
paths use the relative L2 error in f64; the bound is TOL for f32 storage,
CMP_TOL_LOWP for bf16/f16 (their activations round differently when the
same tokens go through different kernels or call splits)."""
import ctypes
import importlib
import math
import os
import sys
import tempfile
import traceback

pkg, name = sys.argv[1], sys.argv[2]
sys.path.insert(0, pkg)
import torch  # noqa: E402

M = importlib.import_module(name)
LOWP = M.PRECISION != "f32"
TOL = 3e-2 if LOWP else 1e-4
dev = torch.device("cuda", torch.cuda.current_device())
B = min(2, M.MAX_BATCH)
T = min(16, M.MAX_SEQ_LEN)
T1 = T // 2 + 1

_n = [0, 0]


def tap(ok, desc, diag=None):
    _n[0] += 1
    if not ok:
        _n[1] += 1
    print("%s %d - %s" % ("ok" if ok else "not ok", _n[0], desc))
    if diag:
        print("# " + str(diag).replace("\n", "\n# "))
    sys.stdout.flush()


def skip(desc, why):
    _n[0] += 1
    print("ok %d - %s # SKIP %s" % (_n[0], desc, why))


def test(desc):
    """Run fn() -> (ok, diag) as one test; an exception is a failure."""
    def run(fn):
        try:
            res = fn()
            ok, diag = res if isinstance(res, tuple) else (res, None)
        except Exception:
            ok, diag = False, traceback.format_exc()
        tap(ok, desc, diag)
        return fn
    return run


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / max(b.norm().item(), 1e-30)).item()


def state_rel(s, r):
    """Largest rel-L2 over the fields; angles compared on the circle."""
    worst = 0.0
    for (f, _), a, b in zip(M.STATE_FIELDS, s.tensors(), r.tensors()):
        if f == "angle":
            a = b.double() + torch.remainder(a.double() - b.double() + math.pi, 2 * math.pi) - math.pi
        worst = max(worst, rel(a, b))
    return worst


def states_equal(s, r):
    return all(torch.equal(a, b) for a, b in zip(s.tensors(), r.tensors()))


def offsets(lens):
    """cu_seqlens of sequences of these lengths laid one after another."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def random_state(batch, scale=0.1):
    st = M.State(batch, dev)
    with torch.no_grad():
        for (f, _), t in zip(M.STATE_FIELDS, st.tensors()):
            if f == "angle":
                t.uniform_(0, 2 * math.pi)
            else:
                t.normal_(0, scale)
    return st


def graph_matches_eager(make_graph, n, step):
    """A graph made by make_graph(state) on a copy of a random state, and
    eager calls on the original: n steps, step(i, eager_state, graph) ->
    (eager out, graph out); every out and the final states bit-identical."""
    s1 = random_state(B)
    s2 = s1.clone()
    g = make_graph(s2)
    ok = True
    try:
        for i in range(n):
            a, b = step(i, s1, g)
            ok = ok and torch.equal(a, b)
        torch.cuda.synchronize()
        ok = ok and states_equal(s1, s2)
    finally:
        g.close()
    return ok


def raises(fn, exc, pattern):
    try:
        fn()
    except exc as e:
        return pattern in str(e), "%s: %s" % (type(e).__name__, e)
    except Exception as e:
        return False, "expected %s, got %s: %s" % (exc.__name__, type(e).__name__, e)
    return False, "expected %s, nothing raised" % exc.__name__


torch.manual_seed(0)
model = M.Model(None, seed=1)
u = torch.randn(B, T, M.IN_DIM, device=dev)
out_ref, st_ref = model.prefill(u)
torch.cuda.synchronize()


# ---- the parameter table and the weights ----

@test("parameters: the library's table by name, views into model.weights, .grad views into model.grads")
def _():
    named = dict(model.named_parameters())   # the module tree's order, not the blob's
    base, gbase = model.weights.data_ptr(), model.grads.data_ptr()
    ok = len(named) == M.N_PARAMS and sorted(named) == sorted(model.param_names)
    for n, (off, numel, shape) in zip(model.param_names, model._layout):
        p = named.get(n)
        ok = ok and p is not None and p.data_ptr() == base + 4 * off and tuple(p.shape) == shape
        ok = ok and p.grad is not None and p.grad.data_ptr() == gbase + 4 * off
    return ok, None if ok else sorted(named)[:5]


@test("state_dict round trip, with and without a 'backbone.' prefix")
def _():
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    m2 = M.Model(sd)
    flipped = {(k[len("backbone."):] if k.startswith("backbone.") else "backbone." + k): v for k, v in sd.items()}
    m3 = M.Model({k: v.cpu() for k, v in flipped.items()})   # on the CPU: copied to the device
    return torch.equal(m2.weights, model.weights) and torch.equal(m3.weights, model.weights)


@test("state_dict errors name every missing, unexpected and mis-shaped tensor; strict=False ignores extras")
def _():
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = list(sd)
    gone, bad = names[1], names[-1]
    del sd[gone]
    sd[bad] = torch.zeros(3, 5)
    sd["lm_head.weight"] = torch.zeros(2, 2)
    try:
        M.Model(sd)
        return False, "no error"
    except KeyError as e:
        msg = str(e)
    ok = ("missing: " + gone) in msg and "unexpected: lm_head.weight" in msg and ("wrong shape: " + bad + " (3, 5)") in msg
    sd2 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd2["lm_head.weight"] = torch.zeros(2, 2)
    m = M.Model(sd2, strict=False)
    return ok and torch.equal(m.weights, model.weights), msg


@test("safetensors: save_safetensors then Model(path) gives the same weights")
def _():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "w.safetensors")
        model.save_safetensors(p)
        m = M.Model(p)
        return torch.equal(m.weights, model.weights)


# ---- inference ----

@test("prefill: the same results as direct ctypes calls of the C API (bit-identical)")
def _():
    lib = model._lib
    h = ctypes.c_void_p()
    lib.call("create", ctypes.byref(h), torch.cuda.current_stream().cuda_stream)
    try:
        lib.call("set_weights", h, model.weights.data_ptr(), M.WEIGHTS_FLOATS)
        st = M.State(B, dev)
        out = torch.empty(B, T, M.D_MODEL, device=dev)
        lib.call("prefill", h, B, T, u.data_ptr(), out.data_ptr(), *[t.data_ptr() for t in st.tensors()])
        torch.cuda.synchronize()
    finally:
        lib.destroy(h)
    return torch.equal(out, out_ref) and states_equal(st, st_ref)


@test("selfcheck (the library vs the f64 reference) passes from Python")
def _():
    r = model.selfcheck()
    return r["passed"], r


@test("prefill of T tokens == prefill of T1 then T-T1 with the state carried")
def _():
    st0 = random_state(B)
    o, s = model.prefill(u, st0.clone())
    o1, s12 = model.prefill(u[:, :T1].contiguous(), st0.clone())
    o2, s12 = model.prefill(u[:, T1:].contiguous(), s12)
    e, es = rel(torch.cat([o1, o2], 1), o), state_rel(s12, s)
    return e < TOL and es < TOL, "out rel %.3g, state rel %.3g (tol %g)" % (e, es, TOL)


@test("decode_step x k == prefill of the k tokens")
def _():
    k = min(6, T)
    st0 = random_state(B)
    o, s = model.prefill(u[:, :k].contiguous(), st0.clone())
    sd = st0.clone()
    outs = [model.decode_step(u[:, t].contiguous(), sd) for t in range(k)]
    e, es = rel(torch.stack(outs, 1), o), state_rel(sd, s)
    return e < TOL and es < TOL, "out rel %.3g, state rel %.3g (tol %g)" % (e, es, TOL)


@test("burn_in == the last timestep of prefill, same final state")
def _():
    last, s = model.burn_in(u)
    e, es = rel(last, out_ref[:, -1]), state_rel(s, st_ref)
    return e < TOL and es < TOL, "out rel %.3g, state rel %.3g" % (e, es)


@test("decode graph == eager decode_step (bit-identical outputs and states)")
def _():
    def step(i, s1, g):
        x = torch.randn(B, M.IN_DIM, device=dev)
        return model.decode_step(x, s1), g.step(x).clone()
    return graph_matches_eager(model.decode_graph, 4, step)


RB = min(4, M.MAX_BATCH)


@test("decode_step with a reset mask == decode_step after zeroing those streams' states (bit-identical)")
def _():
    s1 = random_state(RB)
    s2 = s1.clone()
    ok = True
    for step in range(3):
        x = torch.randn(RB, M.IN_DIM, device=dev)
        mask = torch.tensor([(i + step) % 2 == 0 for i in range(RB)], device=dev)   # bool, changing
        a = model.decode_step(x, s1, reset=mask)
        with torch.no_grad():
            for t in s2.tensors():
                t[:, mask] = 0.0
        b = model.decode_step(x, s2)
        ok = ok and torch.equal(a, b)
    torch.cuda.synchronize()
    return ok and states_equal(s1, s2)


if model._lib.set_decode_tile is None:
    skip("set_decode_tile: every tile gives the same bits", "Mamba-3 has no single-launch decode tile")
else:
    @test("set_decode_tile: tile 1 == the per-call tile (bit-identical); a bad tile raises")
    def _():
        TB = M.MAX_BATCH
        x = torch.randn(TB, M.IN_DIM, device=dev)
        s1 = random_state(TB)
        s2 = s1.clone()
        model.set_decode_tile(1)
        try:
            a = model.decode_step(x, s1)
        finally:
            model.set_decode_tile(0)
        b = model.decode_step(x, s2)
        torch.cuda.synchronize()
        bad = raises(lambda: model.set_decode_tile(-1), RuntimeError, "out of range")
        return torch.equal(a, b) and states_equal(s1, s2) and bad[0], bad[1]


@test("decode graph with a reset mask == eager decode_step with it (bit-identical); mask checks")
def _():
    s1 = random_state(RB)
    s2 = s1.clone()
    g = model.decode_graph(s2, reset=True)
    ok = True
    try:
        for step in range(3):
            x = torch.randn(RB, M.IN_DIM, device=dev)
            mask = torch.tensor([int(i == step % RB) for i in range(RB)], dtype=torch.uint8, device=dev)
            a = model.decode_step(x, s1, reset=mask)
            b = g.step(x, mask).clone()
            ok = ok and torch.equal(a, b)
        torch.cuda.synchronize()
        ok = ok and states_equal(s1, s2)
        x = torch.randn(RB, M.IN_DIM, device=dev)
        checks = [raises(lambda: model.decode_step(x, s1, reset=torch.zeros(RB, device=dev)), TypeError, "uint8"),
                  raises(lambda: model.decode_step(x, s1, reset=torch.zeros(RB + 1, dtype=torch.bool, device=dev)),
                         ValueError, "one entry per stream"),
                  raises(lambda: model.decode_step(x, s1, reset=torch.zeros(RB, dtype=torch.bool)), ValueError, "on cpu")]
        ok = ok and all(c[0] for c in checks)
    finally:
        g.close()
    return ok, "; ".join(c[1] for c in checks) if ok else None


@test("prefill with starts: an all-zero mask gives prefill's bits; starts at t = 0 and mid-window restart there "
      "(== the window split by hand); burn_in with the mask; mask checks")
def _():
    s0 = random_state(B)
    zero = torch.zeros(B, T, dtype=torch.bool, device=dev)
    a, sa = model.prefill(u, s0.clone(), starts=zero)
    b, sb = model.prefill(u, s0.clone())
    ok = torch.equal(a, b) and states_equal(sa, sb)
    first = zero.clone()
    first[:, 0] = True
    c, sc = model.prefill(u, s0.clone(), starts=first)   # the random state ignored
    e0, es0 = rel(c, out_ref), state_rel(sc, st_ref)
    mid = zero.clone()
    mid[:, T1] = True
    d, sd = model.prefill(u, s0.clone(), starts=mid.to(torch.uint8))
    h, _ = model.prefill(u[:, :T1].contiguous(), s0.clone())
    t2, st2 = model.prefill(u[:, T1:].contiguous())
    e1, e2, es = rel(d[:, :T1], h), rel(d[:, T1:], t2), state_rel(sd, st2)
    last, sl = model.burn_in(u, s0.clone(), starts=mid)
    eb = rel(last, d[:, -1])
    ok = ok and max(e0, es0, e1, e2, es, eb) < TOL
    x = u
    checks = [raises(lambda: model.prefill(x, starts=torch.zeros(B, T, device=dev)), TypeError, "uint8"),
              raises(lambda: model.prefill(x, starts=torch.zeros(B, T + 1, dtype=torch.bool, device=dev)),
                     ValueError, "one entry per token"),
              raises(lambda: model.prefill(x, starts=torch.zeros(B, T, dtype=torch.bool)), ValueError, "on cpu")]
    ok = ok and all(c_[0] for c_ in checks)
    return ok, "t=0: %.3g/%.3g, split: %.3g %.3g state %.3g, burn_in %.3g; %s" % (
        e0, es0, e1, e2, es, eb, "; ".join(c_[1] for c_ in checks))


if M.HAS_TRAINING:
    @test("forward with starts (training): out as prefill with the mask; no gradient crosses a start; a stream "
          "starting at t = 0 gets zero initial-state gradients")
    def _():
        m2 = M.Model({k: v.detach().clone() for k, v in model.state_dict().items()})
        s0 = random_state(B)
        for t in s0.tensors():
            t.requires_grad_(True)
        x = u.clone().requires_grad_(True)
        mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
        mask[:, T1] = True
        mask[0, 0] = True
        out, _ = m2.forward(x, s0, starts=mask)
        with torch.no_grad():
            ref, _ = m2.prefill(u, M.State(B, dev, [t.detach().clone() for t in s0.tensors()]), starts=mask)
        e = rel(out, ref)
        out[:, T1:].pow(2).sum().backward()   # only outputs from the start on
        cut = x.grad[:, :T1].abs().max().item()
        s0g = max(t.grad[:, 0].abs().max().item() for t in s0.tensors())
        ok = e < TOL and cut == 0.0 and s0g == 0.0 and x.grad[:, T1:].abs().max().item() > 0
        return ok, "out rel %.3g, |du| before the start %.3g, |d state0| of stream 0 %.3g" % (e, cut, s0g)


@test("prefill_packed: each sequence's out and final state == prefill of that sequence alone; bad offsets refused")
def _():
    lens = [1, 5, T][:min(3, M.MAX_BATCH)]
    cu = offsets(lens)
    x = torch.randn(cu[-1], M.IN_DIM, device=dev)
    out, st = model.prefill_packed(x, cu)
    worst = 0.0
    for i, n in enumerate(lens):
        o1, s1 = model.prefill(x[cu[i]:cu[i + 1]].unsqueeze(0).contiguous())
        worst = max(worst, rel(out[cu[i]:cu[i + 1]], o1[0]))
        si = M.State(1, dev, [t[:, i:i + 1].contiguous() for t in st.tensors()])
        worst = max(worst, state_rel(si, s1))
    bad = [raises(lambda: model.prefill_packed(x, [1] + cu[1:]), M.LibraryError, "cu_seqlens"),
           raises(lambda: model.prefill_packed(x, cu[:-1] + [cu[-1] + 1]), ValueError, "rows")]
    if len(lens) > 1:
        bad.append(raises(lambda: model.prefill_packed(x, [0, 0] + cu[2:]), M.LibraryError, "cu_seqlens"))  # empty
    ok = worst < TOL and all(b[0] for b in bad)
    return ok, "worst rel %.3g; %s" % (worst, "; ".join(b[1] for b in bad))


@test("prefill_packed from given states (two sequences of one length): each sequence's out and final state == "
      "prefill of that sequence alone from its state")
def _():
    lens = [5, 1, 5][:min(3, M.MAX_BATCH)]
    cu = offsets(lens)
    x = torch.randn(cu[-1], M.IN_DIM, device=dev)
    s0 = random_state(len(lens))
    st = s0.clone()
    out, st = model.prefill_packed(x, cu, st)
    worst = 0.0
    for i, n in enumerate(lens):
        si0 = M.State(1, dev, [t[:, i:i + 1].contiguous() for t in s0.tensors()])
        o1, s1 = model.prefill(x[cu[i]:cu[i + 1]].unsqueeze(0).contiguous(), si0)
        worst = max(worst, rel(out[cu[i]:cu[i + 1]], o1[0]))
        si = M.State(1, dev, [t[:, i:i + 1].contiguous() for t in st.tensors()])
        worst = max(worst, state_rel(si, s1))
    return worst < TOL, "worst rel %.3g" % worst


@test("prefill graph with a start mask == eager prefill with it over three windows (bit-identical)")
def _():
    def step(w, s1, g):
        x = torch.randn(B, T, M.IN_DIM, device=dev)
        mask = torch.zeros(B, T, dtype=torch.bool, device=dev)
        mask[:, (3 * w + 1) % T] = True
        return model.prefill(x, s1, starts=mask)[0], g.run(x, mask).clone()
    return graph_matches_eager(lambda st: model.prefill_graph(st, T, starts=True), 3, step)


@test("prefill graph == eager prefill over three windows (bit-identical outputs and states)")
def _():
    def step(i, s1, g):
        x = torch.randn(B, T, M.IN_DIM, device=dev)
        return model.prefill(x, s1)[0], g.run(x).clone()
    return graph_matches_eager(lambda st: model.prefill_graph(st, T), 3, step)


if M.HAS_TRAINING:
    @test("forward_packed (training): out == prefill_packed; du and every parameter gradient == the sequences "
          "run one by one (parameter gradients summed)")
    def _():
        m2 = M.Model({k: v.detach().clone() for k, v in model.state_dict().items()})
        params = list(m2.parameters())
        lens = [1, 5, T][:min(3, M.MAX_BATCH)]
        cu = offsets(lens)
        x = torch.randn(cu[-1], M.IN_DIM, device=dev, requires_grad=True)
        out, _ = m2.forward_packed(x, cu)
        with torch.no_grad():
            ref, _ = m2.prefill_packed(x.detach(), cu)
        # loss = sum(out * wt), wt random: out.pow(2).sum() would be nearly
        # constant behind the final RMSNorm (its gradient is rounding noise)
        wt = torch.randn(out.shape, device=dev)
        gp = torch.autograd.grad((out * wt).sum(), [x] + params)
        # the same without a prefill between the forward and its backward
        out2, _ = m2.forward_packed(x, cu)
        gp2 = torch.autograd.grad((out2 * wt).sum(), [x] + params)
        gx = torch.zeros_like(x)
        ox = torch.zeros_like(out)
        gw = [torch.zeros_like(p) for p in params]
        for i in range(len(lens)):
            xi = x.detach()[cu[i]:cu[i + 1]].unsqueeze(0).contiguous().requires_grad_(True)
            oi, _ = m2(xi)
            gi = torch.autograd.grad((oi[0] * wt[cu[i]:cu[i + 1]]).sum(), [xi] + params)
            gx[cu[i]:cu[i + 1]] = gi[0][0]
            ox[cu[i]:cu[i + 1]] = oi.detach()[0]
            for a, b in zip(gw, gi[1:]):
                a += b
        e_out = max(rel(out, ref), rel(out, ox))
        e_dx = rel(gp[0], gx)
        names = [n for n, _ in m2.named_parameters()]
        e_w, worst = max((rel(a, b), n) for a, b, n in zip(gp[1:], gw, names) if b.norm().item() > 0)
        # where it differs: du per sequence (lengths lens), the worst parameter
        per_seq = ", ".join("%d: %.3g" % (n, rel(gp[0][cu[i]:cu[i + 1]], gx[cu[i]:cu[i + 1]]))
                            for i, n in enumerate(lens))
        e_dx2 = rel(gp2[0], gx)
        e_w2 = max(rel(a, b) for a, b in zip(gp2[1:], gw) if b.norm().item() > 0)
        return max(e_out, e_dx, e_w, e_dx2, e_w2) < TOL, "out %.3g (vs prefill_packed %.3g, vs each sequence's " \
            "forward %.3g), du %.3g (per sequence length %s), worst " \
            "parameter gradient %.3g (%s); without the prefill between forward and backward: du %.3g, worst " \
            "parameter gradient %.3g" % (e_out, rel(out, ref), rel(out, ox), e_dx, per_seq, e_w, worst, e_dx2, e_w2)


if M.HAS_TRAINING:
    @test("forward_packed from given states (training): out, du, the initial-state gradients and every parameter "
          "gradient == the sequences run one by one from their states")
    def _():
        m2 = M.Model({k: v.detach().clone() for k, v in model.state_dict().items()})
        params = list(m2.parameters())
        lens = [5, 1, T][:min(3, M.MAX_BATCH)]
        cu = offsets(lens)
        x = torch.randn(cu[-1], M.IN_DIM, device=dev, requires_grad=True)
        s0 = random_state(len(lens))
        for t in s0.tensors():
            t.requires_grad_(True)
        out, _ = m2.forward_packed(x, cu, s0)
        wt = torch.randn(out.shape, device=dev)   # loss = sum(out * wt) (see the packed test above)
        gp = torch.autograd.grad((out * wt).sum(), [x] + list(s0.tensors()) + params)
        ns = len(s0.tensors())
        gx = torch.zeros_like(x)
        gs = [torch.zeros_like(t) for t in s0.tensors()]
        gw = [torch.zeros_like(p) for p in params]
        ox = torch.zeros_like(out)
        for i in range(len(lens)):
            xi = x.detach()[cu[i]:cu[i + 1]].unsqueeze(0).contiguous().requires_grad_(True)
            si = M.State(1, dev, [t.detach()[:, i:i + 1].contiguous().requires_grad_(True) for t in s0.tensors()])
            oi, _ = m2(xi, si)
            gi = torch.autograd.grad((oi[0] * wt[cu[i]:cu[i + 1]]).sum(), [xi] + list(si.tensors()) + params)
            gx[cu[i]:cu[i + 1]] = gi[0][0]
            ox[cu[i]:cu[i + 1]] = oi.detach()[0]
            for a, b in zip(gs, gi[1:1 + ns]):
                a[:, i:i + 1] = b
            for a, b in zip(gw, gi[1 + ns:]):
                a += b
        e_out, e_dx = rel(out, ox), rel(gp[0], gx)
        e_s = max(rel(a, b) for a, b in zip(gp[1:1 + ns], gs) if b.norm().item() > 0)
        e_w = max(rel(a, b) for a, b in zip(gp[1 + ns:], gw) if b.norm().item() > 0)
        return max(e_out, e_dx, e_s, e_w) < TOL, "out %.3g, du %.3g, initial-state gradients %.3g, worst " \
            "parameter gradient %.3g" % (e_out, e_dx, e_s, e_w)


@test("calls run on the current stream: prefill on a side stream == on the default stream")
def _():
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o, st = model.prefill(u)
        on_side = model._stream == s.cuda_stream
    s.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    return on_side and torch.equal(o, out_ref) and states_equal(st, st_ref)


# ---- argument checks and errors ----

def arg_checks():
    nc = torch.randn(B, M.IN_DIM, T, device=dev).transpose(1, 2)
    mis = torch.zeros(B * T * M.IN_DIM + 1, device=dev)[1:].view(B, T, M.IN_DIM)
    return [
        ("a float64 input", lambda: model.prefill(u.double()), TypeError, "expected torch.float32"),
        ("a CPU input", lambda: model.prefill(u.cpu()), ValueError, "on cpu"),
        ("a wrong width", lambda: model.prefill(u[:, :, :-1]), ValueError, "shape"),
        ("a non-contiguous input", lambda: model.prefill(nc), ValueError, "not contiguous"),
        ("a misaligned input", lambda: model.prefill(mis), ValueError, "16-byte aligned"),
        ("batch > MAX_BATCH", lambda: model.prefill(torch.zeros(M.MAX_BATCH + 1, 1, M.IN_DIM, device=dev)),
         ValueError, "MAX_BATCH"),
        ("seqlen > MAX_SEQ_LEN", lambda: model.prefill(torch.zeros(1, M.MAX_SEQ_LEN + 1, M.IN_DIM, device=dev)),
         ValueError, "MAX_SEQ_LEN"),
        ("a state of another batch", lambda: model.prefill(u, M.State(B + 1 if B < M.MAX_BATCH else 1, dev)),
         ValueError, "state of batch"),
        ("decode without a state", lambda: model.decode_step(u[:, 0].contiguous(), None), ValueError, "State is required"),
        ("a bad scan choice", lambda: model.set_scan("fast"), ValueError, "one of"),
        ("a half-precision model", lambda: model.half(), RuntimeError, "cannot be moved or converted"),
    ]


for what, fn, exc, pat in arg_checks():
    test("argument check: %s raises %s" % (what, exc.__name__))(lambda fn=fn, exc=exc, pat=pat: raises(fn, exc, pat))


@test("a library status becomes LibraryError (name and mg_last_error message)")
def _():
    try:
        model._lib.call("set_scan", model._handle, 99)
    except M.LibraryError as e:
        return e.status_name == "MG_ERR_INVALID_ARG" and e.message != "" and name + "_set_scan" in str(e), str(e)
    return False, "nothing raised"


# ---- training ----

if not M.HAS_TRAINING:
    skip("training", "the spec emits no training")
else:
    @test("training forward == prefill (out and final state); the initial state is left as it was")
    def _():
        st0 = random_state(B)
        keep = st0.clone()
        o, s = model(u, st0)
        po, ps = model.prefill(u, st0.clone())
        e, es = rel(o, po), state_rel(s, ps)
        return e < TOL and es < TOL and states_equal(st0, keep) and o.requires_grad, \
            "out rel %.3g, state rel %.3g" % (e, es)

    def loss_of(m, x, st, R):
        with torch.no_grad():
            o, _ = m.prefill(x, st.clone())
        return (o.double() * R.double()).sum().item()

    if LOWP:
        skip("gradients vs central finite differences", "f32 storage only")
    else:
        @test("gradients vs central finite differences (directional, f64 loss of f32 outputs)")
        def _():
            torch.manual_seed(3)
            st0 = random_state(B)
            for t in st0.tensors():
                t.requires_grad_(True)
            x = u.clone().requires_grad_(True)
            R = torch.randn(B, T, M.D_MODEL, device=dev)
            model.zero_grad()
            o, _ = model(x, st0)
            (o * R).sum().backward()
            g = model.grads.clone()
            names = model.param_names
            pick = [names[0], names[-1]] + [n for n in names if n.endswith(
                ("layers.0.mixer.in_proj.weight", "layers.0.mixer.out_proj.weight", "layers.0.mixer.D",
                 "layers.0.mixer.dt_bias", "layers.0.mixer.A_log", "layers.0.mixer.conv1d.weight",
                 "layers.0.mixer.B_bias"))]
            h = 1e-3
            bad, lines = [], []
            base = st0.clone()

            def judge(what, an, fd):
                lines.append("%s: analytic %.6g fd %.6g" % (what, an, fd))
                if abs(an - fd) > 2e-2 * max(abs(an), abs(fd)) + 1e-2:
                    bad.append(what)

            for n in pick:
                off, numel, _ = model._layout[names.index(n)]
                v = torch.randn(numel, device=dev)
                an = (g[off:off + numel].double() * v.double()).sum().item()
                w = model.weights
                keep = w[off:off + numel].clone()
                with torch.no_grad():
                    w[off:off + numel] = keep + h * v
                lp = loss_of(model, u, base, R)
                with torch.no_grad():
                    w[off:off + numel] = keep - h * v
                lm = loss_of(model, u, base, R)
                with torch.no_grad():
                    w[off:off + numel] = keep   # exactly as it was
                judge(n, an, (lp - lm) / (2 * h))
            v = torch.randn_like(u)
            judge("u", (x.grad.double() * v.double()).sum().item(),
                  (loss_of(model, u + h * v, base, R) - loss_of(model, u - h * v, base, R)) / (2 * h))
            for (f, _), t, t0 in zip(M.STATE_FIELDS, st0.tensors(), base.tensors()):
                v = torch.randn_like(t0)
                sp, sm = base.clone(), base.clone()
                with torch.no_grad():
                    getattr(sp, f).add_(h * v)
                    getattr(sm, f).sub_(h * v)
                judge("initial " + f, (t.grad.double() * v.double()).sum().item(),
                      (loss_of(model, u, sp, R) - loss_of(model, u, sm, R)) / (2 * h))
            return not bad, "\n".join(lines)

    @test("gradients accumulate across backward calls in the .grad views")
    def _():
        model.zero_grad()
        o, _ = model(u)
        o.square().mean().backward()
        g1 = model.grads.clone()
        o, _ = model(u)
        o.square().mean().backward()
        return rel(model.grads, 2 * g1) < 1e-6

    @test("backward through a forward that is no longer the last one raises; the last one works")
    def _():
        o1, _ = model(u)
        o2, _ = model(u)
        ok, diag = raises(lambda: o1.sum().backward(), RuntimeError, "no longer the last one")
        o2.sum().backward()
        return ok, diag

    @test("torch.optim.AdamW on the parameter views == the library's fused AdamW (3 steps)")
    def _():
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ma, mb = M.Model(sd), M.Model(sd)
        w0 = ma.weights.clone()
        target = torch.randn(B, T, M.D_MODEL, device=dev)
        opt = torch.optim.AdamW(ma.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                foreach=False)
        same_grads = None
        for step in range(3):
            opt.zero_grad()   # set_to_none: the next backward links the views again
            mb.zero_grad()
            for m in (ma, mb):
                o, _ = m(u)
                ((o - target) ** 2).mean().backward()
            if same_grads is None:   # same weights at step 1 (then the two updates round apart)
                same_grads = torch.equal(ma.grads, mb.grads)
            opt.step()
            mb.adamw_step(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        e = rel(ma.weights - w0, mb.weights - w0)
        linked = all(p.grad is not None and p.grad.data_ptr() == ma.grads.data_ptr() + 4 * off
                     for p, (off, _, _) in zip(ma._params, ma._layout))
        # inference follows the updated blob (the low-precision weight copy is refreshed)
        oa, _ = ma.prefill(u)
        of, _ = M.Model(ma.state_dict()).prefill(u)
        tol = 1e-2 if LOWP else 1e-4
        return same_grads and e < tol and linked and torch.equal(oa, of), \
            "same grads at step 1: %s, update rel %.3g (tol %g), grads linked %s, prefill follows %s" % (
                same_grads, e, tol, linked, torch.equal(oa, of))

model.close()
print("1..%d" % _n[0])
sys.exit(1 if _n[1] else 0)
