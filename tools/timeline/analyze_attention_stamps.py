#!/usr/bin/env python3
"""Summarise the per-CTA stamps of attention-bench-timeline.patch.

Input: the CSV that `lowbit bench attention` appends to when the patched build
runs with LOWBIT_EXP_STAMPS=FILE (three stamped calls per point, after a write
flush of L2). Rows:
  A,impl,batch,context,split,call,cta,s0..s31[,c0..c31]   attend_kernel, us from the call start
  M,impl,batch,context,split,call,cta,m0..m2[,n0..n2]     merge_kernel
s are %globaltimer stamps (one clock for all SMs, but in 256 ns steps on an
H200); c and n (since v36) the same stamps in the SM's %clock64 cycles since
the CTA's first stamp: exact durations inside a CTA, printed per phase in
cycles and in us at the call's SM clock (measured from the loops when they
last over 5 us, else CLOCK_MHZ, default 1980).
attend stamps: 0 entry, 1 after the wait for the previous kernel, 2 loop start
(tables filled, queries staged), 3 all warps' loops done (after the barrier
that follows them; the warps' states are stored after it), 30 (since v36)
the head weights done, 4 warps' merge done, 5-7 the cluster merge (after its
first barrier, heads done, after its second barrier), 31 (since v36) warp
0's cluster chunks loaded and merged, 8+w warp w's loop end. 24-29: the
prologue (names below). merge stamps: entry, after the wait, merged
(before the un-rotation and the stores). -1: not stamped.

Usage: analyze_attention_stamps.py FILE [CLOCK_MHZ]
Prints min-max (median) over the CTAs of each call for every stamp, then the
phases' cycle counts where the file has them.
"""
import collections
import statistics
import sys

ATTEND = {0: "entry", 24: "length known", 25: "tables filled", 1: "after wait",
          26: "queries and tiles requested", 27: "queries rotated", 28: "queries staged", 2: "loop start",
          29: "first tile landed (warp 0)", 3: "all warps done", 30: "head weights done",
          4: "warps' merge done",
          5: "cluster barrier 1", 31: "cluster chunks merged (warp 0)", 6: "cluster heads done",
          7: "cluster barrier 2"}
MERGE = ["entry", "after wait", "merged"]
# (from slot, to slot, name): durations inside one CTA, from the cycle stamps
PHASES = [(0, 1, "entry -> after wait"), (1, 2, "after wait -> loop start"), (2, 3, "loop start -> all warps done"),
          (3, 30, "states stored, head weights"), (30, 4, "output sums and stores"), (4, 5, "wait at cluster barrier 1"),
          (5, 31, "cluster chunks loaded, merged"), (31, 6, "cluster un-rotation, stores"), (6, 7, "cluster barrier 2")]
MERGE_PHASES = [(0, 1, "wait"), (1, 2, "merge")]


def cycles(values, mhz):
    values = [v for v in values if v >= 0]
    if not values:
        return "-"
    med = statistics.median(values)
    return "%7d-%7d cycles (median %7d = %6.2f us)" % (min(values), max(values), med, med / mhz)


def spread(values):
    values = [v for v in values if v >= 0]
    if not values:
        return "-"
    return "%6.1f-%6.1f (median %6.1f)" % (min(values), max(values), statistics.median(values))


def main(path, default_mhz=1980.0):
    groups = collections.defaultdict(list)
    clock = {}  # (impl, batch, context, split, call) -> the SM clock measured from its attend loops
    with open(path) as f:
        for line in f:
            r = line.strip().split(",")
            groups[(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]))].append([float(x) for x in r[7:]])
    for key in sorted(groups, key=lambda k: (k[1], k[2], k[3], k[4], k[5], k[0])):
        kind, impl, batch, context, split, call = key
        stamps = groups[key]
        mhz = clock.get(key[1:], default_mhz)
        print("%s batch %d context %d split %d call %d: %s, %d CTAs" %
              (impl, batch, context, split, call, "attend" if kind == "A" else "merge", len(stamps)))
        if kind == "A":
            for slot, name in ATTEND.items():
                print("   %-20s %s" % (name, spread([s[slot] for s in stamps])))
            ends = [s[8 + w] for s in stamps for w in range(16)]
            print("   %-20s %s" % ("warps' loop ends", spread(ends)))
            if len(stamps[0]) >= 64:
                # The SM clock of this call, from each CTA's loop (cycles over
                # globaltimer us; long enough that the timer's 256 ns steps do
                # not matter): under a DRAM stream the H200 ran at ~1.7 GHz,
                # not its 1.98 GHz boost.
                rates = [(s[32 + 3] - s[32 + 2]) / (s[3] - s[2]) for s in stamps
                         if s[2] >= 0 and s[3] - s[2] > 5.0 and s[32 + 2] >= 0 and s[32 + 3] >= 0]
                if rates:
                    mhz = clock[key[1:]] = statistics.median(rates)
                    print("   %-28s %7.0f MHz (loop cycles / loop us)" % ("SM clock", mhz))
                for a, b, name in PHASES:
                    print("   %-28s %s" % (name, cycles([s[32 + b] - s[32 + a] for s in stamps
                                                             if s[32 + a] >= 0 and s[32 + b] >= 0], mhz)))
        else:
            for slot, name in enumerate(MERGE):
                print("   %-20s %s" % (name, spread([s[slot] for s in stamps])))
            if len(stamps[0]) >= 6:
                for a, b, name in MERGE_PHASES:
                    print("   %-28s %s" % (name, cycles([s[3 + b] - s[3 + a] for s in stamps], mhz)))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1980.0)
