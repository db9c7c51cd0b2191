"""lowbit's byte-level BPE tokenizer against the Hugging Face `tokenizers`
package on random strings, with the default model's vocabulary.

The reference tokenizer is built from the GGUF file's vocabulary and merges as
SmolLM2's tokenizer.json defines it (tests/tokenizer/make_golden.py, which
also writes the fixed golden cases checked by the C++ suite test_tokenizer).
The `bpe_tokenize` test tool (tests/tools/bpe_tokenize.cpp) encodes the same
strings with lowbit; ids must be equal and decode(encode(s)) == s.

Skipped when `tokenizers` is not installed, the tool is not built, or the
default model is not in the cache (scripts/fetch-default-model).
"""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("LOWBIT_BUILD_DIR", REPO_ROOT / "build"))
TOOL = BUILD_DIR / "bpe_tokenize"

pytestmark = pytest.mark.skipif(
    not TOOL.is_file(),
    reason=f"{TOOL} is not built: run `ninja -C {BUILD_DIR} bpe_tokenize` "
    "or set LOWBIT_BUILD_DIR to the build folder that has it",
)


def load_make_golden():
    spec = importlib.util.spec_from_file_location(
        "make_golden", REPO_ROOT / "tests" / "tokenizer" / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_model():
    cache = os.environ.get("LOWBIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lowbit")
    path = Path(cache) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing: run scripts/fetch-default-model")
    return path


# Pools of characters that stress the pre-tokenizer: letters of several
# scripts, numbers of several kinds, every kind of Unicode space, apostrophes
# (contractions), punctuation, emoji with modifiers and joiners, combining
# marks, and pieces of special tokens.
POOLS = [
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    list("0123456789") + ["٣", "४", "²", "½", "Ⅻ", "①"],
    [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\u0085", "\u2028",
     "\u200b", "\u000b", "\u000c"],
    ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'", "\u2019"],
    list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"") + ["...", "--", "->"],
    list("éèêàçñöüßøåÆŒ") + ["e\u0301", "a\u0308"],
    list("日本語中文字한국어ひらがなカタカナ"),
    ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🤖"],
    list("Привет мир Ελληνικά עברית العربية हिन्दी ไทย"),
    ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", "<repo_name>"],
]


def random_strings(seed, count):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(0, 40))
        parts = []
        for _ in range(n):
            pool = POOLS[int(rng.integers(0, len(POOLS)))]
            parts.append(pool[int(rng.integers(0, len(pool)))])
        out.append("".join(parts))
    return out


def run_tool(model, texts):
    stdin = "".join(json.dumps(t) + "\n" for t in texts)
    r = subprocess.run([str(TOOL), str(model)], input=stdin, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_strings_equal_hugging_face(seed):
    model = default_model()
    mg = load_make_golden()
    reference = mg.build_tokenizer(mg.read_gguf_tokenizer(model))
    texts = random_strings(seed, 400)
    ours = run_tool(model, texts)
    assert len(ours) == len(texts)
    mismatches = []
    for text, got in zip(texts, ours):
        want = reference.encode(text, add_special_tokens=False).ids
        if got["ids"] != want:
            mismatches.append((text, got["ids"], want))
        assert got["round_trip"], repr(text)
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, e.g. {mismatches[:3]!r}"


def test_golden_file_is_current():
    """The committed golden ids still match what `tokenizers` gives today."""
    model = default_model()
    mg = load_make_golden()
    reference = mg.build_tokenizer(mg.read_gguf_tokenizer(model))
    golden = json.loads((REPO_ROOT / "tests" / "tokenizer" / "golden_smollm2.json").read_text())
    for case in golden["cases"]:
        assert reference.encode(case["text"], add_special_tokens=False).ids == case["ids"], case["text"]
