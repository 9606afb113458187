"""tests/torch_module_api.py PKGDIR NAME: the ctypes declarations of the
emitted NAME.py against the C prototypes of PKGDIR/NAME.h and NAME_train.h,
without torch or a GPU: NAME.py is loaded with a stand-in `torch` module (its
module level touches only torch.float32, torch.nn.Module,
torch.autograd.Function and torch.no_grad), then every function it declares
must exist in the headers with the same number of arguments and, argument
by argument and for the result, the ctypes type of the C type (int: c_int,
size_t: c_size_t, float: c_float, char pointers: c_char_p, other pointers
and handles: c_void_p or a POINTER). The struct layouts it declares
(param_info, adamw_params, check_opts, check_report) are compared field by
field the same way. Prints TAP."""
import ctypes
import importlib.util
import os
import re
import sys
import types

pkg, name = sys.argv[1], sys.argv[2]

stub = types.ModuleType("torch")
stub.float32 = "float32"
stub.nn = types.SimpleNamespace(Module=object)
stub.autograd = types.SimpleNamespace(Function=object)
stub.no_grad = lambda: (lambda f: f)
sys.modules["torch"] = stub
spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, name + ".py"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

text = ""
for h in (name + ".h", name + "_train.h"):
    p = os.path.join(pkg, h)
    if os.path.exists(p):
        text += open(p).read()
text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)

protos = {}
for m in re.finditer(r"(?:^|\n)\s*([A-Za-z_][\w ]*?\**)\s*\b" + name + r"_(\w+)\s*\(([^;{]*?)\)\s*;", text):
    ret, fn, args = m.group(1), m.group(2), m.group(3)
    args = [a.strip() for a in args.split(",")] if args.strip() not in ("", "void") else []
    protos[fn] = (ret.strip(), args)

P, I, Z, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_float
PtrType = type(ctypes.POINTER(ctypes.c_int))


def ctype_ok(c, ct):
    """C type text c (a declaration, maybe with a name) against ctypes type ct."""
    c = re.sub(r"\b(const|struct)\b", " ", c)
    c = re.sub(r"\s+", " ", c).strip()
    ptr = "*" in c
    base = c.replace("*", " ").split()[0] if c else ""
    if ptr:
        if base == "char":
            return ct is ctypes.c_char_p
        return ct is P or isinstance(ct, PtrType)
    if base in ("mg_status", "int"):
        return ct is I
    if base == "size_t":
        return ct is Z
    if base == "float":
        return ct is F
    if base == "double":
        return ct is ctypes.c_double
    if base == "cudaStream_t":
        return ct is P
    if base == "void":
        return ct is None
    if base == "unsigned":
        return ct is ctypes.c_ulonglong
    return False


tests = []


def check(ok, desc, diag=None):
    tests.append((ok, desc, diag))


api = dict(mod._API)
if mod.HAS_TRAINING:
    api.update(mod._TRAIN_API)
for fn, (res, args) in sorted(api.items()):
    if fn not in protos:
        check(False, "%s_%s declared in %s.py is in the headers" % (name, fn, name))
        continue
    ret, cargs = protos[fn]
    bad = [i for i, (c, t) in enumerate(zip(cargs, args)) if not ctype_ok(c, t)]
    ok = len(cargs) == len(args) and not bad and ctype_ok(ret, res)
    check(ok, "%s_%s: %d arguments and their types as in the header" % (name, fn, len(cargs)),
          None if ok else "header: %s (%s); module: %s -> %s" % (ret, ", ".join(cargs), args, res))
for fn, (res, args) in mod._OPTIONAL_API.items():
    if fn in protos:
        ret, cargs = protos[fn]
        check(len(cargs) == len(args) and ctype_ok(ret, res) and all(ctype_ok(c, t) for c, t in zip(cargs, args)),
              "%s_%s (optional): arguments as in the header" % (name, fn))

# the structs
structs = {"param_info": mod._ParamInfo, "check_opts": mod._CheckOpts, "check_report": mod._CheckReport}
if mod.HAS_TRAINING:
    structs["adamw_params"] = mod._AdamWParams
for sname, cls in structs.items():
    m = re.search(r"typedef struct " + name + "_" + sname + r"\s*\{(.*?)\}\s*" + name + "_" + sname + ";", text, re.S)
    if not m:
        check(False, "struct %s_%s is in the headers" % (name, sname))
        continue
    fields = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        tm = re.match(r"(.*?)(\w+)(\[\d+\])?((?:\s*,\s*\w+)*)$", decl, re.S)
        ctext = tm.group(1)
        names = [tm.group(2)] + [n.strip() for n in tm.group(4).split(",") if n.strip()]
        for n in names:
            fields.append((n, ctext, tm.group(3)))
    mine = cls._fields_
    ok = [f[0] for f in fields] == [f[0] for f in mine]
    for (n, ctext, arr), (_, ct) in zip(fields, mine):
        if arr:
            ok = ok and isinstance(ct, type(ctypes.c_int * 4)) and ctype_ok(ctext, ct._type_) \
                and ct._length_ == int(arr[1:-1])
        elif ctext.strip() == "mg_err":
            ok = ok and ct is mod._Err
        else:
            ok = ok and ctype_ok(ctext, ct)
    check(ok, "struct %s_%s: fields and types as in the header" % (name, sname),
          None if ok else "header: %s; module: %s" % (fields, [(f[0], f[1].__name__) for f in mine]))

# the constants the generator wrote against the header's #defines
up = name.upper()
for const in ("D_MODEL", "N_LAYERS", "D_STATE", "D_INNER", "INPUT_DIM", "IN_DIM", "MAX_BATCH", "MAX_SEQ_LEN",
              "N_PARAMS", "WEIGHTS_FLOATS", "HEADDIM", "N_HEADS", "N_GROUPS", "N_ANGLES", "D_CONV", "DT_RANK"):
    m = re.search(r"#define " + up + "_" + const + r"\s+(\d+)u?\b", text)
    if m or hasattr(mod, const):
        check(m is not None and getattr(mod, const, None) == int(m.group(1)),
              "%s.%s = the header's %s_%s" % (name, const, up, const))

print("1..%d" % len(tests))
for i, (ok, desc, diag) in enumerate(tests, 1):
    print("%s %d - %s" % ("ok" if ok else "not ok", i, desc))
    if diag:
        print("# " + str(diag).replace("\n", "\n# "))
sys.exit(0 if all(t[0] for t in tests) else 1)
