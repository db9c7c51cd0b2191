"""scripts/bench_torch_peers.py as a user meets it without a GPU: its help,
and its argument checks, which run before torch is imported (the timing
itself needs torch with CUDA and runs in scripts/gpu-check on the GPU)."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_torch_peers.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_names_what_it_times():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for needle in ("SDPA", "cuBLAS", "--out", "--what", "anchors", "--settle-ms"):
        assert needle in r.stdout, needle


def test_bad_arguments_are_refused_before_torch(tmp_path):
    out = str(tmp_path / "rows.jsonl")
    cases = [
        (["--what", "sdpa,marlin"], "unknown --what entries ['marlin']"),
        (["--m", "1,x"], "--m takes comma-separated integers"),
        (["--context", "0"], "--context takes positive integers"),
        (["--batch", ","], "--batch takes positive integers"),
        (["--reps", "0"], "--reps must be >= 1"),
        (["--settle-ms", "-5"], "--settle-ms >= 0"),
    ]
    for args, message in cases:
        r = run("--out", out, *args)
        assert r.returncode != 0, args
        assert message in r.stderr, (args, r.stderr)
    assert not pathlib.Path(out).exists()


def test_out_is_required():
    r = run("--what", "sdpa")
    assert r.returncode != 0
    assert "--out" in r.stderr
