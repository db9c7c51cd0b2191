#!/usr/bin/env python3
"""Plots `lowbit bench model --json FILE` rows: decode tokens/s per
(batch, context), one bar per weights+KV configuration, with the bytes floor
(weights + K/V read once at the measured copy bandwidth) as a marker.

    python3 scripts/plot_model_bench.py ROWS.jsonl OUT.png
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows")
    parser.add_argument("out")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows) if line.strip()]
    rows = [r for r in rows if r.get("suite") == "model_decode"]
    if not rows:
        raise SystemExit("no model_decode rows in " + args.rows)
    points = sorted({(r["batch"], r["context"]) for r in rows})
    impls = sorted({r["impl"] for r in rows})
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, impl in enumerate(impls):
        xs, ys, floors = [], [], []
        for j, (batch, context) in enumerate(points):
            r = next((r for r in rows if r["impl"] == impl and r["batch"] == batch and r["context"] == context), None)
            if r is None:
                continue
            xs.append(j + i * width)
            ys.append(r["tokens_per_s"])
            floors.append(batch / (r["floor_us"] * 1e-6))
        ax.bar(xs, ys, width, label=impl.replace("+", " weights, ") + " KV")
        ax.scatter(xs, floors, marker="_", color="black", s=200, zorder=3)
    ax.set_xticks([j + width * (len(impls) - 1) / 2 for j in range(len(points))])
    ax.set_xticklabels([f"batch {b}\ncontext {c}" for b, c in points])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s (black: bytes floor)")
    ax.set_title(f"lowbit bench model: {rows[0].get('config', '')}, random weights")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
