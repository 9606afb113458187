# ---- the code (templates/python/torch_module.py, the same for every model) ----
# Everything model-specific comes from the constants above and from the
# library itself (its parameter table and state sizes), so that this code
# cannot drift from the C API it binds: the ctypes signatures below are those
# of NAME.h and NAME_train.h.

import ctypes
import os

try:
    import torch
except ImportError as _e:   # the one dependency besides the library
    raise ImportError("%s.py needs PyTorch with CUDA (import torch failed: %s)" % (NAME, _e)) from _e

__all__ = ["Model", "State", "DecodeGraph", "PrefillGraph", "LibraryError", "load_library"]

_f32 = torch.float32


class LibraryError(RuntimeError):
    """A call of lib{NAME} failed: .status (the mg_status code), .status_name
    (e.g. "MG_ERR_SIZE"), .message (mg_last_error()), .function."""

    def __init__(self, status, status_name, message, function):
        self.status, self.status_name, self.message, self.function = status, status_name, message, function
        super().__init__("%s: %s: %s" % (function, status_name, message))


# ---- the library: ctypes declarations ----

class _ParamInfo(ctypes.Structure):    # NAME_param_info
    _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_size_t), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int * 4), ("numel", ctypes.c_size_t)]


class _AdamWParams(ctypes.Structure):   # NAME_adamw_params
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float), ("max_grad_norm", ctypes.c_float),
                ("step", ctypes.c_int), ("wd_matrices_only", ctypes.c_int)]


class _Err(ctypes.Structure):           # mg_err (mg_compare.h)
    _fields_ = [("max_abs", ctypes.c_double), ("rel_l2", ctypes.c_double), ("ref_norm", ctypes.c_double),
                ("n", ctypes.c_size_t), ("n_nonfinite", ctypes.c_size_t)]


class _CheckOpts(ctypes.Structure):     # NAME_check_opts
    _fields_ = [("batch", ctypes.c_int), ("seqlen", ctypes.c_int), ("seed", ctypes.c_ulonglong),
                ("with_state", ctypes.c_int), ("tol", ctypes.c_double)]


class _CheckReport(ctypes.Structure):   # NAME_check_report
    _fields_ = ([("out", _Err)] + [(f, _Err) for f in CHECK_REPORT_FIELDS]
                + [("tol", ctypes.c_double), ("passed", ctypes.c_int)])


_P = ctypes.c_void_p       # device pointers and handles
_I = ctypes.c_int
_Z = ctypes.c_size_t
_NS = len(STATE_FIELDS)
_STATES = (_P,) * _NS

# name (without the NAME_ prefix): (restype, argtypes); NAME.h
_API = {
    "param_count": (_Z, ()),
    "param_table": (ctypes.POINTER(_ParamInfo), ()),
    "create": (_I, (ctypes.POINTER(_P), _P)),
    "destroy": (None, (_P,)),
    "set_stream": (_I, (_P, _P)),
    "workspace_bytes": (_Z, (_P,)),
    "set_weights": (_I, (_P, _P, _Z)),
    "prefill": (_I, (_P, _I, _I, _P, _P) + _STATES),
    "decode_step": (_I, (_P, _I, _P, _P) + _STATES),
    "burn_in": (_I, (_P, _I, _I, _P, _P) + _STATES),
    "prefill_starts": (_I, (_P, _I, _I, _P, _P) + _STATES + (_P,)),
    "burn_in_starts": (_I, (_P, _I, _I, _P, _P) + _STATES + (_P,)),
    "prefill_packed": (_I, (_P, _I, _P, _P, _P) + _STATES),
    "prefill_packed_from": (_I, (_P, _I, _P, _P, _P) + _STATES),
    "decode_graph_create": (_I, (_P, _I, _P, _P) + _STATES + (ctypes.POINTER(_P),)),
    "decode_step_reset": (_I, (_P, _I, _P, _P) + _STATES + (_P,)),
    "decode_graph_create_reset": (_I, (_P, _I, _P, _P) + _STATES + (_P, ctypes.POINTER(_P))),
    "prefill_graph_create": (_I, (_P, _I, _I, _P, _P) + _STATES + (ctypes.POINTER(_P),)),
    "prefill_graph_create_starts": (_I, (_P, _I, _I, _P, _P) + _STATES + (_P, ctypes.POINTER(_P))),
    "decode_graph_launch": (_I, (_P,)),
    "decode_graph_destroy": (None, (_P,)),
    "set_scan": (_I, (_P, _I)),
    "selfcheck": (_I, (ctypes.POINTER(_CheckOpts), ctypes.POINTER(_CheckReport))),
    "load_safetensors": (_I, (ctypes.c_char_p, ctypes.c_char_p, _P, _Z)),
    "save_safetensors": (_I, (ctypes.c_char_p, _P, _Z, _I)),
}
_API.update({fn: (_Z, (_I,)) for fn in STATE_FLOATS_FNS})
# NAME_train.h (when the spec emits training)
_TRAIN_API = {
    "trainer_create": (_I, (ctypes.POINTER(_P), _P)),
    "trainer_destroy": (None, (_P,)),
    "trainer_set_stream": (_I, (_P, _P)),
    "trainer_workspace_bytes": (_Z, ()),
    "trainer_set_scan": (_I, (_P, _I)),
    "trainer_set_starts": (_I, (_P, _P)),
    "trainer_set_loss_scaling": (_I, (_P, ctypes.c_float, _I)),
    "forward_train": (_I, (_P, _P, _I, _I, _P, _P) + _STATES),
    "forward_train_packed": (_I, (_P, _P, _I, _P, _P, _P) + _STATES),
    "forward_train_packed_from": (_I, (_P, _P, _I, _P, _P, _P) + _STATES),
    "backward": (_I, (_P, _P, _P, _P) + _STATES),
    "adamw_step": (_I, (_P, _P, _P, _P, _P, ctypes.POINTER(_AdamWParams))),
}
# Only some libraries have these (Mamba-1: the decode kernel choice).
_OPTIONAL_API = {
    "set_decode_fused": (_I, (_P, _I)),
    "set_decode_tile": (_I, (_P, _I)),
}

SCAN = {"spec": 0, "sequential": 1, "chunked": 2}   # NAME_SCAN_SPEC, _SEQUENTIAL, _CHUNKED

_libs = {}


class _Lib:
    """lib{NAME}: its functions as attributes without the NAME_ prefix
    (`lib.prefill`), the runtime's mg_status_name / mg_last_error, and the
    path it was loaded from."""

    def __init__(self, path):
        self.path = path
        self.dll = ctypes.CDLL(path)
        api = dict(_API)
        if HAS_TRAINING:
            api.update(_TRAIN_API)
        for fn, (res, args) in api.items():
            setattr(self, fn, self._declare(NAME + "_" + fn, res, args))
        for fn, (res, args) in _OPTIONAL_API.items():
            setattr(self, fn, self._declare(NAME + "_" + fn, res, args) if hasattr(self.dll, NAME + "_" + fn) else None)
        # the runtime (libmgrt, a dependency of the library)
        self.status_name = self._declare("mg_status_name", ctypes.c_char_p, (_I,))
        self.last_error = self._declare("mg_last_error", ctypes.c_char_p, ())
        self._check_model()

    def _declare(self, sym, res, args):
        try:
            f = getattr(self.dll, sym)
        except AttributeError:
            raise OSError("%s: no symbol %s: not the library of %s.py (spec sha256 %s); rebuild it"
                          % (self.path, sym, NAME, SPEC_SHA256[:16])) from None
        f.restype, f.argtypes = res, args
        return f

    def _check_model(self):
        # The module's constants and the library must describe one model.
        n = self.param_count()
        table = self.param_table()
        end = max((table[i].offset + table[i].numel for i in range(n)), default=0)
        sizes = [getattr(self, fn)(1) for fn in STATE_FLOATS_FNS]
        want = [N_LAYERS * _numel(shape) for _, shape in STATE_FIELDS]
        if n != N_PARAMS or end > WEIGHTS_FLOATS or sizes != want:
            raise OSError("%s does not match %s.py (%d parameters ending at %d floats, states %s; expected %d, "
                          "<= %d, %s): rebuild the library from the spec (sha256 %s)"
                          % (self.path, NAME, n, end, sizes, N_PARAMS, WEIGHTS_FLOATS, want, SPEC_SHA256[:16]))

    def check(self, status, function):
        """Raise LibraryError for a status other than MG_OK."""
        if status != 0:
            name = (self.status_name(status) or b"MG_ERR_?").decode()
            msg = (self.last_error() or b"").decode("utf-8", "replace")
            raise LibraryError(status, name, msg, NAME + "_" + function)

    def call(self, fn, *args):
        """NAME_fn(*args), its status checked."""
        self.check(getattr(self, fn)(*args), fn)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def load_library(path=None):
    """Load lib{NAME}: `path`, else $NAME_LIBRARY (upper-case NAME), else
    lib{NAME}.so beside this file, else the installed lib{NAME}.so.MAJOR (the
    dynamic loader's search). Loaded once per path."""
    if path is None:
        path = os.environ.get(NAME.upper() + "_LIBRARY")
    if path is not None:
        candidates = [os.fspath(path)]
    else:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib%s.so" % NAME)
        candidates = ([here] if os.path.exists(here) else []) + ["lib%s.so.%s" % (NAME, VERSION.split(".")[0])]
    errors = []
    for c in candidates:
        if c in _libs:
            return _libs[c]
        try:
            lib = _Lib(c)
        except OSError as e:
            errors.append(str(e))
            continue
        _libs[c] = lib
        return lib
    raise OSError("cannot load lib%s (build it with `make` in the package directory, or set %s_LIBRARY): %s"
                  % (NAME, NAME.upper(), "; ".join(errors)))


# ---- argument checks: every tensor that reaches the library ----

def _device(device):
    if not torch.cuda.is_available():
        raise RuntimeError("%s: torch sees no CUDA device" % NAME)
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError("%s: device %s: the library runs on CUDA devices only" % (NAME, dev))
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_tensor(t, what, shape, device):
    """t: an f32, contiguous, 16-byte aligned CUDA tensor of `shape` on `device`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(t).__name__))
    if t.dtype != _f32:
        raise TypeError("%s: dtype %s, expected torch.float32 (convert with .float())" % (what, t.dtype))
    if t.device != device:
        raise ValueError("%s: on %s, the model is on %s" % (what, t.device, device))
    if tuple(t.shape) != tuple(shape):
        raise ValueError("%s: shape %s, expected %s" % (what, tuple(t.shape), tuple(shape)))
    if not t.is_contiguous():
        raise ValueError("%s: not contiguous (pass .contiguous())" % what)
    if t.data_ptr() % 16:
        raise ValueError("%s: data pointer not 16-byte aligned, as the library needs (pass .clone())" % what)
    return t


def _check_reset(r, what, batch, device):
    """r: a reset mask, a bool or uint8 CUDA tensor [batch] on `device`,
    contiguous (the library reads one byte per stream: nonzero = start from
    zero states)."""
    if not isinstance(r, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(r).__name__))
    if r.dtype not in (torch.bool, torch.uint8):
        raise TypeError("%s: dtype %s, expected torch.bool or torch.uint8" % (what, r.dtype))
    if r.device != device:
        raise ValueError("%s: on %s, the model is on %s" % (what, r.device, device))
    if tuple(r.shape) != (batch,):
        raise ValueError("%s: shape %s, expected (%d,) (one entry per stream)" % (what, tuple(r.shape), batch))
    if not r.is_contiguous():
        raise ValueError("%s: not contiguous (pass .contiguous())" % what)
    return r


def _check_starts(s, what, batch, seqlen, device):
    """s: a start mask, a bool or uint8 CUDA tensor [batch][seqlen] on
    `device`, contiguous (one byte per token: nonzero = a new episode begins
    there, every state zeroed before it; doc/math.md section 9)."""
    if not isinstance(s, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(s).__name__))
    if s.dtype not in (torch.bool, torch.uint8):
        raise TypeError("%s: dtype %s, expected torch.bool or torch.uint8" % (what, s.dtype))
    if s.device != device:
        raise ValueError("%s: on %s, the model is on %s" % (what, s.device, device))
    if tuple(s.shape) != (batch, seqlen):
        raise ValueError("%s: shape %s, expected (%d, %d) (one entry per token)" % (what, tuple(s.shape), batch, seqlen))
    if not s.is_contiguous():
        raise ValueError("%s: not contiguous (pass .contiguous())" % what)
    return s


def _batch_seqlen(u, what, seq):
    """The batch (and seqlen) of an input u [batch][seqlen][IN_DIM] (seq) or
    [batch][IN_DIM], checked against the library's bounds."""
    if not isinstance(u, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(u).__name__))
    want = 3 if seq else 2
    if u.dim() != want or u.shape[-1] != IN_DIM:
        raise ValueError("%s: shape %s, expected [batch]%s[%d] (IN_DIM)"
                         % (what, tuple(u.shape), "[seqlen]" if seq else "", IN_DIM))
    batch = u.shape[0]
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError("%s: batch %d out of range 1..%d (MAX_BATCH)" % (what, batch, MAX_BATCH))
    if not seq:
        return batch, 1
    seqlen = u.shape[1]
    if not 1 <= seqlen <= MAX_SEQ_LEN:
        raise ValueError("%s: seqlen %d out of range 1..%d (MAX_SEQ_LEN)" % (what, seqlen, MAX_SEQ_LEN))
    return batch, seqlen


class State:
    """The recurrent state of `batch` sequences: one f32 CUDA tensor per
    field of STATE_FIELDS, each [N_LAYERS][batch] + the field's shape,
    contiguous (their data pointers go to the library). Fields are
    attributes (state.ssm_state, ...); a new State is zeros (a fresh start).
    Calls that take a State read it as the initial state and write the
    final state into it, unless they say otherwise."""

    __slots__ = ("batch", "device", "_t")

    def __init__(self, batch, device=None, tensors=None):
        self.batch = int(batch)
        self.device = _device(device)
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError("State: batch %d out of range 1..%d (MAX_BATCH)" % (self.batch, MAX_BATCH))
        if tensors is None:
            tensors = [torch.zeros(self.shape(f), dtype=_f32, device=self.device) for f, _ in STATE_FIELDS]
        tensors = list(tensors)
        if len(tensors) != _NS:
            raise ValueError("State: %d tensors, expected %d (%s)" % (len(tensors), _NS, ", ".join(f for f, _ in STATE_FIELDS)))
        for t, (f, _) in zip(tensors, STATE_FIELDS):
            _check_tensor(t, "state." + f, self.shape(f), self.device)
        self._t = tuple(tensors)

    def shape(self, field):
        """The shape of a field's tensor: [N_LAYERS][batch] + its per-sequence shape."""
        for f, shape in STATE_FIELDS:
            if f == field:
                return (N_LAYERS, self.batch) + tuple(shape)
        raise KeyError("%s has no state field %r (fields: %s)" % (NAME, field, ", ".join(f for f, _ in STATE_FIELDS)))

    def __getattr__(self, field):
        if field.startswith("_"):   # not a field (and _t itself before __init__ set it)
            raise AttributeError(field)
        for (f, _), t in zip(STATE_FIELDS, self._t):
            if f == field:
                return t
        raise AttributeError("State has no field %r (fields: %s)" % (field, ", ".join(f for f, _ in STATE_FIELDS)))

    def tensors(self):
        """The tensors in the C API's order (STATE_FIELDS)."""
        return self._t

    def clone(self):
        return State(self.batch, self.device, [t.detach().clone() for t in self._t])

    def zero_(self):
        for t in self._t:
            t.zero_()
        return self

    def _ptrs(self):
        return [t.data_ptr() for t in self._t]

    def __repr__(self):
        return "%s.State(batch=%d, %s)" % (NAME, self.batch, ", ".join(
            "%s=%s" % (f, tuple(t.shape)) for (f, _), t in zip(STATE_FIELDS, self._t)))


def _inv_softplus(x):
    return x + torch.log(-torch.expm1(-x))


def _mark_forward(ctx, model, u):
    """A training forward just ran: ctx records which one, so that its
    backward can check it is still the trainer's last and the weights did
    not change in between."""
    model._train_serial += 1
    ctx.model = model
    ctx.serial = model._train_serial
    ctx.wversion = (model.weights._version, model._fused_steps)
    ctx.u_shape = tuple(u.shape)


def _run_backward(ctx, dout, dstates, pneed):
    """NAME_backward of the forward ctx recorded (_mark_forward): dout of
    out's shape (None: zeros), du when u needs it (needs_input_grad[1]),
    dstates the initial-state gradient tensors or None, one per state;
    pneed: per parameter, whether it needs a gradient. -> (du, the
    parameter gradients: views into a fresh gradient blob, or None)."""
    model = ctx.model
    if model._train_serial != ctx.serial:
        raise RuntimeError("%s: backward through a training forward that is no longer the last one: the library "
                           "keeps the activations of one forward; call backward before the next forward" % NAME)
    if (model.weights._version, model._fused_steps) != ctx.wversion:
        raise RuntimeError("%s: the weights changed between the forward and its backward "
                           "(step the optimizer after backward)" % NAME)
    dev = model.device
    dout = torch.zeros(ctx.u_shape[:-1] + (D_MODEL,), dtype=_f32, device=dev) if dout is None \
        else dout.to(_f32).contiguous()
    if dout.data_ptr() % 16:
        dout = dout.clone()
    du = torch.empty(ctx.u_shape, dtype=_f32, device=dev) if ctx.needs_input_grad[1] else None
    # A fresh blob per backward (the caching allocator makes it cheap):
    # the views returned alias nothing that a later backward overwrites.
    grads = torch.empty(WEIGHTS_FLOATS, dtype=_f32, device=dev)
    with torch.cuda.device(dev):
        t = model._trainer_on_stream()
        model._lib.call("backward", t, dout.data_ptr(), grads.data_ptr(), du.data_ptr() if du is not None else None,
                        *[d.data_ptr() if d is not None else None for d in dstates])
    pgrads = []
    for i, (need, (off, numel, shape)) in enumerate(zip(pneed, model._layout)):
        if need:
            model._link_grad(i)   # p.grad a view into model.grads, so that it accumulates there
            pgrads.append(grads[off:off + numel].view(shape))
        else:
            pgrads.append(None)
    return du, pgrads


class _Train(torch.autograd.Function):
    """forward_train + backward of the library as one autograd node. Inputs:
    model, u, the start mask (None, or [batch][seqlen] bool / uint8: kept
    alive here until backward, which uses the forward's mask), the initial
    state tensors, the parameters; outputs: out and
    the final state tensors (no gradient flows back through them: the
    library differentiates out only). Gradients: of u, of the initial
    states and of every parameter (views into a gradient blob of their own)."""

    @staticmethod
    def forward(ctx, model, u, starts, *rest):
        states = rest[:_NS]
        batch, seqlen = u.shape[0], u.shape[1]
        out = torch.empty((batch, seqlen, D_MODEL), dtype=_f32, device=model.device)
        final = [s.detach().clone() for s in states]   # the library overwrites its states with the final ones
        with torch.cuda.device(model.device):
            t = model._trainer_on_stream()
            # the mask of this forward only: the trainer's backward keeps
            # using it (NAME_trainer_set_starts), later calls get none
            model._lib.call("trainer_set_starts", t, starts.data_ptr() if starts is not None else None)
            try:
                model._lib.call("forward_train", t, model.weights.data_ptr(), batch, seqlen, u.data_ptr(),
                                out.data_ptr(), *[s.data_ptr() for s in final])
            finally:
                model._lib.call("trainer_set_starts", t, None)
        ctx.starts = starts   # alive until backward reads it
        _mark_forward(ctx, model, u)
        ctx.state_shapes = [tuple(s.shape) for s in states]
        ctx.mark_non_differentiable(*final)
        return (out,) + tuple(final)

    @staticmethod
    def backward(ctx, dout, *unused):
        need = ctx.needs_input_grad   # model, u, starts, states..., parameters...
        dstates = [torch.empty(shape, dtype=_f32, device=ctx.model.device) if need[3 + i] else None
                   for i, shape in enumerate(ctx.state_shapes)]
        du, pgrads = _run_backward(ctx, dout, dstates, need[3 + _NS:])
        ctx.starts = None
        return (None, du, None) + tuple(dstates) + tuple(pgrads)


class _TrainPacked(torch.autograd.Function):
    """forward_train_packed + backward as one autograd node: inputs model, u
    [total][IN_DIM], the offsets (a ctypes int32 array, host memory), the
    parameters; outputs out [total][D_MODEL] and the final states (no
    gradient flows back through them). Every sequence starts from zero
    states, so there is no initial-state gradient; gradients reach u and
    the parameters."""

    @staticmethod
    def forward(ctx, model, u, offs, *params):
        nseq = len(offs) - 1
        out = torch.empty((u.shape[0], D_MODEL), dtype=_f32, device=model.device)
        final = State(nseq, model.device)
        with torch.cuda.device(model.device):
            t = model._trainer_on_stream()
            model._lib.call("forward_train_packed", t, model.weights.data_ptr(), nseq, ctypes.cast(offs, _P),
                            u.data_ptr(), out.data_ptr(), *final._ptrs())
        _mark_forward(ctx, model, u)
        ctx.mark_non_differentiable(*final.tensors())
        return (out,) + tuple(final.tensors())

    @staticmethod
    def backward(ctx, dout, *unused):
        # model, u, offs, parameters...; no initial states: no state gradients
        du, pgrads = _run_backward(ctx, dout, [None] * _NS, ctx.needs_input_grad[3:])
        return (None, du, None) + tuple(pgrads)


class _TrainPackedFrom(torch.autograd.Function):
    """forward_train_packed_from + backward as one autograd node: inputs
    model, u [total][IN_DIM], the offsets, the initial state tensors (row i:
    sequence i; read only), the parameters; output out [total][D_MODEL].
    Gradients reach u, the initial states and the parameters."""

    @staticmethod
    def forward(ctx, model, u, offs, *rest):
        states = rest[:_NS]
        nseq = len(offs) - 1
        out = torch.empty((u.shape[0], D_MODEL), dtype=_f32, device=model.device)
        with torch.cuda.device(model.device):
            t = model._trainer_on_stream()
            model._lib.call("forward_train_packed_from", t, model.weights.data_ptr(), nseq, ctypes.cast(offs, _P),
                            u.data_ptr(), out.data_ptr(), *[s.data_ptr() for s in states])
        _mark_forward(ctx, model, u)
        ctx.state_shapes = [tuple(s.shape) for s in states]
        return out

    @staticmethod
    def backward(ctx, dout):
        need = ctx.needs_input_grad   # model, u, offs, states..., parameters...
        dstates = [torch.empty(shape, dtype=_f32, device=ctx.model.device) if need[3 + i] else None
                   for i, shape in enumerate(ctx.state_shapes)]
        du, pgrads = _run_backward(ctx, dout, dstates, need[3 + _NS:])
        return (None, du, None) + tuple(dstates) + tuple(pgrads)


class Model(torch.nn.Module):
    """The library's model on one CUDA device.

    weights: None (a fresh initialisation, reset_parameters(seed)), a
    state_dict (Mapping name -> tensor: the library's parameter names, with
    or without a leading "backbone."; any float dtype and device, copied), or
    the path of a safetensors file (read by NAME_load_safetensors). strict:
    names the model does not have are an error (else ignored); missing and
    mis-shaped tensors always are. lib: the library's path (load_library).

    Parameters (named_parameters(), state_dict()) are views into
    `self.weights`, the f32 blob the library reads, and their .grad views
    into `self.grads`; the blob cannot be moved or converted (.to() to
    another device or dtype is an error: create the Model there).

    Calls run on the current CUDA stream of the model's device and never
    synchronise it. prefill / decode_step / burn_in / DecodeGraph are
    inference (no autograd); model(u, state) is differentiable through the
    library's training forward and backward (with torch.no_grad(): prefill).
    """

    def __init__(self, weights=None, device=None, *, strict=True, seed=0, lib=None):
        super().__init__()
        self._lib = load_library(lib)
        self.device = _device(device)
        self._handle = None
        self._trainer = None
        self._graphs = []
        self._stream = None
        self._trainer_stream = None
        self._synced = None          # weights._version last given to the model (set_weights)
        self._dirty = True           # the blob changed behind torch (the fused AdamW step)
        self._train_serial = 0
        self._scan = 0
        self._adam = None            # fused AdamW moments and step count
        self._fused_steps = 0        # adamw_step calls (they write the blob behind torch's version counter)
        n = self._lib.param_count()
        table = self._lib.param_table()
        self.param_names = tuple(table[i].name.decode() for i in range(n))
        self._layout = tuple((table[i].offset, table[i].numel, tuple(table[i].shape[:table[i].ndim]))
                             for i in range(n))
        with torch.cuda.device(self.device):
            self.weights = torch.zeros(WEIGHTS_FLOATS, dtype=_f32, device=self.device)
            self.grads = torch.zeros(WEIGHTS_FLOATS, dtype=_f32, device=self.device)
            h = _P()
            self._lib.call("create", ctypes.byref(h), self._cur_stream())
            self._handle = h.value
            self._stream = self._cur_stream()
        # The parameters, as submodules named by the table ("layers.0.mixer.in_proj.weight").
        self._params = []
        for name, (off, numel, shape) in zip(self.param_names, self._layout):
            *path, leaf = name.split(".")
            mod = self
            for comp in path:
                child = mod._modules.get(comp)
                if child is None:
                    child = torch.nn.Module()
                    mod.add_module(comp, child)
                mod = child
            # without training in the library, nothing requires grad: model(u) is prefill
            p = torch.nn.Parameter(self.weights[off:off + numel].view(shape), requires_grad=HAS_TRAINING)
            mod.register_parameter(leaf, p)
            self._params.append(p)
        self.zero_grad()
        if weights is None:
            self.reset_parameters(seed)
        else:
            self.load_weights(weights, strict=strict)

    # ---- handles and streams ----

    def _cur_stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream

    def _model_on_stream(self):
        """The model handle, bound to the current stream, with the current weights."""
        if self._handle is None:
            raise RuntimeError("%s: the model was closed" % NAME)
        s = self._cur_stream()
        if s != self._stream:
            self._lib.call("set_stream", self._handle, s)
            self._stream = s
        v = self.weights._version
        if self._dirty or v != self._synced:
            # also refreshes the low-precision copy of the GEMM weights (bf16/f16 storage)
            self._lib.call("set_weights", self._handle, self.weights.data_ptr(), WEIGHTS_FLOATS)
            self._synced, self._dirty = v, False
        return self._handle

    def _trainer_on_stream(self):
        if not HAS_TRAINING:
            raise RuntimeError("%s: the spec does not emit training (emit.training: false)" % NAME)
        if self._handle is None:
            raise RuntimeError("%s: the model was closed" % NAME)
        s = self._cur_stream()
        if self._trainer is None:
            h = _P()
            self._lib.call("trainer_create", ctypes.byref(h), s)
            self._trainer, self._trainer_stream = h.value, s
            if self._scan:
                self._lib.call("trainer_set_scan", self._trainer, self._scan)
        elif s != self._trainer_stream:
            self._lib.call("trainer_set_stream", self._trainer, s)
            self._trainer_stream = s
        return self._trainer

    def close(self):
        """Destroy the library's objects (graphs, trainer, model); the tensors stay."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for g in list(getattr(self, "_graphs", ())):
            g.close()
        if getattr(self, "_trainer", None) is not None:
            lib.trainer_destroy(self._trainer)
            self._trainer = None
        if getattr(self, "_handle", None) is not None:
            lib.destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:   # interpreter shutdown: ctypes or torch may be gone
            pass

    def _apply(self, fn, *args, **kwargs):
        # .to() / .cuda() / .float() that leave the blob as it is are fine;
        # anything else would cut the parameters off the library's blob.
        if fn(self.weights) is not self.weights:
            raise RuntimeError("%s.Model: the parameters are views into the library's f32 weight blob on %s and "
                               "cannot be moved or converted (create the Model on the device you need)"
                               % (NAME, self.device))
        return self

    # ---- weights ----

    def load_weights(self, weights, strict=True):
        """Copy weights in: a state_dict (names with or without "backbone.")
        or a safetensors path. Errors name every missing, unexpected and
        mis-shaped tensor; the weights are unchanged on error."""
        if isinstance(weights, (str, bytes, os.PathLike)):
            host = torch.empty(WEIGHTS_FLOATS, dtype=_f32)
            path = os.fsencode(weights)
            self._lib.call("load_safetensors", path, None, host.data_ptr(), WEIGHTS_FLOATS)
            with torch.no_grad():
                self.weights.copy_(host)
            return self
        if not hasattr(weights, "items"):
            raise TypeError("%s: weights must be None, a state_dict (a Mapping name -> tensor) or a safetensors "
                            "path, got %s" % (NAME, type(weights).__name__))
        canon = {_canonical(n): i for i, n in enumerate(self.param_names)}
        given, unexpected, misshaped, twice = {}, [], [], []
        for key, t in weights.items():
            i = canon.get(_canonical(key))
            if i is None:
                unexpected.append(key)
                continue
            if i in given:
                twice.append("%s (and %s)" % (key, given[i][0]))
                continue
            if not isinstance(t, torch.Tensor) or not (t.is_floating_point()):
                raise TypeError("%s: %s: expected a floating-point tensor, got %s"
                                % (NAME, key, getattr(t, "dtype", type(t).__name__)))
            shape = self._layout[i][2]
            if tuple(t.shape) != shape:
                misshaped.append("%s %s (expected %s)" % (key, tuple(t.shape), shape))
            given[i] = (key, t)
        missing = [self.param_names[i] for i in range(len(self.param_names)) if i not in given]
        problems = []
        if missing:
            problems.append("missing: " + ", ".join(missing))
        if unexpected and strict:
            problems.append("unexpected: " + ", ".join(unexpected))
        if misshaped:
            problems.append("wrong shape: " + ", ".join(misshaped))
        if twice:
            problems.append("given twice: " + ", ".join(twice))
        if problems:
            raise KeyError("%s: the state_dict does not match the model's parameters: %s"
                           % (NAME, "; ".join(problems)))
        with torch.no_grad():
            for i, (_, t) in given.items():
                self._params[i].copy_(t)
        return self

    def save_safetensors(self, path, dtype="f32"):
        """Write the weights to a safetensors file (dtype f32, bf16 or f16), by
        the library's parameter table (NAME_save_safetensors)."""
        codes = {"f32": 0, "bf16": 1, "f16": 2}
        if dtype not in codes:
            raise ValueError("%s: dtype %r: one of f32, bf16, f16" % (NAME, dtype))
        host = self.weights.detach().to("cpu")
        self._lib.call("save_safetensors", os.fsencode(path), host.data_ptr(), WEIGHTS_FLOATS, codes[dtype])

    def reset_parameters(self, seed=0):
        """A fresh initialisation, deterministic in seed (drawn on the CPU):
        Linear-style weights and biases U(+-1/sqrt(fan_in)), norm weights 1,
        D (and Mamba-3's B_bias, C_bias) 1, Mamba-1's A_log = log(1..d_state),
        the dt biases softplus^-1(dt) with log(dt) uniform in [log 1e-3,
        log 1e-1], anything else 0."""
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for name, p in zip(self.param_names, self._params):
                shape = tuple(p.shape)
                leaf = name.rsplit(".", 1)[-1]
                parent = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
                if leaf == "weight" and "norm" in parent:
                    v = torch.ones(shape)
                elif leaf in ("D", "B_bias", "C_bias"):
                    v = torch.ones(shape)
                elif leaf == "A_log":
                    v = torch.log(torch.arange(1, shape[-1] + 1, dtype=torch.float64)).expand(shape).float()
                elif leaf == "dt_bias" or name.endswith("dt_proj.bias"):
                    lo, hi = torch.log(torch.tensor(1e-3)), torch.log(torch.tensor(1e-1))
                    dt = torch.exp(lo + (hi - lo) * torch.rand(shape, generator=g))
                    v = _inv_softplus(dt)
                elif leaf == "weight" and len(shape) >= 2:   # Linear [out, in], conv1d [E, 1, K]
                    v = (torch.rand(shape, generator=g) * 2 - 1) / _numel(shape[1:]) ** 0.5
                elif leaf == "bias" and name[:-len("bias")] + "weight" in self.param_names:
                    w = self._layout[self.param_names.index(name[:-len("bias")] + "weight")][2]
                    v = (torch.rand(shape, generator=g) * 2 - 1) / _numel(w[1:]) ** 0.5
                else:
                    v = torch.zeros(shape)
                p.copy_(v)
        return self

    # ---- gradients ----

    def _link_grad(self, i):
        """Make parameter i's .grad its (zeroed, if it was None) view into self.grads."""
        p = self._params[i]
        off, numel, shape = self._layout[i]
        view = self.grads[off:off + numel]
        if p.grad is None:
            view.zero_()
            p.grad = view.view(shape)

    def zero_grad(self, set_to_none=True):
        """Zero self.grads; every parameter's .grad is (again) its view into
        it, whatever set_to_none says (gradients stay in the flat blob)."""
        with torch.no_grad():
            self.grads.zero_()
            for i, p in enumerate(self._params):
                off, numel, shape = self._layout[i]
                if p.grad is None or p.grad.data_ptr() != self.grads[off:].data_ptr():
                    p.grad = self.grads[off:off + numel].view(shape)

    def _gather_grads(self):
        """self.grads holding every parameter's .grad (copied in where a
        .grad is not its view; None: zeros)."""
        with torch.no_grad():
            for i, p in enumerate(self._params):
                off, numel, shape = self._layout[i]
                view = self.grads[off:off + numel]
                if p.grad is None:
                    view.zero_()
                elif p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad.reshape(-1))
        return self.grads

    # ---- inference ----

    def _state_for(self, state, batch, what):
        if state is None:
            return State(batch, self.device)
        if not isinstance(state, State):
            raise TypeError("%s: expected a %s.State, got %s" % (what, NAME, type(state).__name__))
        if state.batch != batch:
            raise ValueError("%s: state of batch %d for an input of batch %d" % (what, state.batch, batch))
        for t, (f, _) in zip(state.tensors(), STATE_FIELDS):   # re-checked: tensors are mutable
            _check_tensor(t, "%s: state.%s" % (what, f), state.shape(f), self.device)
        return state

    @torch.no_grad()
    def prefill(self, u, state=None, starts=None):
        """out [batch][seqlen][D_MODEL] for u [batch][seqlen][IN_DIM]; state:
        the initial state, updated in place to the final one (None: a fresh
        State). starts: None, or a bool / uint8 CUDA tensor [batch][seqlen]
        (NAME_prefill_starts): where it is nonzero a new episode begins, every
        state zeroed before that token. Returns (out, state)."""
        batch, seqlen = _batch_seqlen(u, "prefill: u", True)
        _check_tensor(u, "prefill: u", u.shape, self.device)
        state = self._state_for(state, batch, "prefill")
        out = torch.empty((batch, seqlen, D_MODEL), dtype=_f32, device=self.device)
        with torch.cuda.device(self.device):
            if starts is None:
                self._lib.call("prefill", self._model_on_stream(), batch, seqlen, u.data_ptr(), out.data_ptr(),
                               *state._ptrs())
            else:
                _check_starts(starts, "prefill: starts", batch, seqlen, self.device)
                self._lib.call("prefill_starts", self._model_on_stream(), batch, seqlen, u.data_ptr(),
                               out.data_ptr(), *state._ptrs(), starts.data_ptr())
        return out, state

    @torch.no_grad()
    def prefill_packed(self, u, cu_seqlens, state=None):
        """Packed variable-length sequences (NAME_prefill_packed): u
        [total][IN_DIM] holds nseq sequences one after another, sequence i
        being rows cu_seqlens[i] .. cu_seqlens[i+1] (a list or CPU integer
        tensor of nseq + 1 offsets from 0, strictly increasing). state:
        None (every sequence starts from zero states), or a State of batch
        nseq whose row i is sequence i's initial state, updated in place to
        the final ones (NAME_prefill_packed_from: one forward per distinct
        length). Returns (out [total][D_MODEL], a State of batch nseq with
        each sequence's final state)."""
        cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
        nseq = len(cu) - 1
        if nseq < 1:
            raise ValueError("prefill_packed: cu_seqlens needs at least 2 entries (nseq + 1), got %d" % len(cu))
        if not isinstance(u, torch.Tensor) or u.dim() != 2 or u.shape[1] != IN_DIM:
            raise ValueError("prefill_packed: u: shape %s, expected [total][%d] (IN_DIM)"
                             % (tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__, IN_DIM))
        if cu[-1] != u.shape[0]:
            raise ValueError("prefill_packed: cu_seqlens ends at %d, u has %d rows" % (cu[-1], u.shape[0]))
        _check_tensor(u, "prefill_packed: u", u.shape, self.device)
        if not 1 <= nseq <= MAX_BATCH:
            raise ValueError("prefill_packed: %d sequences, out of range 1..%d (MAX_BATCH)" % (nseq, MAX_BATCH))
        fn = "prefill_packed" if state is None else "prefill_packed_from"
        state = State(nseq, self.device) if state is None else self._state_for(state, nseq, "prefill_packed")
        out = torch.empty((u.shape[0], D_MODEL), dtype=_f32, device=self.device)
        offs = (ctypes.c_int32 * len(cu))(*cu)   # host memory: the library checks it before any launch
        with torch.cuda.device(self.device):
            self._lib.call(fn, self._model_on_stream(), nseq, ctypes.cast(offs, _P), u.data_ptr(),
                           out.data_ptr(), *state._ptrs())
        return out, state

    @torch.no_grad()
    def decode_step(self, u, state, reset=None):
        """One token per sequence: out [batch][D_MODEL] for u [batch][IN_DIM];
        state (required) advances in place. reset: None, or a bool / uint8
        CUDA tensor [batch] (NAME_decode_step_reset): the streams where it
        is nonzero start from zero states at this step (a new episode), the
        others continue."""
        batch, _ = _batch_seqlen(u, "decode_step: u", False)
        _check_tensor(u, "decode_step: u", u.shape, self.device)
        if state is None:
            raise ValueError("decode_step: a State is required (prefill returns one; State(batch) is a fresh one)")
        state = self._state_for(state, batch, "decode_step")
        out = torch.empty((batch, D_MODEL), dtype=_f32, device=self.device)
        with torch.cuda.device(self.device):
            if reset is None:
                self._lib.call("decode_step", self._model_on_stream(), batch, u.data_ptr(), out.data_ptr(),
                               *state._ptrs())
            else:
                _check_reset(reset, "decode_step: reset", batch, self.device)
                self._lib.call("decode_step_reset", self._model_on_stream(), batch, u.data_ptr(), out.data_ptr(),
                               *state._ptrs(), reset.data_ptr())
        return out

    @torch.no_grad()
    def burn_in(self, u, state=None, starts=None):
        """The forward over u [batch][seqlen][IN_DIM] returning only the last
        timestep's output [batch][D_MODEL]; state and starts as prefill.
        Returns (last_out, state)."""
        batch, seqlen = _batch_seqlen(u, "burn_in: u", True)
        _check_tensor(u, "burn_in: u", u.shape, self.device)
        state = self._state_for(state, batch, "burn_in")
        out = torch.empty((batch, D_MODEL), dtype=_f32, device=self.device)
        with torch.cuda.device(self.device):
            if starts is None:
                self._lib.call("burn_in", self._model_on_stream(), batch, seqlen, u.data_ptr(), out.data_ptr(),
                               *state._ptrs())
            else:
                _check_starts(starts, "burn_in: starts", batch, seqlen, self.device)
                self._lib.call("burn_in_starts", self._model_on_stream(), batch, seqlen, u.data_ptr(),
                               out.data_ptr(), *state._ptrs(), starts.data_ptr())
        return out, state

    def decode_graph(self, state, reset=False):
        """A DecodeGraph: decode_step captured once as a CUDA Graph for this
        state's batch and tensors; reset=True: with a reset mask buffer
        (DecodeGraph.reset, step(u, reset))."""
        return DecodeGraph(self, state, reset)

    def prefill_graph(self, state, seqlen, starts=False):
        """A PrefillGraph: prefill of [state.batch][seqlen] captured once as a
        CUDA Graph with fixed tensors (NAME_prefill_graph_create; starts=True:
        with a start mask buffer, NAME_prefill_graph_create_starts)."""
        return PrefillGraph(self, state, seqlen, starts)

    def set_scan(self, choice):
        """Force the scan of prefill / burn-in and of training: "spec" (as the
        spec says), "sequential" or "chunked"."""
        if choice not in SCAN:
            raise ValueError("%s: scan %r: one of %s" % (NAME, choice, ", ".join(SCAN)))
        self._lib.call("set_scan", self._model_on_stream(), SCAN[choice])
        if self._trainer is not None:
            self._lib.call("trainer_set_scan", self._trainer, SCAN[choice])
        self._scan = SCAN[choice]

    def set_decode_fused(self, mode):
        """Mamba-1: the decode step's kernels (NAME_set_decode_fused: 0
        unfused, 1 fused, 2 one launch)."""
        if self._lib.set_decode_fused is None:
            raise RuntimeError("%s: the library has no set_decode_fused" % NAME)
        self._lib.call("set_decode_fused", self._model_on_stream(), int(mode))

    def set_decode_tile(self, streams_per_cluster):
        """Mamba-1: streams per cluster of the one-launch decode
        (NAME_set_decode_tile: 0 per call, else 1..NAME_DECODE_SINGLE_MAX_TILE;
        the results are the same bits whatever the tile)."""
        if self._lib.set_decode_tile is None:
            raise RuntimeError("%s: the library has no set_decode_tile" % NAME)
        self._lib.call("set_decode_tile", self._model_on_stream(), int(streams_per_cluster))

    def workspace_bytes(self):
        """Device bytes the library's model holds (not the weights)."""
        return self._lib.workspace_bytes(self._handle)

    def selfcheck(self, batch=0, seqlen=0, seed=1, with_state=True, tol=0.0):
        """The library's own check against the f64 reference (random weights
        and inputs, not this model's): a dict of rel-L2 errors per tensor and
        "passed"."""
        opts = _CheckOpts(batch, seqlen, seed, 1 if with_state else 0, tol)
        rep = _CheckReport()
        with torch.cuda.device(self.device):
            st = self._lib.selfcheck(ctypes.byref(opts), ctypes.byref(rep))
        if st not in (0, 10):   # MG_OK, MG_ERR_MISMATCH (the report says which)
            self._lib.check(st, "selfcheck")
        res = {f: getattr(rep, f).rel_l2 for f in ("out",) + CHECK_REPORT_FIELDS if getattr(rep, f).n}
        res["tol"], res["passed"] = rep.tol, bool(rep.passed)
        return res

    # ---- training ----

    def forward(self, u, state=None, starts=None):
        """(out, final_state) for u [batch][seqlen][IN_DIM] from `state` (None:
        a fresh start), which is left as it is. Differentiable when grad mode
        is on and the parameters, u or the state's tensors require grad:
        gradients reach the parameters (.grad, views into self.grads), u and
        the initial state; the final state carries none (detach it to carry
        it into the next window). Else it is prefill on a copy of the state.
        starts: as prefill (a window crossing episode boundaries: the states
        restart at each start and no gradient crosses it)."""
        batch, seqlen = _batch_seqlen(u, "forward: u", True)
        state = self._state_for(state, batch, "forward")
        if starts is not None:
            _check_starts(starts, "forward: starts", batch, seqlen, self.device)
        if not torch.is_grad_enabled() or not (u.requires_grad or any(t.requires_grad for t in state.tensors())
                                               or any(p.requires_grad for p in self._params)):
            return self.prefill(u, state.clone(), starts)
        _check_tensor(u, "forward: u", u.shape, self.device)
        outs = _Train.apply(self, u, starts, *state.tensors(), *self._params)
        return outs[0], State(batch, self.device, outs[1:])

    def forward_packed(self, u, cu_seqlens, state=None):
        """Training over packed sequences (NAME_forward_train_packed): u
        [total][IN_DIM] and cu_seqlens as prefill_packed; every sequence
        starts from zero states. Returns (out [total][D_MODEL], the final
        State of nseq rows, no gradient through it); differentiable as
        forward (gradients reach the parameters and u). state: a State of
        nseq rows, row i sequence i's initial state (left as it is;
        NAME_forward_train_packed_from): gradients reach its tensors too,
        and the returned state is None (that call gives no final states:
        prefill_packed(u, cu, state) does). Without grad mode (or nothing
        requiring grad) it is prefill_packed."""
        if not torch.is_grad_enabled() or not (u.requires_grad or any(p.requires_grad for p in self._params) or
                                               (state is not None and any(t.requires_grad for t in state.tensors()))):
            return self.prefill_packed(u, cu_seqlens, None if state is None else state.clone())
        cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
        if len(cu) < 2 or u.dim() != 2 or u.shape[1] != IN_DIM or cu[-1] != u.shape[0]:
            raise ValueError("forward_packed: u %s and cu_seqlens (%d entries ending at %s) do not agree: expected "
                             "u [cu_seqlens[-1]][%d]" % (tuple(u.shape), len(cu), cu[-1] if cu else None, IN_DIM))
        if not 1 <= len(cu) - 1 <= MAX_BATCH:
            raise ValueError("forward_packed: %d sequences, out of range 1..%d (MAX_BATCH)" % (len(cu) - 1, MAX_BATCH))
        _check_tensor(u, "forward_packed: u", u.shape, self.device)
        offs = (ctypes.c_int32 * len(cu))(*cu)   # host memory, alive for this call (checked there)
        if state is not None:
            state = self._state_for(state, len(cu) - 1, "forward_packed")
            return _TrainPackedFrom.apply(self, u, offs, *state.tensors(), *self._params), None
        outs = _TrainPacked.apply(self, u, offs, *self._params)
        return outs[0], State(len(cu) - 1, self.device, outs[1:])

    def adamw_step(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=0.0,
                   wd_matrices_only=False, step=None):
        """The library's fused AdamW step (NAME_adamw_step: torch.optim.AdamW
        semantics, global-norm clipping when max_grad_norm > 0, an update with
        a non-finite gradient skipped) on self.weights with the parameters'
        .grad (self.grads), moments kept here. step: the 1-based step count
        (None: one more than the last)."""
        if self._adam is None:
            self._adam = [torch.zeros_like(self.weights), torch.zeros_like(self.weights), 0]
        m, v, last = self._adam
        step = last + 1 if step is None else int(step)
        p = _AdamWParams(lr, betas[0], betas[1], eps, weight_decay, max_grad_norm, step, 1 if wd_matrices_only else 0)
        grads = self._gather_grads()
        with torch.cuda.device(self.device):
            self._lib.call("adamw_step", self._trainer_on_stream(), self.weights.data_ptr(), grads.data_ptr(),
                           m.data_ptr(), v.data_ptr(), ctypes.byref(p))
        self._adam[2] = step
        self._fused_steps += 1
        self._dirty = True   # the library wrote the blob: torch's version counter did not move

    def set_loss_scaling(self, init_scale, growth_interval=2000):
        """The trainer's dynamic loss scaling (NAME_trainer_set_loss_scaling;
        on by default for f16 storage): init_scale a power of two, 0 = off."""
        with torch.cuda.device(self.device):
            self._lib.call("trainer_set_loss_scaling", self._trainer_on_stream(), float(init_scale),
                           int(growth_interval))


class DecodeGraph:
    """NAME_decode_graph_create: the decode step for `state` captured once
    as a CUDA Graph with fixed tensors: .u [batch][IN_DIM] (input), .out
    [batch][D_MODEL] (output, overwritten by every step) and the state's
    tensors (advanced in place). step(u) copies u in, replays, and returns
    .out; replay() replays with .u as it is. Bit-identical to decode_step.
    With reset=True (NAME_decode_graph_create_reset) it also has .reset, a
    uint8 [batch] mask buffer read at every replay (zeros: no stream
    resets); step(u, reset) copies a mask in first. Close it (or let it go)
    before the model."""

    def __init__(self, model, state, reset=False):
        if not isinstance(state, State):
            raise TypeError("decode_graph: expected a %s.State, got %s" % (NAME, type(state).__name__))
        model._state_for(state, state.batch, "decode_graph")
        self.model, self.state, self.batch = model, state, state.batch
        self.u = torch.zeros((self.batch, IN_DIM), dtype=_f32, device=model.device)
        self.out = torch.zeros((self.batch, D_MODEL), dtype=_f32, device=model.device)
        self.reset = torch.zeros((self.batch,), dtype=torch.uint8, device=model.device) if reset else None
        self._g = None
        h = _P()
        with torch.cuda.device(model.device):
            if reset:
                model._lib.call("decode_graph_create_reset", model._model_on_stream(), self.batch, self.u.data_ptr(),
                                self.out.data_ptr(), *state._ptrs(), self.reset.data_ptr(), ctypes.byref(h))
            else:
                model._lib.call("decode_graph_create", model._model_on_stream(), self.batch, self.u.data_ptr(),
                                self.out.data_ptr(), *state._ptrs(), ctypes.byref(h))
        self._g = h.value
        model._graphs.append(self)

    def replay(self):
        if self._g is None:
            raise RuntimeError("%s: the graph was closed" % NAME)
        with torch.cuda.device(self.model.device):
            self.model._model_on_stream()   # the graph replays on the model's current stream, with fresh weights
            self.model._lib.call("decode_graph_launch", self._g)
        return self.out

    @torch.no_grad()
    def step(self, u, reset=None):
        _batch_seqlen(u, "DecodeGraph.step: u", False)
        _check_tensor(u, "DecodeGraph.step: u", self.u.shape, self.model.device)
        if reset is not None:
            if self.reset is None:
                raise ValueError("DecodeGraph.step: reset given to a graph made without one (decode_graph(state, reset=True))")
            _check_reset(reset, "DecodeGraph.step: reset", self.batch, self.model.device)
            self.reset.copy_(reset)
        self.u.copy_(u)
        return self.replay()

    def close(self):
        if self._g is not None:
            self.model._lib.decode_graph_destroy(self._g)
            self._g = None
            self.model._graphs.remove(self)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class PrefillGraph(DecodeGraph):
    """NAME_prefill_graph_create: prefill of `seqlen` tokens for `state`
    captured once as a CUDA Graph with fixed tensors: .u
    [batch][seqlen][IN_DIM], .out [batch][seqlen][D_MODEL] (overwritten by
    every run) and the state's tensors (advanced in place). run(u) copies u
    in, replays and returns .out; replay() replays with .u as it is.
    Bit-identical to prefill(u, state), without the call's launch costs.
    With starts=True it also has .starts, a uint8 [batch][seqlen] mask
    buffer read at every replay (zeros: no start); run(u, starts) copies a
    mask in first (prefill(u, state, starts)). Close it (or let it go)
    before the model."""

    def __init__(self, model, state, seqlen, starts=False):
        if not isinstance(state, State):
            raise TypeError("prefill_graph: expected a %s.State, got %s" % (NAME, type(state).__name__))
        model._state_for(state, state.batch, "prefill_graph")
        seqlen = int(seqlen)
        if not 1 <= seqlen <= MAX_SEQ_LEN:
            raise ValueError("prefill_graph: seqlen %d out of range 1..%d (MAX_SEQ_LEN)" % (seqlen, MAX_SEQ_LEN))
        self.model, self.state, self.batch, self.seqlen = model, state, state.batch, seqlen
        self.u = torch.zeros((self.batch, seqlen, IN_DIM), dtype=_f32, device=model.device)
        self.out = torch.zeros((self.batch, seqlen, D_MODEL), dtype=_f32, device=model.device)
        self.reset = None
        self.starts = torch.zeros((self.batch, seqlen), dtype=torch.uint8, device=model.device) if starts else None
        self._g = None
        h = _P()
        with torch.cuda.device(model.device):
            if starts:
                model._lib.call("prefill_graph_create_starts", model._model_on_stream(), self.batch, seqlen,
                                self.u.data_ptr(), self.out.data_ptr(), *state._ptrs(), self.starts.data_ptr(),
                                ctypes.byref(h))
            else:
                model._lib.call("prefill_graph_create", model._model_on_stream(), self.batch, seqlen,
                                self.u.data_ptr(), self.out.data_ptr(), *state._ptrs(), ctypes.byref(h))
        self._g = h.value
        model._graphs.append(self)

    @torch.no_grad()
    def run(self, u, starts=None):
        _batch_seqlen(u, "PrefillGraph.run: u", True)
        _check_tensor(u, "PrefillGraph.run: u", self.u.shape, self.model.device)
        if starts is not None:
            if self.starts is None:
                raise ValueError("PrefillGraph.run: starts given to a graph made without them "
                                 "(prefill_graph(state, seqlen, starts=True))")
            _check_starts(starts, "PrefillGraph.run: starts", self.batch, self.seqlen, self.model.device)
            self.starts.copy_(starts)
        self.u.copy_(u)
        return self.replay()

    def step(self, u, reset=None):
        raise TypeError("PrefillGraph: use run(u) (a window of tokens), not step")


def _canonical(name):
    """A parameter's name without a leading "backbone." (state_dicts of
    Hugging Face's Mamba models have it, bare backbones do not)."""
    return name[len("backbone."):] if name.startswith("backbone.") else name
