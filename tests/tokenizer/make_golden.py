#!/usr/bin/env python3
"""Writes golden_smollm2.json: token ids that the Hugging Face `tokenizers`
package gives for a list of test strings, with the tokenizer of the default
model (SmolLM2-135M-Instruct) rebuilt from the GGUF file's own vocabulary.

The tokenizer is assembled the way SmolLM2's tokenizer.json defines it: a BPE
model over tokenizer.ggml.tokens / tokenizer.ggml.merges, the pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
a ByteLevel decoder, and the control tokens (token_type 3) as special added
tokens. The GGUF file is read here with `struct` from the format description,
independently of lowbit's reader.

    pip install tokenizers
    python3 tests/tokenizer/make_golden.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import os
import pathlib
import struct
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Strings chosen to exercise every branch of the pre-tokenizer and the byte
# mapping: accents, CJK, emoji (with ZWJ and skin tones), whitespace runs,
# tabs and newlines, digits (ASCII and other scripts), contractions (lower and
# upper case: the GPT-2 pattern is case-sensitive), special tokens inside text
# and partial ones, code, and invisible characters.
CASES = [
    "Hello world",
    "Hello, world! How are you doing today?",
    "",
    " ",
    "a",
    " leading space",
    "trailing spaces   ",
    "a  b   c    d",
    "tabs\tand\t\tmore\ttabs",
    "line1\nline2\n\n\nline3\r\nline4",
    "          ten spaces then text",
    "\n\n\n",
    "Café résumé naïve façade Ångström",
    "日本語のテキストです。中文也可以。한국어",
    "Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷!",
    "Привет, мир! Ελληνικά עברית العربية हिन्दी ไทย",
    "12345 3.14159 1,000,000 -42 0x1F",
    "Arabic-Indic digits ٣٤٥ and superscript ²³ and ½",
    "I'm sure we'll see they've done it, she'd say it's John's.",
    "I'M SURE WE'LL SEE THEY'VE DONE IT",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>text",
    "<|im_start partial special <|im_end",
    "<repo_name>lowbit<file_sep>main.cpp",
    "def f(x):\n    return x ** 2  # square\n\tpass",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "zero\u200bwidth and non\u00a0breaking and\u3000ideographic space",
    "ﬁ ligature, ＦＵＬＬＷＩＤＴＨ, Ⅻ roman",
    "$$$ !!! ??? ... --- ___ *** ### @@@",
    "https://example.com/path?query=1&b=two#frag",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Mixed: abc123def 456ghi 7 8 9",
    "Tom's  'quoted'  \"double\" `back`",
    "\u00ad soft hyphen and \x7f delete and \x01 control",
]


def read_gguf_tokenizer(path):
    data = pathlib.Path(path).read_bytes()
    pos = 0

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def rs():
        nonlocal pos
        n = rd("Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [value(et) for _ in range(n)]
        return rd(scalar[t])

    assert data[:4] == b"GGUF"
    pos = 4
    rd("I")
    rd("Q")
    n_kv = rd("Q")
    meta = {}
    for _ in range(n_kv):
        key = rs()
        meta[key] = value(rd("I"))
    return meta


def build_tokenizer(meta, ignore_merges=False):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


def main():
    if len(sys.argv) > 1:
        model = sys.argv[1]
    else:
        model = subprocess.run([str(REPO / "scripts" / "fetch-default-model")], check=True,
                               capture_output=True, text=True).stdout.strip()
    import tokenizers
    tk = build_tokenizer(read_gguf_tokenizer(model))
    cases = []
    for text in CASES:
        ids = tk.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids})
    out = {
        "about": "ids from the Hugging Face tokenizers package " + tokenizers.__version__ +
                 " for the SmolLM2-135M-Instruct vocabulary; written by make_golden.py",
        "cases": cases,
    }
    path = HERE / "golden_smollm2.json"
    path.write_text(json.dumps(out, ensure_ascii=True, indent=1) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
