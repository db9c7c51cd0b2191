#!/usr/bin/env python3
"""Summarise the per-CTA stamps of attention-bench-timeline.patch.

Input: the CSV that `lowbit bench attention` appends to when the patched build
runs with LOWBIT_EXP_STAMPS=FILE (three stamped calls per point, after a write
flush of L2). Rows:
  A,impl,batch,context,split,call,cta,s0..s31   attend_kernel, us from the call start
  M,impl,batch,context,split,call,cta,m0..m2    merge_kernel
attend stamps: 0 entry, 1 after the wait for the previous kernel, 2 loop start
(tables filled, queries staged), 3 all warps' loops done and their states
stored (since v36 the warps store before that barrier), 30 the head weights
done, 4 warps' merge done,
5-7 the cluster merge (after its first barrier, heads done, after its second
barrier), 8+w warp w's loop end. merge stamps: entry, after the wait, merged
(before the un-rotation and the stores). -1: not stamped.

Usage: analyze_attention_stamps.py FILE
Prints min-max (median) over the CTAs of each call for every stamp.
"""
import collections
import statistics
import sys

ATTEND = {0: "entry", 24: "length known", 25: "tables filled", 1: "after wait",
          26: "queries and tiles requested", 27: "queries rotated", 28: "queries staged", 2: "loop start",
          29: "first tile landed (warp 0)", 3: "all warps done", 30: "head weights done",
          4: "warps' merge done",
          5: "cluster barrier 1", 6: "cluster heads done", 7: "cluster barrier 2"}
MERGE = ["entry", "after wait", "merged"]


def spread(values):
    values = [v for v in values if v >= 0]
    if not values:
        return "-"
    return "%6.1f-%6.1f (median %6.1f)" % (min(values), max(values), statistics.median(values))


def main(path):
    groups = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            r = line.strip().split(",")
            groups[(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]))].append([float(x) for x in r[7:]])
    for key in sorted(groups, key=lambda k: (k[1], k[2], k[3], k[4], k[5], k[0])):
        kind, impl, batch, context, split, call = key
        stamps = groups[key]
        print("%s batch %d context %d split %d call %d: %s, %d CTAs" %
              (impl, batch, context, split, call, "attend" if kind == "A" else "merge", len(stamps)))
        if kind == "A":
            for slot, name in ATTEND.items():
                print("   %-20s %s" % (name, spread([s[slot] for s in stamps])))
            ends = [s[8 + w] for s in stamps for w in range(16)]
            print("   %-20s %s" % ("warps' loop ends", spread(ends)))
        else:
            for slot, name in enumerate(MERGE):
                print("   %-20s %s" % (name, spread([s[slot] for s in stamps])))


if __name__ == "__main__":
    main(sys.argv[1])
