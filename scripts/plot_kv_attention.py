#!/usr/bin/env python3
"""Plots the KV-cache decode attention rows of `lowbit bench attention --json FILE`:
time per decode step against context, one panel per batch size, for tq4 K/V,
our FP16 paged kernel and torch SDPA (FP16; measured on the same GPU when the
benchmark was given --sdpa, else the H100 anchors: the legend says which), with the
bandwidth floor of the tq4 bytes at the measured copy bandwidth.

    python3 scripts/plot_kv_attention.py ROWS.jsonl OUT.png
"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "lowbit_tq4": ("tq4 K/V (lowbit)", "tab:blue", "o"),
    "lowbit_fp16_paged": ("FP16 paged (lowbit)", "tab:orange", "s"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows")
    parser.add_argument("out")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows) if line.strip()]
    # Rows timed at a chunk length given with --split-tokens are explorations,
    # not what a user gets: the plot shows the chosen one.
    rows = [r for r in rows if r.get("suite") == "kv_decode_attention" and not r.get("split_forced", False)]
    if not rows:
        raise SystemExit(f"no kv_decode_attention rows in {args.rows}")
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4.5), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        series = defaultdict(dict)
        sdpa, floor = {}, {}
        sdpa_source = "anchors"
        for r in rows:
            if r["batch"] != batch:
                continue
            series[r["impl"]][r["context"]] = r["us"]
            # sdpa_fp16_anchor_us: rows written before the benchmark took --sdpa.
            sdpa_us = r.get("sdpa_fp16_us", r.get("sdpa_fp16_anchor_us", 0))
            if sdpa_us > 0:
                sdpa[r["context"]] = sdpa_us
                sdpa_source = r.get("sdpa_source", "anchors (H100)")
            if r["impl"] == "lowbit_tq4" and r.get("copy_GBps", 0) > 0:
                floor[r["context"]] = r["bytes"] / (r["copy_GBps"] * 1e3)
        for impl, by_ctx in sorted(series.items()):
            label, color, marker = STYLE.get(impl, (impl, None, "x"))
            ctx = sorted(by_ctx)
            ax.plot(ctx, [by_ctx[c] for c in ctx], marker=marker, color=color, label=label)
        if sdpa:
            ctx = sorted(sdpa)
            ax.plot(ctx, [sdpa[c] for c in ctx], marker="*", color="black", linestyle="--",
                    label=f"torch SDPA FP16, {sdpa_source}")
        if floor:
            ctx = sorted(floor)
            ax.plot(ctx, [floor[c] for c in ctx], color="gray", linestyle=":", label="tq4 bytes at copy bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("us per decode step (one layer)")
        ax.set_title(f"batch {batch}, 40/8 heads, d = 128")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
