#!/usr/bin/env python3
"""One line per (layer, M) of `lowbit bench gemm --json` rows: cuBLAS FP16 us,
then each lowbit row's us and speedup over cuBLAS ("+R": its plan ran the last
R rows as a second GEMM), and the geometric mean of each row's speedup over
the points it ran. For comparing variants compactly.

usage: gemm_table.py ROWS.jsonl [ROWS.jsonl ...]
"""
import json
import math
import sys
from collections import OrderedDict, defaultdict


def main(paths):
    points = OrderedDict()
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if row.get("suite") != "gemm_w4a16":
                    continue
                key = (row["layer"], row["M"])
                points.setdefault(key, OrderedDict())[row["impl"]] = row
    impls = []
    for rows in points.values():
        for impl in rows:
            if impl != "cublas_fp16" and impl not in impls:
                impls.append(impl)
    short = [i.replace("lowbit_", "") for i in impls]
    print(f"{'layer':15s} {'M':>5s} {'cublas':>8s} " + " ".join(f"{s:>19s}" for s in short))
    logs = defaultdict(list)
    for (layer, M), rows in points.items():
        base = rows.get("cublas_fp16")
        cells = []
        for impl in impls:
            r = rows.get(impl)
            if r is None or base is None:
                cells.append(f"{'-':>19s}")
                continue
            ratio = base["us"] / r["us"]
            logs[impl].append(math.log(ratio))
            rem = r.get("remainder_rows", 0)
            mark = f"+{rem}" if rem else ""
            cells.append(f"{r['us']:8.1f} {ratio:4.2f}x {mark:>4s}")
        b = f"{base['us']:8.1f}" if base else f"{'-':>8s}"
        print(f"{layer:15s} {M:5d} {b} " + " ".join(cells))
    print(f"{'geomean':15s} {'':5s} {'':8s} " +
          " ".join(f"{math.exp(sum(logs[i]) / len(logs[i])):18.3f}x" if logs[i] else f"{'-':>19s}" for i in impls))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
