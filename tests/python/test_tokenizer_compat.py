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


def random_strings(seed, count, pools=POOLS):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(0, 40))
        parts = []
        for _ in range(n):
            pool = pools[int(rng.integers(0, len(pools)))]
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


# ---- tokenizer.json files written by `tokenizers` itself --------------------------------

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def save_variant(tk, tmp_path, kind):
    """The default model's vocabulary with the pre-tokenizer (and normalizer,
    post-processor) of another family, saved as tokenizer.json."""
    from tokenizers import Regex, normalizers, pre_tokenizers, processors
    if kind == "smollm2":
        pass
    elif kind in ("llama3", "qwen2"):
        pattern = LLAMA3_PATTERN if kind == "llama3" else QWEN2_PATTERN
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        if kind == "llama3":
            tk.post_processor = processors.TemplateProcessing(
                single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B",
                special_tokens=[("<|im_start|>", 1)])
        else:
            tk.normalizer = normalizers.NFC()
    path = tmp_path / kind / "tokenizer.json"
    path.parent.mkdir()
    tk.save(str(path))
    return path


# NFC-stable pools only (see nfc_stable in src/tokenizer/bpe_tokenizer.cpp):
# no combining marks, no Devanagari, no U+0085 (NFC leaves it, but keep the
# pools to what the check documents).
STABLE_POOLS = [
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    list("0123456789"),
    [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000"],
    ["'s", "'t", "'re", "'LL", "'"],
    list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\""),
    list("éèêàçñöüßøåÆŒ"),
    list("日本語中文字한국어ひらがなカタカナ"),
    ["😀", "👍🏽", "👨\u200d👩\u200d👧", "❤️"],
    list("Привет мир Ελληνικά עברית العربية"),
    ["<|im_start|>", "<|im_end|>", "<|im_", "|>"],
]


@pytest.mark.parametrize("kind", ["smollm2", "llama3", "qwen2"])
def test_tokenizer_json_variants_equal_hugging_face(tmp_path, kind):
    model = default_model()
    mg = load_make_golden()
    # Llama 3's tokenizer.json sets ignore_merges (a piece in the vocabulary is one token).
    tk = mg.build_tokenizer(mg.read_gguf_tokenizer(model), ignore_merges=kind == "llama3")
    path = save_variant(tk, tmp_path, kind)
    if kind == "llama3":
        assert json.loads(path.read_text())["model"]["ignore_merges"] is True
    from tokenizers import Tokenizer
    reference = Tokenizer.from_file(str(path))  # exactly what the file says
    texts = random_strings(10, 300, STABLE_POOLS if kind == "qwen2" else POOLS)
    texts += [t["text"] for t in json.loads(
        (REPO_ROOT / "tests" / "tokenizer" / "golden_smollm2.json").read_text())["cases"]
        if kind != "qwen2"]
    ours = run_tool(path, texts)
    bad = []
    for text, got in zip(texts, ours):
        assert "error" not in got, (text, got)
        want = reference.encode(text, add_special_tokens=False).ids
        want_special = reference.encode(text, add_special_tokens=True).ids
        if got["ids"] != want or got["ids_special"] != want_special:
            bad.append((text, got, want))
        assert got["round_trip"], repr(text)
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[:2]!r}"
    if kind == "llama3":
        assert ours[0]["ids_special"][0] == 1  # BOS from the TemplateProcessing post-processor
    if kind == "qwen2":
        # A combining accent would be changed by NFC: a clear refusal, not other ids.
        refused = run_tool(path, ["cafe\u0301"])[0]
        assert "NFC" in refused.get("error", ""), refused
        assert "U+0301" in refused["error"]
