"""Compatibility of lowbit's safetensors reader and writer with the Python package.

The Python `safetensors` package writes files, the `safetensors_copy` test tool
(tests/tools/safetensors_copy.cpp: our SafetensorsFile -> SafetensorsWriter)
copies them, and the Python package reads the copies back.

The build folder comes from $LOWBIT_BUILD_DIR, else <repo root>/build. The tests
are skipped (with a message saying how to build it) when the tool is missing.

Byte identity: SafetensorsWriter lays tensors out as the Python package does
(largest dtype first, then by name; compact JSON; "__metadata__" first; header
padded with spaces to a multiple of 8), so a copy of a Python-written file is
byte-identical to it -- as long as the metadata has at most one key. Python
stores metadata in a Rust HashMap and writes its keys in a random order that
changes from run to run, while we write them sorted, so with two or more keys
only the contents (header as parsed JSON, and the data section) can be compared.
"""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("LOWBIT_BUILD_DIR", REPO_ROOT / "build"))
TOOL = BUILD_DIR / "safetensors_copy"

pytestmark = pytest.mark.skipif(
    not TOOL.is_file(),
    reason=f"{TOOL} is not built: run `ninja -C {BUILD_DIR} safetensors_copy` "
    "or set LOWBIT_BUILD_DIR to the build folder that has it",
)

# Every numpy dtype with a lowbit DType (bfloat16 has no numpy dtype: see
# test_bfloat16_through_raw_api).
DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.int32, np.uint32]
SHAPES = [(), (0,), (1,), (7,), (4, 5), (3, 0, 2), (2, 3, 4), (1, 1, 1, 1, 1, 3)]


def random_array(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        # Random bit patterns cover NaN payloads, infinities and subnormals.
        bits = rng.integers(0, 2 ** (8 * dtype.itemsize), size=shape, dtype=np.uint64)
        return bits.astype(f"u{dtype.itemsize}").view(dtype).reshape(shape)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def random_tensors(seed):
    rng = np.random.default_rng(seed)
    tensors = {}
    for dtype in DTYPES:
        for i, shape in enumerate(SHAPES):
            tensors[f"{np.dtype(dtype).name}.{i}"] = random_array(rng, dtype, shape)
    # Names that need JSON escaping or are not ASCII.
    tensors['odd "name"\\ with\ttab'] = random_array(rng, np.float32, (2,))
    tensors["ünïcödé.weight"] = random_array(rng, np.uint8, (3,))
    return tensors


def run_copy(src, dst):
    return subprocess.run([str(TOOL), str(src), str(dst)], capture_output=True, text=True, timeout=60)


def copy_ok(src, dst):
    result = run_copy(src, dst)
    assert result.returncode == 0, f"safetensors_copy failed: {result.stderr}"
    return dst


def header_and_data(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :], n


def assert_same_arrays(expected, actual):
    assert sorted(expected) == sorted(actual)
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name  # bitwise: NaNs compare equal


def read_metadata(path):
    with safe_open(str(path), framework="np") as f:
        return f.metadata()


@pytest.mark.parametrize("metadata", [None, {}, {"format": "np"}])
def test_copy_is_byte_identical(tmp_path, metadata):
    tensors = random_tensors(1)
    src, dst = tmp_path / "python.safetensors", tmp_path / "lowbit.safetensors"
    save_file(tensors, src, metadata=metadata)
    copy_ok(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert_same_arrays(tensors, load_file(dst))


def test_copy_with_many_metadata_keys_same_contents(tmp_path):
    tensors = random_tensors(2)
    metadata = {"format": "pt", "note": 'quotes " and \\ and\nnewline', "ünï": "cödé", "empty": ""}
    src, dst = tmp_path / "python.safetensors", tmp_path / "lowbit.safetensors"
    save_file(tensors, src, metadata=metadata)
    copy_ok(src, dst)
    assert_same_arrays(tensors, load_file(dst))
    assert read_metadata(dst) == metadata
    # Not byte-identical in general (Python's metadata key order is random), but the
    # parsed headers, their length and the data sections are.
    h_src, d_src, n_src = header_and_data(src)
    h_dst, d_dst, n_dst = header_and_data(dst)
    assert h_dst == h_src
    assert n_dst == n_src
    assert d_dst == d_src
    # Our header keeps the keys sorted.
    raw = dst.read_bytes()
    keys = list(json.loads(raw[8 : 8 + n_dst], object_pairs_hook=lambda kv: kv)[0][1])
    assert [k for k, _ in keys] == sorted(metadata)


def test_python_reads_our_normalised_copy_of_a_gappy_file(tmp_path):
    # Python's writer never leaves gaps, and its reader rejects them; ours tolerates
    # them and the copy is packed, so Python reads the copy.
    header = {
        "b": {"dtype": "I32", "shape": [2], "data_offsets": [8, 16]},
        "a": {"dtype": "F16", "shape": [2, 1], "data_offsets": [0, 4]},
        "__metadata__": {"src": "hand"},
    }
    text = json.dumps(header).encode()
    data = np.array([1.5, -2], np.float16).tobytes() + b"\xee" * 4 + np.array([7, -9], np.int32).tobytes()
    src, dst = tmp_path / "gappy.safetensors", tmp_path / "packed.safetensors"
    src.write_bytes(struct.pack("<Q", len(text)) + text + data)
    copy_ok(src, dst)
    got = load_file(dst)
    np.testing.assert_array_equal(got["a"], np.array([[1.5], [-2]], np.float16))
    np.testing.assert_array_equal(got["b"], np.array([7, -9], np.int32))
    assert read_metadata(dst) == {"src": "hand"}


def test_bfloat16_through_raw_api(tmp_path):
    # numpy has no bfloat16; the package's low-level serialize_file takes raw bytes.
    if not hasattr(safetensors, "TensorSpec") or not hasattr(safetensors, "serialize_file"):
        pytest.skip("this safetensors version has no TensorSpec/serialize_file to write raw BF16")
    rng = np.random.default_rng(3)
    arrays = {
        "bf.scalar": rng.integers(0, 2**16, size=(), dtype=np.uint16),
        "bf.matrix": rng.integers(0, 2**16, size=(3, 5), dtype=np.uint16),
        "bf.empty": np.zeros((0, 4), np.uint16),
        "f32": rng.standard_normal(3).astype(np.float32),
    }
    keep = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    specs = {
        k: safetensors.TensorSpec(
            dtype="float32" if k == "f32" else "bfloat16",
            shape=list(v.shape),
            data_ptr=v.ctypes.data,
            data_len=v.nbytes,
        )
        for k, v in keep.items()
    }
    src, dst = tmp_path / "bf16.safetensors", tmp_path / "copy.safetensors"
    safetensors.serialize_file(specs, str(src), metadata={"dtype": "bfloat16"})
    copy_ok(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    back = {name: info for name, info in safetensors.deserialize(dst.read_bytes())}
    for name, arr in keep.items():
        assert back[name]["dtype"] == ("F32" if name == "f32" else "BF16")
        assert list(back[name]["shape"]) == list(arr.shape)
        assert bytes(back[name]["data"]) == arr.tobytes()


def test_malformed_file_fails_cleanly(tmp_path):
    tensors = {"model.layers.0.weight": np.arange(64, dtype=np.float32)}
    good = tmp_path / "good.safetensors"
    save_file(tensors, good)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-10])
    out = tmp_path / "out.safetensors"
    result = run_copy(truncated, out)
    assert result.returncode == 1
    assert "model.layers.0.weight" in result.stderr
    assert "truncated" in result.stderr
    assert str(truncated) in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.safetensors", "truncated.safetensors"]


def test_storage_only_dtypes_are_copied_byte_for_byte(tmp_path):
    """Checkpoints carry f64/i64/bool buffers (e.g. position ids): lowbit copies them unchanged."""
    src = tmp_path / "wide.safetensors"
    rng = np.random.default_rng(5)
    save_file({"f64": rng.normal(size=(3, 2)), "i64": rng.integers(-2**40, 2**40, size=7),
               "u64": rng.integers(0, 2**60, size=2, dtype=np.uint64),
               "i16": rng.integers(-300, 300, size=5).astype(np.int16),
               "u16": rng.integers(0, 60000, size=5).astype(np.uint16),
               "bool": rng.integers(0, 2, size=4).astype(bool), "f32": np.ones(3, np.float32)}, src)
    out = tmp_path / "out.safetensors"
    result = run_copy(src, out)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == src.read_bytes()


def test_unsupported_dtype_and_missing_file(tmp_path):
    src = tmp_path / "c64.safetensors"
    header = json.dumps({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    result = run_copy(src, tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert "unsupported dtype C64" in result.stderr
    result = run_copy(tmp_path / "absent.safetensors", tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert "absent.safetensors" in result.stderr
    assert not (tmp_path / "out.safetensors").exists()
