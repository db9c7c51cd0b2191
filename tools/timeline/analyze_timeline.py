#!/usr/bin/env python3
"""Summarizes the per-CTA stamps of one replayed decode step.

The stamps come from a build with decode-step-timeline.patch applied (see
README.md beside this file): `LOWBIT_EXP_TIMELINE=FILE lowbit bench model ...`
writes one CSV row per CTA of the gemv and attention kernels. Stamps (ns of
%globaltimer, 0 where a CTA did not pass that point):
  t0 entry (gemv: after its weight prefetch), t1 after the wait for the
  previous kernel, t2 gemv: x staged / attention: every warp's state in
  shared memory, t3 end of the K (or KV) loop, t4 exit, t5 gemv: after the
  split-K count / attention: before the first cluster barrier, t6 gemv:
  the last CTA's sum done / attention: after that barrier, t7 gemv: the
  epilogue done / attention: the cluster merge done, t8-t10 the qkv
  epilogue's norm, RoPE and rotation.

Usage: analyze_timeline.py FILE [FIRST_LAUNCH [COUNT]]
Prints, for COUNT launches from FIRST_LAUNCH (in start order; a Qwen3-14B
step has 5 per layer), when the CTAs were released, staged, ended their
loops and exited (us from the first launch printed), and for K-split GEMMs
the median tail of the column blocks' last CTAs.
"""
import csv
import statistics
import sys
from collections import defaultdict

KINDS = {1: "attention", 10: "gemv", 11: "gemv+norm", 12: "gemv+residual", 13: "gemv+attn-inputs",
         14: "gemv+norm+attn-inputs"}


def read(path):
    with open(path) as f:
        header = f.readline().strip()
        rows = [{k: int(v) for k, v in d.items()} for d in csv.DictReader(f)]
    return header, rows


def launches_of(rows):
    """Groups CTAs by (key, kind), split where one key launches again (> 50 us apart)."""
    groups = defaultdict(list)
    for d in rows:
        groups[(d["key"], d["kind"])].append(d)
    launches = []
    for key, ctas in groups.items():
        ctas.sort(key=lambda d: d["t0"])
        current = [ctas[0]]
        for d in ctas[1:]:
            if d["t0"] - current[-1]["t0"] > 50000:
                launches.append((key[1], current))
                current = [d]
            else:
                current.append(d)
        launches.append((key[1], current))
    launches.sort(key=lambda kv: min(d["t0"] for d in kv[1]))
    return launches


def main():
    path = sys.argv[1]
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    header, rows = read(path)
    launches = launches_of(rows)
    print(header, f"({len(launches)} launches)")
    shown = launches[first:first + count]
    if not shown:
        sys.exit(f"no launch {first}: the file has {len(launches)}")
    base = min(d["t0"] for d in shown[0][1])
    us = lambda t: (t - base) / 1000.0
    print(f"{'kernel':24} {'CTAs':>5} {'start':>7} {'wait':>7} {'staged':>7} {'loops end':>15} {'exit':>7}  tail")
    for kind, ctas in shown:
        def col(i):
            return [us(d[f"t{i}"]) for d in ctas if d[f"t{i}"]]
        t3 = col(3)
        staged = f"{statistics.median(col(2)):7.1f}" if col(2) else f"{'-':>7}"
        tail = ""
        if kind != 1:
            blocks = defaultdict(list)
            for d in ctas:
                blocks[d["bx"]].append(d)
            count_us, sum_us = [], []
            for block in blocks.values():
                last = max(block, key=lambda d: d["t4"])
                if last.get("t5") and last.get("t6"):
                    count_us.append((last["t5"] - max(d["t3"] for d in block)) / 1000.0)
                    sum_us.append((last["t6"] - last["t5"]) / 1000.0)
            if count_us:
                tail = f"count {statistics.median(count_us):.1f}, sum {statistics.median(sum_us):.1f}"
        print(f"{KINDS.get(kind, str(kind)):24} {len(ctas):5d} {min(col(0)):7.1f} {min(col(1)):7.1f} {staged} "
              f"{min(t3):7.1f}-{max(t3):7.1f} {max(col(4)):7.1f}  {tail}")


if __name__ == "__main__":
    main()
