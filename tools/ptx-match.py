#!/usr/bin/env python3
"""tools/ptx-match.py BEFORE AFTER: does AFTER still hold, for every kernel
of BEFORE, a kernel with exactly its code? BEFORE and AFTER are output
directories of tools/ptx-dump.sh (SPEC/FILE.ptx each). A kernel of AFTER
matches one of BEFORE when its body is the same after renaming the kernel
itself, its local statics (_ZZ...E<n>name) and labels: so a kernel that
became a template (`scan_kernel` -> `scan_kernel<false>`, `<true>`) or
gained an unused trailing parameter still matches through the instance
whose code did not change. That is the proof that a change which adds an
optional path (a start mask, a template flag) leaves the existing path's
device code, and so its results, as they were.

Prints one line per kernel of BEFORE without a match ("DIFFERS", with the
instances AFTER has under that name, or "GONE"), then a summary; exit
status 0 when every kernel matched, 1 otherwise, 2 on usage errors.
Standard library only."""

import os
import re
import sys

ENTRY = re.compile(r'\.entry\s+(\S+)\((.*?)\)(.*?)\{(.*?)\n\}', re.S)
# the kernel's own name inside its mangled symbol: <len><name>_kernel, and
# the template arguments right after it (I...E), if any
BASE = re.compile(r'\d+([A-Za-z_0-9]+?_kernel)(I[^E]*E)?')


def kernels(path):
    """{base name: [(template args, normalized body, symbol), ...]} of one PTX file."""
    with open(path) as f:
        text = f.read()
    out = {}
    for m in ENTRY.finditer(text):
        sym, _params, _attrs, body = m.groups()
        b = BASE.search(sym)
        base = b.group(1) if b else sym
        targs = (b.group(2) or "") if b else ""
        body = body.replace(sym, "KERNEL")
        body = re.sub(r'\$L__\w+', 'LABEL', body)
        body = re.sub(r'_ZZ[0-9A-Za-z_]*?E[0-9]+([A-Za-z_][A-Za-z_0-9]*)', r'LOCAL_\1', body)
        out.setdefault(base, []).append((targs, body, sym))
    return out


def ptx_files(root):
    for spec in sorted(os.listdir(root)):
        d = os.path.join(root, spec)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith(".ptx"):
                yield spec, f


def main(argv):
    if len(argv) != 2 or not all(os.path.isdir(a) for a in argv):
        print("usage: ptx-match.py BEFORE AFTER (directories written by tools/ptx-dump.sh)", file=sys.stderr)
        return 2
    before, after = argv
    checked = bad = 0
    for spec, f in ptx_files(before):
        old = kernels(os.path.join(before, spec, f))
        new_path = os.path.join(after, spec, f)
        new = kernels(new_path) if os.path.exists(new_path) else {}
        for base, insts in sorted(old.items()):
            for targs, body, _sym in insts:
                checked += 1
                cands = new.get(base, [])
                if any(c[1] == body for c in cands):
                    continue
                bad += 1
                if cands:
                    print("%s/%s: %s%s DIFFERS (instances now: %s)"
                          % (spec, f, base, targs, ", ".join(c[0] or "plain" for c in cands)))
                else:
                    print("%s/%s: %s%s GONE" % (spec, f, base, targs))
    print("ptx-match: %d kernel(s) checked, %d without an identical instance" % (checked, bad))
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
