#!/usr/bin/env python3
"""SASS instructions per trip of each kernel's main tensor-core loop, and its registers.

Why: ptxas and the front end allocate registers and schedule a kernel as a
whole, so a change outside a hot loop can change the loop's code. In v36 a
rewrite of attend_kernel's tail moved the tq4 K/V loop (whose source did not
change) from 374 to 377 and 400 instructions per tile, and the 400 cost 1.2 us
of a 87 us call (docs/kv-cache.md, "v36"). Compare a build's numbers with the
tree's before timing it on a GPU.

The main loop of a function is the smallest innermost loop (a backward branch
and the instructions between its target and itself, holding no other such
loop with HMMA) that holds the most HMMA
instructions; its length includes rarely taken branches inside it (for
attend_kernel, the rescale when the running max moves).

Usage:
  kernel_loops.py OBJ [--kernel REGEX] [--arch sm_90a] [--cuobjdump PATH]
OBJ: an object or executable with SASS for the arch (e.g. the object of
src/kv/device_attention.cu: `ninja -t commands` in the build folder gives its
compile command). cuobjdump comes with the CUDA toolkit; --cuobjdump or
$CUOBJDUMP names it when it is not on PATH.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys


def cuobjdump_path(given):
    for candidate in (given, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")):
        if candidate and os.path.exists(candidate):
            return candidate
    sys.exit("cuobjdump not found: pass --cuobjdump PATH or set CUOBJDUMP")


def run(tool, args):
    done = subprocess.run([tool] + args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("%s %s failed: %s" % (tool, " ".join(args), done.stderr.strip()))
    return done.stdout


def registers(tool, obj, arch):
    """{mangled function name: registers} from cuobjdump -res-usage."""
    out = run(tool, ["-res-usage", "-arch", arch, obj])
    regs = {}
    name = None
    for line in out.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
        m = re.search(r"REG:(\d+)", line)
        if m and name:
            regs[name] = int(m.group(1))
            name = None
    return regs


def is_mma(text):
    """A tensor-core instruction: mma.sync (HMMA) or wgmma (HGMMA)."""
    return re.match(r"(@!?U?P\w+\s+)?H(G)?MMA\b", text) is not None


def is_special_register_read(text):
    """S2R / S2UR: a read of a special register (%tid, %ctaid, the shared window's base SR_CgaCtaId).
    Inside a hot loop it means the compiler rebuilt a value it could have kept (docs/w4a16-gemm.md, v41)."""
    return re.match(r"(@!?U?P\w+\s+)?S2U?R\b", text) is not None


def main_loop(instructions):
    """(HMMA count, length, special-register reads) of the smallest innermost loop with the most HMMA, or None.

    Innermost: a backward branch whose span holds another loop with HMMA is an
    outer loop (e.g. one that spans an unrolled loop and another copy of its
    body) and is not counted."""
    index = {address: i for i, (address, _) in enumerate(instructions)}
    loops = []  # (first, last, HMMA count)
    for i, (address, text) in enumerate(instructions):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= address or target not in index:
            continue
        hmma = sum(is_mma(t) for _, t in instructions[index[target]:i + 1])
        if hmma:
            loops.append((index[target], i, hmma))
    best = None
    for first, last, hmma in loops:
        if any(f >= first and l <= last and (f, l) != (first, last) for f, l, _ in loops):
            continue
        length = last - first + 1
        if best is None or hmma > best[0] or (hmma == best[0] and length < best[1]):
            reads = sum(is_special_register_read(t) for _, t in instructions[first:last + 1])
            best = (hmma, length, reads)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("obj")
    parser.add_argument("--kernel", default="13attend_kernelI",
                        help="regex on the mangled names (default: the decode attention's attend_kernel instances)")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--cuobjdump")
    args = parser.parse_args()
    tool = cuobjdump_path(args.cuobjdump)
    regs = registers(tool, args.obj, args.arch)
    sass = run(tool, ["-sass", "-arch", args.arch, args.obj])
    rows = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0].strip()
        if not re.search(args.kernel, name):
            continue
        instructions = []
        for line in function.splitlines():
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                instructions.append((int(m.group(1), 16), m.group(2)))
        loop = main_loop(instructions)
        # attend_kernel<KF, VF, kWide, D>: the formats by name (attention_mma.cuh's Fmt)
        m = re.search(r"13attend_kernelILi(\d+)ELi(\d+)ELb([01])ELi(\d+)E", name)
        formats = {"0": "tq4", "1": "tq3", "2": "tq2", "3": "fp16"}
        label = ("attend_kernel K %s V %s %s d %s" % (formats.get(m.group(1), m.group(1)), formats.get(m.group(2), m.group(2)),
                                                      "wide" if m.group(3) == "1" else "narrow", m.group(4)) if m else name)
        # w4a16_wgmma_kernel<T, kMTile, kFloatZero, kStreamK, kDense, kOneGroup, kScaleAfter> (v41; before
        # it, without kOneGroup)
        m = re.search(r"18w4a16_wgmma_kernelI(6__half|13__nv_bfloat16)Li(\d+)E((?:Lb[01]E){4,5})", name)
        if m:
            flags = [f == "1" for f in re.findall(r"Lb([01])E", m.group(3))]
            words = ["float zero", "stream-K", "dense", "one group", "scale after"]
            if len(flags) == 4:
                words.remove("one group")
            parts = ["w4a16_wgmma", "f16" if "half" in m.group(1) else "bf16", m.group(2) + " rows"]
            for on, word in zip(flags, words):
                if on:
                    parts.append(word)
            label = " ".join(parts)
        rows.append((label, len(instructions), loop, regs.get(name)))
    if not rows:
        sys.exit("no function matches %r" % args.kernel)
    width = max(44, max(len(label) for label, _, _, _ in rows))
    print("%-*s %8s %6s %10s %8s %5s" % (width, "function", "SASS", "HMMA", "loop SASS", "loop S2R", "regs"))
    for label, total, loop, reg in sorted(rows):
        print("%-*s %8d %6s %10s %8s %5s" % (width, label, total, loop[0] if loop else "-", loop[1] if loop else "-",
                                             loop[2] if loop else "-", reg if reg is not None else "-"))


if __name__ == "__main__":
    main()
