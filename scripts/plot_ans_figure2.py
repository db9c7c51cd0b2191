#!/usr/bin/env python3
"""The seed's Figure 2 from `lowbit bench ans --json FILE` rows.

Time of a chain of K square matrix-vector products (with requantization) per
method against the matrix size N: dashed lines without the weight copies
(matrices resident on the GPU), solid lines with every matrix copied from
pinned host memory during the chain, as the seed's Figure 2 draws them.

usage: scripts/plot_ans_figure2.py ROWS.jsonl OUT.png [--title TEXT]
"""
import argparse
import json
import sys

LABELS = {
    "cublas_sgemv_fp32": "cuBLAS SGEMV (fp32)",
    "cublaslt_int8_n32": "cuBLASLt int8 GEMM (n padded to 32)",
    "lowbit_int8_gemv": "lowbit int8 GEMV",
    "matvans_seed": "MATVANS (seed format, thread per row)",
    "lowbit_fused": "lowbit fused rANS + GEMV",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows")
    ap.add_argument("out")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}  # (impl, copies) -> {n: ms}
    layers = None
    with open(args.rows) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("suite") != "ans_figure2":
                continue
            layers = r.get("K", layers)
            series.setdefault((r["impl"], bool(r["copies"])), {})[int(r["n"])] = r["us"] / 1e3
    if not series:
        print(f"{args.rows}: no ans_figure2 rows", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = {}
    for (impl, copies), pts in sorted(series.items()):
        ns = sorted(pts)
        if impl not in colors:
            colors[impl] = f"C{len(colors)}"
        ax.plot(ns, [pts[n] for n in ns], marker="o", color=colors[impl], linestyle="-" if copies else "--",
                label=f"{LABELS.get(impl, impl)}{' + copies' if copies else ''}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("matrix size N (N x N, int8 codes)")
    ax.set_ylabel(f"time per chain of K = {layers} products [ms]")
    ax.set_title(args.title or f"Figure 2 reproduced: K = {layers} matrix-vector products; dashed: resident, solid: with copies")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
