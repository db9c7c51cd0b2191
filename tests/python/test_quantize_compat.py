"""`lowbit quantize` writes checkpoints that GPTQ and AWQ readers understand.

The oracle is an independent numpy implementation of how AutoGPTQ and AutoAWQ
unpack their tensors (written here from the formats' definitions, not from
lowbit's code): qweight/qzeros nibble order, GPTQ v1's "zeros minus one",
AWQ's [0, 2, 4, 6, 1, 3, 5, 7] order. For every layer it checks:
  * tensor names, dtypes and shapes, and the config fields those tools read;
  * the dequantized weights are within round-to-nearest error of the original
    (|w - w'| <= s/2 plus fp16 rounding of the scale);
  * `lowbit dequantize` gives exactly what the independent reader gives.
"""
import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
# RTN bound in units of the stored scale: 1/2, plus the top of the range
# exceeding the grid by < 2^-7 scales because the scale was rounded to fp16.
RTN_BOUND_IN_SCALES = 0.5 + 2.0 ** -7


def unpack_nibbles(words, axis):
    """int32 words -> 8 nibbles each, nibble j (bits 4j..4j+3) placed at 8*i + j along `axis`."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    parts = [(u >> (4 * j)) & 0xF for j in range(8)]
    stacked = np.stack(parts, axis=axis + 1)  # [..., words, 8, ...]
    shape = list(words.shape)
    shape[axis] *= 8
    return stacked.reshape(shape)


def gptq_dequant(t, prefix, group_size, v1):
    qweight, qzeros, scales, g_idx = (t[prefix + s] for s in (".qweight", ".qzeros", ".scales", ".g_idx"))
    q = unpack_nibbles(qweight, axis=0)             # [K, N]
    z = unpack_nibbles(qzeros, axis=1)              # [G, N]
    if v1:
        z = z + 1                                   # AutoGPTQ stores zero - 1
    s = scales.astype(np.float32)
    K = q.shape[0]
    assert np.array_equal(g_idx, np.arange(K) // (group_size if group_size > 0 else K))
    w = s[g_idx] * (q - z[g_idx]).astype(np.float32)  # [K, N]
    return w.T, s[g_idx].T                           # [N, K] like nn.Linear


def awq_dequant(t, prefix, group_size):
    qweight, qzeros, scales = (t[prefix + s] for s in (".qweight", ".qzeros", ".scales"))
    def unpack_awq(words):
        raw = unpack_nibbles(words, axis=1)          # slot order
        out = np.empty_like(raw)
        for slot, col in enumerate(AWQ_ORDER):
            out[:, col::8] = raw[:, slot::8]
        return out
    q = unpack_awq(qweight)                          # [K, N]
    z = unpack_awq(qzeros)                           # [G, N]
    s = scales.astype(np.float32)
    K = q.shape[0]
    g = np.arange(K) // (group_size if group_size > 0 else K)
    w = s[g] * (q - z[g]).astype(np.float32)
    return w.T, s[g].T


@pytest.mark.parametrize("fmt,sym,group_size", [
    ("gptq", False, 128), ("gptq", True, 128), ("gptq", False, 32), ("gptq", True, -1),
    ("gptq_v2", False, 64), ("awq", False, 128), ("awq", False, 256), ("awq", True, 64),
])
def test_quantized_checkpoint_reads_back_within_rtn_error(lowbit, tiny_checkpoint, tmp_path, fmt, sym, group_size):
    out = tmp_path / "q"
    args = [str(lowbit), "quantize", str(tiny_checkpoint), str(out), "--bits", "4",
            "--group-size", str(group_size), "--format", fmt] + (["--sym"] if sym else [])
    subprocess.run(args, check=True, capture_output=True, text=True)

    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["bits"] == 4 and qc["group_size"] == group_size
    if fmt.startswith("gptq"):
        assert qc["quant_method"] == "gptq" and qc["sym"] == sym and qc["desc_act"] is False
        assert qc["checkpoint_format"] == fmt
        assert json.loads((out / "quantize_config.json").read_text())["bits"] == 4
    else:
        assert qc["quant_method"] == "awq" and qc["version"] == "gemm" and qc["zero_point"] is True

    original = load_file(str(tiny_checkpoint / "model.safetensors"))
    quantized = load_file(str(out / "model.safetensors"))
    dequantized_path = tmp_path / "dq.safetensors"
    subprocess.run([str(lowbit), "dequantize", str(out), str(dequantized_path), "--dtype", "f32"],
                   check=True, capture_output=True, text=True)
    dequantized = load_file(str(dequantized_path))

    layers = [n[: -len(".weight")] for n, a in original.items()
              if a.ndim == 2 and ".layers." in n and "norm" not in n]
    assert len(layers) == 7
    for prefix in layers:
        w = original[prefix + ".weight"].astype(np.float32)
        N, K = w.shape
        assert prefix + ".weight" not in quantized
        G = 1 if group_size == -1 else K // group_size
        assert quantized[prefix + ".scales"].dtype == np.float16 and quantized[prefix + ".scales"].shape == (G, N)
        assert quantized[prefix + ".qzeros"].dtype == np.int32 and quantized[prefix + ".qzeros"].shape == (G, N // 8)
        if fmt.startswith("gptq"):
            assert quantized[prefix + ".qweight"].shape == (K // 8, N)
            assert quantized[prefix + ".g_idx"].dtype == np.int32
            wq, s = gptq_dequant(quantized, prefix, group_size, v1=(fmt == "gptq"))
            if sym:
                expected = 0x77777777 if fmt == "gptq" else 0x88888888
                assert np.all((quantized[prefix + ".qzeros"].astype(np.int64) & 0xFFFFFFFF) == expected)
        else:
            assert quantized[prefix + ".qweight"].shape == (K, N // 8)
            assert prefix + ".g_idx" not in quantized
            wq, s = awq_dequant(quantized, prefix, group_size)
        err_in_scales = np.abs(w - wq) / np.abs(s)
        assert err_in_scales.max() <= RTN_BOUND_IN_SCALES, (prefix, err_in_scales.max())
        rel = np.linalg.norm(w - wq) / np.linalg.norm(w)
        # Quantized, but not garbage (per-channel scales with 8x outlier inputs reach ~0.4).
        assert 1e-3 < rel < 0.6, (prefix, rel)
        # lowbit's own dequantization agrees bit for bit with the independent reader.
        np.testing.assert_array_equal(dequantized[prefix + ".weight"], wq)

    # Everything else is copied unchanged.
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        np.testing.assert_array_equal(quantized[name], original[name])
        np.testing.assert_array_equal(dequantized[name], original[name])


def test_dequantize_reports_error_against_reference(lowbit, tiny_checkpoint, tmp_path):
    out = tmp_path / "q"
    subprocess.run([str(lowbit), "quantize", str(tiny_checkpoint), str(out)], check=True, capture_output=True)
    r = subprocess.run([str(lowbit), "dequantize", str(out), str(tmp_path / "dq.safetensors"),
                        "--reference", str(tiny_checkpoint)], check=True, capture_output=True, text=True)
    worst = [line for line in r.stdout.splitlines() if line.startswith("worst:")]
    assert worst, r.stdout
    scales = float(worst[0].split("max error")[1].split()[0])
    assert 0.4 < scales <= RTN_BOUND_IN_SCALES
