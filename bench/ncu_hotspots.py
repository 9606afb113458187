#!/usr/bin/env python3
"""bench/ncu_hotspots.py: where one kernel's warps wait, instruction by
instruction, from the SASS source page of an Nsight Compute report
(`ncu --import R.ncu-rep --page source --print-source sass --csv`, written
by bench/profile.sh with PROFILE_KERNEL): the instructions holding the most
warp-stall samples (ncu's PC sampling: where the warps were found waiting,
and on what), each with its share of all samples, its address, its SASS
text and its largest stall reasons; then the samples summed per opcode.

    ncu_hotspots.py [--top N] SOURCE.csv

ncu names its columns per version ("Warp Stall Sampling (All Samples)",
"stall_*" reason columns, ...): they are found by the words in their
headers. A file without a sample column, or with no sample in it, says so,
prints the header it found and exits 1 (so does an unreadable file), so
the raw CSV stays the record.
Standard library only."""

import argparse
import csv
import re
import sys


def number(text):
    """A cell as a float: thousands separators and units dropped; 0 if empty."""
    t = (text or "").replace(",", "").strip()
    m = re.match(r"^-?[0-9.]+(e[-+]?[0-9]+)?", t)
    return float(m.group(0)) if m else 0.0


def find(header, *words, avoid=()):
    """The first column whose lowercased name holds every word and none of avoid."""
    for i, name in enumerate(header):
        low = name.lower()
        if all(w in low for w in words) and not any(a in low for a in avoid):
            return i
    return -1


def reason_name(header):
    """A per-reason stall column's name without ncu's prefixes ("stall_long_sb" -> "long_sb")."""
    return re.sub(r"(?i)^(warp )?stall(s)?[_ ]*(sampling)?[_ ]*", "", header).strip(" ()") or header


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25, help="instructions to list (default 25)")
    ap.add_argument("csv")
    args = ap.parse_args()
    try:
        with open(args.csv, newline="", encoding="utf-8", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        print("hotspots: cannot read %s: %s" % (args.csv, e.strerror))
        return 1
    # ncu may print "==PROF==" lines or a kernel title before the table: the
    # header is the first row naming a source / address column
    start = next((i for i, r in enumerate(rows) if any("source" in c.lower() or "address" in c.lower() for c in r)), -1)
    if start < 0:
        print("hotspots: no table with a Source or Address column in %s" % args.csv)
        return 1
    header, body = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    samples = find(header, "sampling", "all", avoid=("not issued",))
    if samples < 0:
        samples = find(header, "sampling")
    src = find(header, "source")
    addr = find(header, "address")
    if samples < 0 or src < 0:
        print("hotspots: no warp-stall sample column or no source column; the header was:")
        print("  " + " | ".join(header))
        return 1
    # per-reason sample columns: the other "stall" columns that are not totals
    reasons = [i for i, name in enumerate(header)
               if i != samples and "stall" in name.lower() and "sampling" not in name.lower()]
    total = sum(number(r[samples]) for r in body)
    if total <= 0:
        print("hotspots: no warp-stall samples in %s (was the kernel captured with --set full?)" % args.csv)
        return 1
    print("%d instructions, %d warp-stall samples" % (len(body), total))
    print("%6s  %-10s  %-48s  %s" % ("share", "address", "instruction", "largest stall reasons (samples)"))
    for r in sorted(body, key=lambda r: -number(r[samples]))[:args.top]:
        n = number(r[samples])
        if n <= 0:
            break
        top = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:3]
        why = ", ".join("%s %d" % (reason_name(h), v) for v, h in top if v > 0)
        print("%5.1f%%  %-10s  %-48s  %s" % (100.0 * n / total, r[addr] if addr >= 0 else "", r[src].strip()[:48], why))
    ops = {}
    for r in body:
        op = r[src].strip().split()
        op = [t for t in op if not t.startswith("@")]   # a predicate guard is not the opcode
        key = op[0].split(".")[0] if op else "?"
        ops[key] = ops.get(key, 0.0) + number(r[samples])
    print("\nper opcode: " + ", ".join("%s %.1f%%" % (k, 100.0 * v / total)
                                       for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:12] if v > 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
