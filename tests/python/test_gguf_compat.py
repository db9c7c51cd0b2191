"""lowbit's GGUF reader and dequantizers against numpy code written from the
GGUF format description and ggml's block definitions (ggml-common.h).

The `gguf_dump` test tool (tests/tools/gguf_dump.cpp) reads a file with
lowbit's GgufFile and writes its metadata, tensor table and dequantized
tensors; this file parses the same file with `struct` and decodes the blocks
with numpy, and the two must agree exactly (the decoders below use the same
float32 operations in the same order as ggml, so the floats are bit-equal).

Two kinds of file: the default model (SmolLM2-135M-Instruct Q4_1, skipped
with a message when it is not in the cache: run scripts/fetch-default-model),
and files written here with random blocks of every type lowbit decodes.
"""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("LOWBIT_BUILD_DIR", REPO_ROOT / "build"))
TOOL = BUILD_DIR / "gguf_dump"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(
    not TOOL.is_file(),
    reason=f"{TOOL} is not built: run `ninja -C {BUILD_DIR} gguf_dump` "
    "or set LOWBIT_BUILD_DIR to the build folder that has it",
)


def default_model():
    cache = os.environ.get("LOWBIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lowbit")
    path = Path(cache) / "models" / MODEL_NAME
    if not path.is_file():
        pytest.skip(f"{path} is missing: run scripts/fetch-default-model")
    return path


# ---- GGUF reading (from the format description) -------------------------------------

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
VALUE_TYPE_NAME = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
                   8: "string", 9: "array", 10: "u64", 11: "i64", 12: "f64"}
# name, type id, elements per block, bytes per block
TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2),
}
TYPE_ID = {v[0]: k for k, v in TYPES.items()}


def read_gguf(path):
    data = Path(path).read_bytes()
    pos = 0

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return v

    def rs():
        nonlocal pos
        n = rd("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t == 8:
            return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return (et, [value(et) for _ in range(n)])
        return rd(SCALAR[t])

    assert data[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = rd("I"), rd("Q"), rd("Q")
    meta = {}
    for _ in range(n_kv):
        key = rs()
        t = rd("I")
        meta[key] = (t, value(t))
    tensors = []
    for _ in range(n_tensors):
        name = rs()
        nd = rd("I")
        shape = [rd("Q") for _ in range(nd)]
        tensors.append({"name": name, "shape": shape, "type": rd("I"), "offset": rd("Q")})
    align = meta.get("general.alignment", (4, 32))[1]
    data_offset = (pos + align - 1) // align * align
    for t in tensors:
        _, bs, ts = TYPES.get(t["type"], ("?", 1, 0))
        t["nbytes"] = int(np.prod(t["shape"])) // bs * ts
        t["bytes"] = data[data_offset + t["offset"]:data_offset + t["offset"] + t["nbytes"]]
    return {"version": version, "alignment": align, "data_offset": data_offset, "meta": meta,
            "tensors": tensors}


# ---- dequantization (numpy, from ggml's block structs) ---------------------------------

def f16(raw, cols):
    """Columns [a, b) of each block as little-endian f16, to float32."""
    return raw[:, cols[0]:cols[1]].copy().view("<f2").astype(np.float32)


def nibbles(qs):
    """qs[:, 16] -> [:, 32]: low nibbles (elements 0..15) then high nibbles (16..31)."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=1)


def fifth_bits(qh_bytes):
    qh = qh_bytes.copy().view("<u4")[:, 0]
    return ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4


def k_scale_min(sc):
    """Q4_K/Q5_K: 8 six-bit scales and mins packed in 12 bytes -> two [:, 8] arrays."""
    d = np.empty((sc.shape[0], 8), np.uint8)
    m = np.empty((sc.shape[0], 8), np.uint8)
    d[:, :4] = sc[:, 0:4] & 63
    m[:, :4] = sc[:, 4:8] & 63
    d[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return d.astype(np.float32), m.astype(np.float32)


def dequantize(type_id, raw_bytes, n):
    name, bs, ts = TYPES[type_id]
    if name == "F32":
        return np.frombuffer(raw_bytes, "<f4").copy()
    if name == "F16":
        return np.frombuffer(raw_bytes, "<f2").astype(np.float32)
    if name == "BF16":
        return (np.frombuffer(raw_bytes, "<u2").astype(np.uint32) << 16).view(np.float32)
    b = np.frombuffer(raw_bytes, np.uint8).reshape(-1, ts)
    if name == "Q4_0":
        q = nibbles(b[:, 2:18]).astype(np.int32) - 8
        y = q.astype(np.float32) * f16(b, (0, 2))
    elif name == "Q4_1":
        q = nibbles(b[:, 4:20]).astype(np.float32)
        y = q * f16(b, (0, 2)) + f16(b, (2, 4))
    elif name == "Q5_0":
        q = (nibbles(b[:, 6:22]) | fifth_bits(b[:, 2:6])).astype(np.int32) - 16
        y = q.astype(np.float32) * f16(b, (0, 2))
    elif name == "Q5_1":
        q = (nibbles(b[:, 8:24]) | fifth_bits(b[:, 4:8])).astype(np.float32)
        y = q * f16(b, (0, 2)) + f16(b, (2, 4))
    elif name == "Q8_0":
        y = b[:, 2:34].view(np.int8).astype(np.float32) * f16(b, (0, 2))
    elif name == "Q2_K":
        # 16 sub-blocks of 16: element 128*h + 32*s + 16*u + l has 2 bits at
        # shift 2*s of qs[32*h + 16*u + l]; scale byte 8*h + 2*s + u.
        sc = b[:, 0:16]
        qs = b[:, 16:80].reshape(-1, 2, 2, 16)  # [h][u][l]
        d, dmin = f16(b, (80, 82)), f16(b, (82, 84))
        y = np.empty((b.shape[0], 2, 4, 2, 16), np.float32)  # [h][s][u][l]
        for s in range(4):
            q = ((qs >> (2 * s)) & 3).astype(np.float32)
            scale = sc.reshape(-1, 2, 4, 2)[:, :, s, :]  # [h][u]
            dl = d[:, :, None] * (scale & 0xF).astype(np.float32)
            ml = dmin[:, :, None] * (scale >> 4).astype(np.float32)
            y[:, :, s] = dl[..., None] * q - ml[..., None]
        y = y.reshape(-1, 256)
    elif name == "Q3_K":
        hm = b[:, 0:32]
        qs = b[:, 32:96].reshape(-1, 2, 32)  # [h][l]
        raw = b[:, 96:108].astype(np.int32)
        # Unpack 16 six-bit scales: low 4 bits from bytes 0..7 (low nibble for
        # scales 0..7, high nibble for 8..15), high 2 bits from bytes 8..11.
        scales = np.empty((b.shape[0], 16), np.int32)
        for i in range(16):
            low = (raw[:, i % 8] >> (4 * (i // 8))) & 0xF
            high = (raw[:, 8 + i % 4] >> (2 * (i // 4))) & 3
            scales[:, i] = (low | (high << 4)) - 32
        d = f16(b, (108, 110))
        y = np.empty((b.shape[0], 2, 4, 32), np.float32)  # [h][s][l], l = 16*u + l'
        for h in range(2):
            for s in range(4):
                q = ((qs[:, h] >> (2 * s)) & 3).astype(np.int32)
                bit = 4 * h + s
                q = q - np.where((hm >> bit) & 1, 0, 4)
                sc = scales[:, 8 * h + 2 * s: 8 * h + 2 * s + 2]  # u = 0, 1
                dl = d * sc.astype(np.float32)  # [:, 2]
                y[:, h, s] = np.repeat(dl, 16, axis=1) * q.astype(np.float32)
        y = y.reshape(-1, 256)
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = f16(b, (0, 2)), f16(b, (2, 4))
        sc, mn = k_scale_min(b[:, 4:16])
        ql = b[:, 16:144] if name == "Q4_K" else b[:, 48:176]
        ql = ql.reshape(-1, 4, 32)  # [j][l]
        q = np.stack([ql & 0xF, ql >> 4], axis=2).astype(np.float32)  # [j][low/high][l]
        if name == "Q5_K":
            qh = b[:, 16:48]
            for j in range(4):
                for hi in range(2):
                    q[:, j, hi] += np.where((qh >> (2 * j + hi)) & 1, 16, 0).astype(np.float32)
        dl = (d * sc).reshape(-1, 4, 2, 1)
        ml = (dmin * mn).reshape(-1, 4, 2, 1)
        y = (dl * q - ml).reshape(-1, 256)
    elif name == "Q6_K":
        ql = b[:, 0:128].reshape(-1, 2, 64)
        qh = b[:, 128:192].reshape(-1, 2, 32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
        d = f16(b, (208, 210))[:, :, None]
        y = np.empty((b.shape[0], 2, 4, 32), np.float32)  # [h][quarter][l]
        for quarter in range(4):
            low = ql[:, :, 32 * (quarter % 2):32 * (quarter % 2) + 32]
            low = low & 0xF if quarter < 2 else low >> 4
            high = (qh >> (2 * quarter)) & 3
            q = (low | (high << 4)).astype(np.int32) - 32
            s = np.repeat(sc[:, :, 2 * quarter:2 * quarter + 2], 16, axis=2)  # is = l // 16
            y[:, :, quarter] = d * s * q.astype(np.float32)
        y = y.reshape(-1, 256)
    else:
        raise AssertionError(name)
    out = y.reshape(-1)
    assert out.size == n
    return out


# ---- the tool --------------------------------------------------------------------------

def dump(path, tmp_path, names):
    out = tmp_path / "dump"
    r = subprocess.run([str(TOOL), str(path), str(out), *names], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "info.json").read_text())
    arrays = [np.fromfile(out / f"{i}.f32", dtype=np.float32) for i in range(len(names))]
    ql = {i: np.fromfile(out / f"{i}.ql.f32", dtype=np.float32)
          for i in range(len(names)) if (out / f"{i}.ql.f32").exists()}
    return info, arrays, ql


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


# ---- the default model ----------------------------------------------------------------------

def test_default_model_metadata_and_tensor_table(tmp_path):
    path = default_model()
    ref = read_gguf(path)
    info, _, _ = dump(path, tmp_path, [])
    assert info["version"] == ref["version"] == 3
    assert info["alignment"] == ref["alignment"]
    assert info["data_offset"] == ref["data_offset"]
    assert list(info["metadata"]) == list(ref["meta"])  # same keys, same order
    for key, (t, v) in ref["meta"].items():
        got = info["metadata"][key]
        if t == 9:
            et, items = v
            assert got["type"] == f"array[{VALUE_TYPE_NAME[et]}]", key
            assert got["count"] == len(items), key
            if et != 7:
                head = items[:8]
                assert got["head"] == (head if et != 6 else [pytest.approx(x) for x in head]), key
        else:
            assert got["type"] == VALUE_TYPE_NAME[t], key
            assert got["value"] == (pytest.approx(v) if t in (6, 12) else v), key
    assert info["metadata"]["general.architecture"]["value"] == "llama"
    assert info["metadata"]["llama.context_length"]["value"] == 8192
    assert info["metadata"]["llama.attention.head_count"]["value"] == 9
    assert info["metadata"]["llama.attention.head_count_kv"]["value"] == 3
    assert len(info["tensors"]) == len(ref["tensors"]) == 272
    for got, want in zip(info["tensors"], ref["tensors"]):
        assert got["name"] == want["name"]
        assert got["shape"] == want["shape"]
        assert got["type"] == TYPES[want["type"]][0]
        assert got["offset"] == want["offset"]
        assert got["nbytes"] == want["nbytes"]


def test_default_model_dequantized_values(tmp_path):
    path = default_model()
    ref = read_gguf(path)
    by_name = {t["name"]: t for t in ref["tensors"]}
    names = ["blk.0.attn_q.weight", "blk.17.ffn_down.weight", "blk.29.attn_v.weight",
             "output_norm.weight", "token_embd.weight@0:40", "token_embd.weight@49100:49152"]
    info, arrays, ql = dump(path, tmp_path, names)
    for i, spec in enumerate(names):
        name, _, rows = spec.partition("@")
        t = by_name[name]
        ne0 = t["shape"][0]
        _, bs, ts = TYPES[t["type"]]
        raw = t["bytes"]
        if rows:
            r0, r1 = map(int, rows.split(":"))
            row_bytes = ne0 // bs * ts
            raw = raw[r0 * row_bytes:r1 * row_bytes]
        want = dequantize(t["type"], raw, len(raw) // ts * bs)
        assert arrays[i].size == want.size, spec
        np.testing.assert_array_equal(bits(arrays[i]), bits(want), err_msg=spec)
        assert np.abs(want).max() > 0, spec  # real data, not zeros
        if i in ql:  # QuantizedLinear [K, N] is the transpose of ggml's [N][K] rows
            K, N = t["shape"]
            np.testing.assert_array_equal(bits(ql[i].reshape(K, N)), bits(want.reshape(N, K).T),
                                          err_msg=spec)
    assert set(ql) == {0, 1, 2}  # the three Q4_1 weights


# ---- synthetic files with every decodable type --------------------------------------------

def gguf_bytes(tensors, metadata=(), alignment=32):
    def s(x):
        x = x.encode()
        return struct.pack("<Q", len(x)) + x

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, fmt_id, value in metadata:
        out += s(key) + struct.pack("<I", fmt_id) + struct.pack("<" + SCALAR[fmt_id], value)
    offset = 0
    offsets = []
    for name, shape, type_id, raw in tensors:
        offsets.append(offset)
        out += s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", type_id, offset)
        offset = (offset + len(raw) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    base = len(out)
    for (name, shape, type_id, raw), off in zip(tensors, offsets):
        out += b"\0" * (base + off - len(out)) + raw
    return bytes(out)


# Byte ranges of the f16 scale fields in each block: random bytes there would
# be NaN or infinity now and then, so they get random finite values instead.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_tensor(rng, name, rows):
    type_id = TYPE_ID[name]
    _, bs, ts = TYPES[type_id]
    ne0 = 2 * max(bs, 32)
    n = ne0 * rows
    if name in ("F32", "F16", "BF16"):
        values = rng.standard_normal(n).astype(np.float32)
        if name == "F32":
            raw = values.tobytes()
        elif name == "F16":
            raw = values.astype("<f2").tobytes()
        else:
            raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
        return ne0, raw
    blocks = rng.integers(0, 256, size=(n // bs, ts), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        blocks[:, at:at + 2] = (rng.uniform(-0.1, 0.1, n // bs).astype("<f2")
                                .view(np.uint8).reshape(-1, 2))
    return ne0, blocks.tobytes()


@pytest.mark.parametrize("seed", [0, 1])
def test_every_type_against_numpy(tmp_path, seed):
    rng = np.random.default_rng(seed)
    names = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
    tensors = []
    for name in names:
        ne0, raw = random_tensor(rng, name, rows=3)
        tensors.append((f"t.{name}", [ne0, 3], TYPE_ID[name], raw))
    path = tmp_path / "types.gguf"
    path.write_bytes(gguf_bytes(tensors, [("general.alignment", 4, 32)]))
    info, arrays, ql = dump(path, tmp_path, [t[0] for t in tensors])
    assert [t["type"] for t in info["tensors"]] == names
    for (tname, shape, type_id, raw), got in zip(tensors, arrays):
        want = dequantize(type_id, raw, shape[0] * shape[1])
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=tname)
        assert np.count_nonzero(want) > want.size // 2, tname
    # Q4_0 and Q4_1 as QuantizedLinear: the transpose, equal as values (Q4_0
    # may differ in the sign of a zero: ggml's (q - 8)*d is -0 for d < 0).
    for i in (names.index("Q4_0"), names.index("Q4_1")):
        K, N = tensors[i][1]
        want = arrays[i].reshape(N, K).T
        np.testing.assert_array_equal(ql[i].reshape(K, N), want, err_msg=tensors[i][0])


def test_malformed_file_is_a_clear_error(tmp_path):
    good = gguf_bytes([("w", [64, 2], TYPE_ID["Q4_1"], bytes(80))])
    for data, needle in [
        (b"GGML" + good[4:], "bad magic"),
        (good[:-10], "beyond the data section"),
        (good[:30], "truncated"),
    ]:
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        r = subprocess.run([str(TOOL), str(path), str(tmp_path / "out")], capture_output=True, text=True)
        assert r.returncode == 1
        assert "format" in r.stderr and needle in r.stderr, r.stderr
