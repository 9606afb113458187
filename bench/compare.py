#!/usr/bin/env python3
"""bench/compare.py: two sides of a bench A/B (`make bench-ab`, bench/ab.sh)
compared row by row.

    compare.py --before A1.csv [A2.csv ...] --after B1.csv [B2.csv ...] [--csv OUT.csv]

Each CSV is a `make bench` results file (bench-out/results.csv). A row is
keyed by (model, precision, what, batch, seqlen); each side's figure is the
lowest of its runs' medians (the runs alternate sides, so drift of the GPU
falls on both), its spread the highest over the lowest minus one. A change
is "noise" when it is smaller than the larger of the two spreads (and
below 1%): two runs of the same side disagreed by as much. Rows present on
one side only are listed, not compared.

Prints one line per row (what, batch, seqlen, before ms, after ms, change,
spreads, verdict) and a summary; with --csv, writes the same as CSV:
model,precision,what,batch,seqlen,before_ms,after_ms,change_pct,
before_spread_pct,after_spread_pct,verdict,before_commit,after_commit,gpu,
then per side the fractions of the ceilings and the copy ceiling of the run
that gave the side's figure (its lowest median), as the bench wrote them:
before_frac_copy,after_frac_copy,before_frac_gemm,after_frac_gemm,
before_ceil_copy_gbps,after_ceil_copy_gbps (empty where a results file has
no such column). Why: a figure is quoted as a fraction of the ceilings
measured in the same run.
Exit status: 0, or 2 on bad input (missing file, not a bench CSV, runs
from different GPUs: timings of two GPU models are not an A/B).
"""
import argparse
import csv
import sys

KEY = ("model", "precision", "what", "batch", "seqlen")
NEED = KEY + ("median_ms", "gpu", "commit")
# carried from the run that gave a side's figure into the CSV
CARRY = ("frac_copy", "frac_gemm", "ceil_copy_gbps")


def fail(msg):
    print("compare.py: " + msg, file=sys.stderr)
    sys.exit(2)


def load(paths):
    """-> ({key: [median_ms, ...]}, {key: [{CARRY column: value}, ...]},
    key order, {commit, ...}, {gpu, ...}); the lists run by run"""
    runs, carry, order, commits, gpus = {}, {}, [], set(), set()
    for p in paths:
        try:
            with open(p, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            fail("%s: %s" % (p, e.strerror))
        if not rows:
            fail("%s: no rows (not a bench results CSV?)" % p)
        missing = [c for c in NEED if c not in rows[0]]
        if missing:
            fail("%s: not a bench results CSV (no column %s)" % (p, ", ".join(missing)))
        for r in rows:
            k = tuple(r[c] for c in KEY)
            try:
                v = float(r["median_ms"])
            except ValueError:
                fail("%s: median_ms %r is not a number" % (p, r["median_ms"]))
            if k not in runs:
                runs[k] = []
                carry[k] = []
                order.append(k)
            runs[k].append(v)
            carry[k].append({c: r.get(c) or "" for c in CARRY})
            commits.add(r["commit"])
            gpus.add(r["gpu"])
    return runs, carry, order, commits, gpus


def best(runs, carry, k):
    """the lowest median of key k and the CARRY values of its run"""
    i = min(range(len(runs[k])), key=lambda j: runs[k][j])
    return runs[k][i], carry[k][i]


def spread(vals):
    lo = min(vals)
    return (max(vals) / lo - 1.0) if lo > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description="compare two sides of a bench A/B")
    ap.add_argument("--before", nargs="+", required=True, metavar="CSV")
    ap.add_argument("--after", nargs="+", required=True, metavar="CSV")
    ap.add_argument("--csv", metavar="OUT")
    a = ap.parse_args()
    b_runs, b_carry, b_order, b_commits, b_gpus = load(a.before)
    a_runs, a_carry, _, a_commits, a_gpus = load(a.after)
    gpus = b_gpus | a_gpus
    if len(gpus) != 1:
        fail("runs from different GPUs (%s): not an A/B" % "; ".join(sorted(gpus)))
    gpu = gpus.pop()
    bc = ",".join(sorted(b_commits))
    ac = ",".join(sorted(a_commits))
    print("before: %s (%d run%s)   after: %s (%d run%s)   GPU: %s" %
          (bc, len(a.before), "" if len(a.before) == 1 else "s", ac, len(a.after),
           "" if len(a.after) == 1 else "s", gpu))
    print("%-12s %-34s %6s %6s %10s %10s %8s %8s  %s" %
          ("model", "what", "batch", "seqlen", "before_ms", "after_ms", "change", "spread", "verdict"))
    out = []
    counts = {"faster": 0, "slower": 0, "noise": 0}
    for k in b_order:
        if k not in a_runs:
            print("%-12s %-34s %6s %6s  before only" % (k[0], k[2], k[3], k[4]))
            continue
        (bv, bx), (av, ax) = best(b_runs, b_carry, k), best(a_runs, a_carry, k)
        bs, as_ = spread(b_runs[k]), spread(a_runs[k])
        ch = av / bv - 1.0 if bv > 0 else 0.0
        if abs(ch) <= max(bs, as_, 0.01):
            verdict = "noise"
        else:
            verdict = "faster" if ch < 0 else "slower"
        counts[verdict] += 1
        print("%-12s %-34s %6s %6s %10.4f %10.4f %+7.1f%% %7.1f%%  %s" %
              (k[0], k[2], k[3], k[4], bv, av, 100 * ch, 100 * max(bs, as_), verdict))
        out.append(list(k) + ["%.6f" % bv, "%.6f" % av, "%.2f" % (100 * ch), "%.2f" % (100 * bs),
                              "%.2f" % (100 * as_), verdict, bc, ac, gpu] +
                   [x[c] for c in CARRY for x in (bx, ax)])
    for k in a_runs:
        if k not in b_runs:
            print("%-12s %-34s %6s %6s  after only" % (k[0], k[2], k[3], k[4]))
    print("%d faster, %d slower, %d within noise" % (counts["faster"], counts["slower"], counts["noise"]))
    if a.csv:
        try:
            with open(a.csv, "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(list(KEY) + ["before_ms", "after_ms", "change_pct", "before_spread_pct",
                                        "after_spread_pct", "verdict", "before_commit", "after_commit", "gpu"] +
                           [side + "_" + c for c in CARRY for side in ("before", "after")])
                w.writerows(out)
        except OSError as e:
            fail("%s: %s" % (a.csv, e.strerror))
    return 0


if __name__ == "__main__":
    sys.exit(main())
