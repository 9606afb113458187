#!/usr/bin/env python3
"""bench/ncu_summary.py: one bench row's kernels, from the CSV that
`ncu --csv --print-units base --metrics ...` wrote (bench/profile.sh), summed
per kernel and launch shape: calls, total and mean time, share of the row's
kernel time, achieved DRAM bandwidth and f32 FLOP rate with their fractions
of the ceilings measured by the bench in the same run, SM throughput and
achieved occupancy (both time-weighted over the calls), and the two largest
warp stall reasons (the per-reason metrics smsp__average_warps_issue_stalled_*, all
whose names hold "issue_stalled_"; their shares of the stall total, time-
weighted): what a latency-bound kernel waits on.

    ncu_summary.py --row LABEL --copy-gbps X --f32-tflops Y [--csv OUT] NCU.csv

Prints a table; --csv appends one line per kernel to OUT (the header first
when OUT is new or empty). Exit status 1 when the file holds no kernel (a
row name that matched nothing, or a profile that captured nothing), 2 on
usage errors. Standard library only."""

import argparse
import csv
import os
import sys

# Metrics bench/profile.sh asks ncu for (base units with --print-units base).
TIME = "gpu__time_duration.sum"
DRAM_R = "dram__bytes_read.sum"
DRAM_W = "dram__bytes_write.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCC_PCT = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGS = "launch__registers_per_thread"
FFMA = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"
FADD = "sm__sass_thread_inst_executed_op_fadd_pred_on.sum"
FMUL = "sm__sass_thread_inst_executed_op_fmul_pred_on.sum"
# Warp stall reasons: the average number of warps stalled for each reason
# per issued instruction (what ncu's WarpStateStats section charts; the
# section's CSV rows hold only its totals, so each reason is asked for).
STALL_REASONS = ["barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait"]
STALLS = ["smsp__average_warps_issue_stalled_%s_per_issue_active.ratio" % r for r in STALL_REASONS]
METRICS = [TIME, DRAM_R, DRAM_W, SM_PCT, OCC_PCT, REGS, FFMA, FADD, FMUL] + STALLS

# Scale of the units ncu may print (base units are the first of each group).
UNIT = {
    "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0,
    "nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "KB": 1e3, "MB": 1e6, "GB": 1e9,
}

HEADER = ["row", "kernel", "grid", "block", "regs", "calls", "total_us", "mean_us", "share",
          "dram_gbps", "frac_copy", "f32_tflops", "frac_f32", "sm_pct", "occupancy_pct", "top_stalls"]
STALL = "issue_stalled_"   # in the names of WarpStateStats' per-reason metrics


def number(text, unit):
    """A metric value as a float in base units (ncu may group digits with commas)."""
    v = float(text.replace(",", ""))
    return v * UNIT.get(unit, 1.0)


def read_launches(path):
    """Launches in file order: {id: {"kernel", "grid", "block", metric: value}}."""
    launches = {}
    order = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if not ln.startswith("==")]
    for rec in csv.DictReader(lines):
        lid = rec.get("ID")
        name = rec.get("Metric Name")
        if lid is None or name is None or rec.get("Kernel Name") is None:
            continue
        if lid not in launches:
            launches[lid] = {"kernel": rec["Kernel Name"], "grid": rec.get("Grid Size", ""),
                             "block": rec.get("Block Size", "")}
            order.append(lid)
        try:
            v = number(rec.get("Metric Value", ""), rec.get("Metric Unit", ""))
        except ValueError:
            continue   # "n/a" and the like: the metric is left out
        if STALL in name:
            # the reason: what follows "issue_stalled_", without the statistic's suffix
            reason = name.split(STALL, 1)[1].split("_per_")[0].split(".")[0]
            launches[lid].setdefault("stalls", {})[reason] = v
        else:
            launches[lid][name] = v
    return [launches[i] for i in order]


def summarize(launches):
    """Per (kernel, grid, block), in order of first launch: sums and time-weighted averages."""
    groups = {}
    keys = []
    for ln in launches:
        k = (ln["kernel"], ln["grid"], ln["block"])
        if k not in groups:
            groups[k] = {"calls": 0, "time": 0.0, "bytes": 0.0, "flops": 0.0, "sm": 0.0, "occ": 0.0,
                         "regs": ln.get(REGS, 0.0), "stalls": {}}
            keys.append(k)
        g = groups[k]
        t = ln.get(TIME, 0.0)
        g["calls"] += 1
        g["time"] += t
        g["bytes"] += ln.get(DRAM_R, 0.0) + ln.get(DRAM_W, 0.0)
        g["flops"] += 2.0 * ln.get(FFMA, 0.0) + ln.get(FADD, 0.0) + ln.get(FMUL, 0.0)
        g["sm"] += t * ln.get(SM_PCT, 0.0)
        g["occ"] += t * ln.get(OCC_PCT, 0.0)
        for reason, v in ln.get("stalls", {}).items():
            g["stalls"][reason] = g["stalls"].get(reason, 0.0) + t * v
    return [(k, groups[k]) for k in keys]


def top_stalls(stalls, n=2):
    """'reason share%, ...' of the n largest stall reasons ('' without any)."""
    total = sum(v for v in stalls.values() if v > 0)
    if total <= 0:
        return ""
    top = sorted(stalls.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return "; ".join("%s %.0f%%" % (r, 100.0 * v / total) for r, v in top)


def rows(label, summary, copy_gbps, f32_tflops):
    total = sum(g["time"] for _, g in summary) or 1.0
    out = []
    for (kernel, grid, block), g in summary:
        t = g["time"] or 1e-30
        gbps = g["bytes"] / t / 1e9
        tflops = g["flops"] / t / 1e12
        out.append([label, kernel, grid, block, "%d" % g["regs"], "%d" % g["calls"],
                    "%.2f" % (g["time"] * 1e6), "%.2f" % (g["time"] * 1e6 / g["calls"]),
                    "%.4f" % (g["time"] / total), "%.1f" % gbps,
                    "%.4f" % (gbps / copy_gbps if copy_gbps > 0 else 0.0), "%.3f" % tflops,
                    "%.4f" % (tflops / f32_tflops if f32_tflops > 0 else 0.0),
                    "%.1f" % (g["sm"] / t), "%.1f" % (g["occ"] / t), top_stalls(g["stalls"])])
    return out


def print_table(label, table, total_us):
    print("== %s: %d kernel(s), %.1f us of kernel time" % (label, len(table), total_us))
    print("%-44s %18s %6s %5s %10s %6s %9s %6s %8s %6s %6s  %s" % (
        "kernel", "grid", "calls", "regs", "total us", "share", "GB/s", "copy", "TFLOP/s", "SM%", "occ%", "stalls"))
    for r in table:
        name = r[1] if len(r[1]) <= 44 else r[1][:41] + "..."
        print("%-44s %18s %6s %5s %10s %5.1f%% %9s %5.1f%% %8s %6s %6s  %s" % (
            name, r[2], r[5], r[4], r[6], 100 * float(r[8]), r[9], 100 * float(r[10]), r[11], r[13], r[14], r[15]))


def main(argv):
    ap = argparse.ArgumentParser(description="Sum one bench row's ncu CSV per kernel.")
    ap.add_argument("--row", required=True, help="the row's label (first CSV column)")
    ap.add_argument("--copy-gbps", type=float, default=0.0, help="copy ceiling of the same run, GB/s")
    ap.add_argument("--f32-tflops", type=float, default=0.0, help="f32 GEMM ceiling of the same run, TFLOP/s")
    ap.add_argument("--csv", help="append the kernels to this CSV file")
    ap.add_argument("ncu_csv")
    a = ap.parse_args(argv)
    try:
        launches = read_launches(a.ncu_csv)
    except OSError as e:
        print("ncu_summary: %s" % e, file=sys.stderr)
        return 1
    if not launches:
        print("ncu_summary: %s: no kernel launches (did the row run, and ncu capture it?)" % a.ncu_csv,
              file=sys.stderr)
        return 1
    summary = summarize(launches)
    table = rows(a.row, summary, a.copy_gbps, a.f32_tflops)
    print_table(a.row, table, sum(g["time"] for _, g in summary) * 1e6)
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            if new:
                w.writerow(HEADER)
            w.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
