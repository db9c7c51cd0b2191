#!/usr/bin/env python3
"""Times the peers that PyTorch can run, on the GPU at hand, as the anchors
(../shared/anchors, taken on an H100) were taken, so that lowbit's benchmarks
on another GPU compare against baselines measured on that same GPU:

  copy      device-to-device copy of 1 GiB (bytes read + written)
  gemm      cuBLAS FP16 through torch.matmul, y[M,N] = x[M,K] @ W[K,N], on the
            nine anchor shapes (Marlin is not a PyPI package and is not timed)
  sdpa      decode attention with FP16 K/V: torch SDPA, one query token,
            GQA 40 query heads over 8 KV heads, d = 128 (Qwen3-14B)

Timing: CUDA events around each call, L2 evicted before every call by
writing a 256 MiB buffer (as triton.testing.do_bench does), warm-up calls
first, median of --reps calls; the GPU idles --settle-ms (50) before each
point's warm-up, as `lowbit bench` does. Random normal inputs.

Output: one JSON object per line, in the anchors' schema ("kind", "impl",
"us", "GBps", and the shape keys), to --out; `lowbit bench attention --sdpa
FILE` reads the attn_decode rows. A table is printed as well.

Needs torch with CUDA; not part of the test suite (CI has no GPU or torch).
"""
import argparse
import json
import statistics
import sys
import time

GEMM_SHAPES = [  # name, K, N: the anchors' nine layers
    ("sq4096", 4096, 4096), ("sq8192", 8192, 8192), ("sq16384", 16384, 16384),
    ("qwen3-qkv", 5120, 7168), ("qwen3-o", 5120, 5120), ("qwen3-gateup", 5120, 34816),
    ("qwen3-down", 17408, 5120), ("llama70-gateup", 8192, 57344), ("llama70-down", 28672, 8192),
]
Q_HEADS, KV_HEADS, HEAD_DIM = 40, 8, 128


def parse_ints(text):
    return [int(v) for v in text.split(",") if v]


def time_call(torch, fn, reps, warmup, flush, settle_ms):
    """Median of `reps` event-timed calls of fn, the L2 evicted before each.

    The GPU first idles settle_ms (after a synchronization), as lowbit's
    timer does with CudaTimerOptions::settle_ms: each point then starts from
    the same idle state, not in the wake of the heavier point before it.
    """
    if settle_ms > 0:
        torch.cuda.synchronize()
        time.sleep(settle_ms / 1e3)
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON rows, one per line")
    p.add_argument("--what", default="copy,gemm,sdpa", help="comma list of copy, gemm, sdpa")
    p.add_argument("--m", default="1,16,32,64,128,256,1024", help="GEMM rows")
    p.add_argument("--batch", default="1,8,32", help="SDPA batch sizes")
    p.add_argument("--context", default="4096,32768,131072", help="SDPA context lengths")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--settle-ms", type=int, default=50,
                   help="milliseconds the GPU idles before each point's warm-up (lowbit bench's --settle-ms)")
    args = p.parse_args()
    # The arguments are checked before torch is imported: a typo costs no
    # CUDA start-up, and the checks run (and are tested) without torch.
    what = set(args.what.split(","))
    unknown = what - {"copy", "gemm", "sdpa"}
    if unknown:
        sys.exit(f"bench_torch_peers.py: unknown --what entries {sorted(unknown)} (copy, gemm, sdpa)")
    lists = {}
    for name in ("m", "batch", "context"):
        try:
            lists[name] = parse_ints(getattr(args, name))
        except ValueError:
            sys.exit(f"bench_torch_peers.py: --{name} takes comma-separated integers, not {getattr(args, name)!r}")
        if not lists[name] or min(lists[name]) < 1:
            sys.exit(f"bench_torch_peers.py: --{name} takes positive integers, not {getattr(args, name)!r}")
    if args.reps < 1 or args.warmup < 0 or args.settle_ms < 0:
        sys.exit("bench_torch_peers.py: --reps must be >= 1, --warmup >= 0 and --settle-ms >= 0")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("bench_torch_peers.py: needs torch (pip install torch)")
    if not torch.cuda.is_available():
        sys.exit("bench_torch_peers.py: torch sees no CUDA device")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    rows = []

    def emit(row):
        row["device"] = name
        rows.append(row)
        print(json.dumps(row), flush=True)

    if "copy" in what:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
        dst = torch.empty_like(src)
        us = time_call(torch, lambda: dst.copy_(src), args.reps, args.warmup, flush, args.settle_ms)
        emit({"kind": "copy", "bytes": 2 * src.numel(), "us": us, "GBps": 2 * src.numel() / us / 1e3})
        del src, dst

    if "gemm" in what:
        for shape, k, n in GEMM_SHAPES:
            w = torch.randn(k, n, dtype=torch.float16, device=dev)
            for m in lists["m"]:
                x = torch.randn(m, k, dtype=torch.float16, device=dev)
                us = time_call(torch, lambda: torch.matmul(x, w), args.reps, args.warmup, flush, args.settle_ms)
                moved = 2 * (k * n + m * k + m * n)
                emit({"kind": "gemm", "impl": "cublas_fp16", "us": us, "GBps": moved / us / 1e3, "shape": shape,
                      "K": k, "N": n, "M": m})
            del w

    if "sdpa" in what:
        for batch in lists["batch"]:
            for context in lists["context"]:
                q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, dtype=torch.float16, device=dev)
                kv_shape = (batch, KV_HEADS, context, HEAD_DIM)
                k = torch.randn(kv_shape, dtype=torch.float16, device=dev)
                v = torch.randn(kv_shape, dtype=torch.float16, device=dev)
                us = time_call(torch, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               args.reps, args.warmup, flush, args.settle_ms)
                kv_bytes = 2 * k.numel() * 2
                emit({"kind": "attn_decode", "impl": "torch_sdpa_fp16", "B": batch, "L": context, "us": us,
                      "GBps": kv_bytes / us / 1e3})
                del q, k, v
                torch.cuda.empty_cache()

    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"bench_torch_peers.py: {len(rows)} rows on {name} (torch {torch.__version__}) -> {args.out}")


if __name__ == "__main__":
    main()
