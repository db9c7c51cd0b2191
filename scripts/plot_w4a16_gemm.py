#!/usr/bin/env python3
"""Plots the W4A16 GEMM benchmark rows (bench_w4a16_gemm --json FILE, or
`lowbit bench gemm --json FILE`): speedup over cuBLAS FP16 measured in the same
run, against M, one line per layer shape, for one implementation (default
lowbit_auto), with Marlin's geometric mean from the anchors as markers.

    python3 scripts/plot_w4a16_gemm.py ROWS.jsonl OUT.png [--impl lowbit_auto]
"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARLIN_GEOMEAN = {1: 2.16, 16: 2.13, 64: 1.47}  # shared anchors, taken on an H100
TARGET_GEOMEAN = {1: 3.0, 16: 3.0, 64: 2.0}  # the targets (geomean of the 9 shapes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows")
    parser.add_argument("out")
    parser.add_argument("--impl", default="lowbit_auto")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows) if line.strip()]
    series = defaultdict(dict)
    for r in rows:
        if r.get("suite") == "gemm_w4a16" and r.get("impl") == args.impl:
            series[f'{r["layer"]} ({r["K"]}x{r["N"]})'][r["M"]] = r["speedup_vs_cublas"]
    if not series:
        raise SystemExit(f"no rows with impl {args.impl} in {args.rows}")
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, by_m in sorted(series.items()):
        ms = sorted(by_m)
        ax.plot(ms, [by_m[m] for m in ms], marker="o", label=label)
    ax.scatter(list(MARLIN_GEOMEAN), list(MARLIN_GEOMEAN.values()), marker="*", s=160, color="black",
               zorder=5, label="Marlin, geomean of the 9 shapes (anchors, H100)")
    ax.scatter(list(TARGET_GEOMEAN), list(TARGET_GEOMEAN.values()), marker="_", s=400, color="red",
               zorder=5, label="target, geomean")
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.axhline(0.9, color="red", linewidth=1, linestyle="--", label="0.9x: the floor for every M (target)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over cuBLAS FP16 (same run)")
    ax.set_title(f"W4A16 GEMM, group 128, fp16: {args.impl}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
