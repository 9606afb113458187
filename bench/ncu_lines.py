#!/usr/bin/env python3
"""bench/ncu_lines.py: where one kernel's warps wait, source line by source
line and phase by phase, from the correlated source page of an Nsight
Compute report (`ncu --import R.ncu-rep --page source --print-source
cuda,sass --csv`, written by bench/profile.sh with PROFILE_KERNEL; the
kernel built with -lineinfo). ncu_hotspots.py ranks single instructions;
a phase of a generated kernel (staging, a product, a one-warp scan) is
hundreds of them spread over inlined helpers, so this sums the warp-stall
samples of every SASS instruction per CUDA source line, and per region:
the lines from one phase marker comment to the next in the same file.

A marker is a comment line naming a phase by a letter or a number, as the
kernels write them:
    // ---- A: stage the chunk (rows past the sequence end are zeros) ----
    // B: cumulative decay and weights (warp 0, fixed order). The caller
    // ---- 4: x_proj: this block's partials, then the cluster's sums ----
(--marker REGEX overrides the pattern; its last group, or the whole match,
is the title). Lines before a file's first marker count as "FILE (top)".
The markers are read from the source files themselves (comments have no
SASS, so the page does not list them): a file path that does not exist
as given is looked up under --src-dir (the package directory).

    ncu_lines.py [--top N] [--src-dir DIR] [--marker REGEX] PAGE.csv

Page layout: a "File Path" row before each file's lines, a header row
starting "Line No", then per source line a row with its number and text,
followed by its SASS rows (first cell empty, then address and instruction,
then the counters). Only the SASS rows are summed (the source line's own
row repeats their sums). A page without SASS rows, without a sample
column or without samples says so and exits 1, so the raw CSV stays the
record. An inlined helper's instructions count where the helper is written
(its own lines and region) in the first table; the second table counts
them at the phase that called it, read from the code's layout: the SASS
rows in address order, each row of a marked region sets the current phase
and every other row (a file's top, a helper file without markers) counts
for the current one. The compiler lays an inlined call out where it is
called, so this is right for straight-line phases; a block it moved out of
line (a cold path placed at the end) counts for the phase before it, which
is why both tables are printed. Standard library only."""

import argparse
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_hotspots import find, number, reason_name  # noqa: E402  (one reading of ncu's cells and headers)

MARKER = r"^\s*//\s*(?:-{2,}\s*)?([A-Z0-9][0-9]?:\s*.*?)\s*(?:-{2,})?\s*$"


def read_page(path):
    """(header, items): items are (file, line, source text, samples row) per SASS row."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = list(csv.reader(f))
    header, items, file, line, text = None, [], "?", 0, ""
    for r in rows:
        if not r:
            continue
        head = r[0].strip()
        if head == "File Path":
            file = r[1].strip() if len(r) > 1 else "?"
        elif head in ("Function Name", "Kernel Name"):
            continue
        elif head.startswith("Line No"):
            header = r
        elif header is None:
            continue
        elif head:
            # a source line: its number and text (its own counters repeat its SASS rows' sums)
            line = int(number(head))
            text = r[1].strip() if len(r) > 1 else ""
        elif len(r) == len(header):
            items.append((file, line, text, r))
    return header, items


def markers(path, src_dir, pattern):
    """Sorted (line, title) of the phase markers of a source file; None if it cannot be read."""
    for cand in (path, os.path.join(src_dir or ".", path), os.path.join(src_dir or ".", os.path.basename(path))):
        try:
            with open(cand, encoding="utf-8", errors="replace") as f:
                out = []
                for i, s in enumerate(f, 1):
                    m = pattern.match(s)
                    if m:
                        title = (m.group(m.lastindex) if m.lastindex else m.group(0)).strip()
                        out.append((i, title[:60]))
                return out
        except OSError:
            continue
    return None


def region(marks, name, line):
    """(title, marked): the last marker at or above line, or the file's top
    before the first (marked False: a helper's code, not a phase)."""
    if marks is None:
        return "%s (source not found)" % name, False
    title, marked = "%s (top)" % name, False
    for ln, t in marks:
        if ln > line:
            break
        title, marked = "%s: %s" % (name, t), True
    return title, marked


def address(cell):
    """An instruction's address (hex as ncu prints it); -1 where unreadable."""
    try:
        return int(cell.strip(), 16)
    except ValueError:
        return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25, help="source lines to list (default 25)")
    ap.add_argument("--src-dir", default="", help="where relative or moved source paths are looked up")
    ap.add_argument("--marker", default=MARKER, help="regex of a phase marker line (default: the kernels' style)")
    ap.add_argument("csv")
    args = ap.parse_args()
    try:
        pattern = re.compile(args.marker)
    except re.error as e:
        print("lines: bad --marker %r: %s" % (args.marker, e))
        return 1
    try:
        header, items = read_page(args.csv)
    except OSError as e:
        print("lines: cannot read %s: %s" % (args.csv, e.strerror))
        return 1
    if header is None or not items:
        print("lines: no correlated SASS rows (a \"Line No\" header and rows under it) in %s;"
              " was the kernel built with -lineinfo and the page printed with --print-source cuda,sass?" % args.csv)
        return 1
    samples = find(header, "sampling", "all", avoid=("not issued",))
    if samples < 0:
        samples = find(header, "sampling")
    if samples < 0:
        print("lines: no warp-stall sample column; the header was:")
        print("  " + " | ".join(header))
        return 1
    reasons = [i for i, name in enumerate(header)
               if i != samples and "stall" in name.lower() and "sampling" not in name.lower()]
    addr = next((i for i, name in enumerate(header) if name.strip().lower() == "address"), -1)

    def add(table, reasons_of_table, reg, n, r):
        table[reg] = table.get(reg, 0.0) + n
        acc = reasons_of_table.setdefault(reg, {})
        for i in reasons:
            acc[header[i]] = acc.get(header[i], 0.0) + number(r[i])
    total = sum(number(r[samples]) for _, _, _, r in items)
    if total <= 0:
        print("lines: no warp-stall samples in %s (was the kernel captured with --set full?)" % args.csv)
        return 1

    per_line, per_region, why, marks, placed = {}, {}, {}, {}, []
    for file, line, text, r in items:
        n = number(r[samples])
        key = (file, line)
        per_line[key] = (per_line.get(key, (0.0, text))[0] + n, text)
        if file not in marks:
            marks[file] = markers(file, args.src_dir, pattern)
        reg, marked = region(marks[file], os.path.basename(file), line)
        placed.append((address(r[addr]) if addr >= 0 else -1, reg, marked, r))
        add(per_region, why, reg, n, r)

    # the second table: every row at the phase whose code it is laid out in
    per_caller, why_caller, current = {}, {}, "(before the first phase marker)"
    for _, reg, marked, r in sorted(placed, key=lambda p: p[0]):
        if marked:
            current = reg
        add(per_caller, why_caller, current, number(r[samples]), r)

    def reasons_of(acc):
        top = sorted(((v, h) for h, v in acc.items()), reverse=True)[:3]
        return ", ".join("%s %d" % (reason_name(h), v) for v, h in top if v > 0)

    print("%d SASS instructions on %d source lines, %d warp-stall samples" % (len(items), len(per_line), total))
    for title, table, reasons_table in (
            ("per region (from one phase marker to the next):", per_region, why),
            ("per phase, inlined code at its caller (SASS in address order; see --help):",
             per_caller, why_caller)):
        print("\n" + title)
        for reg, n in sorted(table.items(), key=lambda kv: -kv[1]):
            if n <= 0:
                break
            print("%5.1f%%  %-72s  %s" % (100.0 * n / total, reg[:72], reasons_of(reasons_table[reg])))
    print("\nper source line:")
    for (file, line), (n, text) in sorted(per_line.items(), key=lambda kv: -kv[1][0])[:args.top]:
        if n <= 0:
            break
        print("%5.1f%%  %-28s  %s" % (100.0 * n / total, "%s:%d" % (os.path.basename(file), line), text[:70]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
