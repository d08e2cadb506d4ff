#!/usr/bin/env python3
"""Reference data for inferd's tokenizer, produced by llama.cpp (through llama-cpp-python).

Writes, under tests/data/tokenizer/:
  corpus.json       the test strings (hex-encoded bytes, so invalid UTF-8 survives); built once, with a
                    fixed seed, unless it exists (--rebuild-corpus rebuilds it)
  smollm2_refs.json for the default model: llama_tokenize ids for add_special x parse_special,
                    llama_detokenize of the parsed ids, the special-token ids, per-block FNV-1a hashes
                    of every token's piece, the same corpus under other BPE pre-tokenizers (the model's
                    vocabulary written to temporary vocab-only GGUFs with another tokenizer.ggml.pre),
                    and hashes over a sweep of every code point
  spm_vocab.gguf    a small synthetic SentencePiece ("llama") vocabulary, vocab-only
  spm_refs.json     the same reference data for it
  gemma3_refs.json  with --gemma3 MODEL: the same for Gemma 3's SentencePiece vocabulary (262,144 tokens;
                    ids, detokenization, special tokens, piece hashes and the code point sweep)

Usage: python3 tools/reference/gen_tokenizer_refs.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
       python3 tools/reference/gen_tokenizer_refs.py --gemma3 models/gemma-3-270m-q4_k_m.gguf  (only gemma3_refs.json)
"""
import argparse
import ctypes
import json
import os
import random
import sys
import tempfile

import gguf
import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
BLOCK = 256          # token ids per piece hash
SWEEP_BLOCK = 1024   # code points per sweep string
PRE_TYPES = ["qwen2", "llama-bpe", "default", "gpt-2", "falcon", "starcoder"]


def fnv1a64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def hash_ids(ids) -> str:
    return "%016x" % fnv1a64(b"".join(int(i).to_bytes(4, "little", signed=True) for i in ids))


# ---------------------------------------------------------------------------------------------------
# Corpus

def build_corpus() -> list[bytes]:
    rng = random.Random(20240611)
    s: list[str] = []
    # Whitespace runs.
    for ws in [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ", "\u00a0", "\u3000",
               "\u2009", "\u0085", "\u200b", "\u2028"]:
        s += [ws, "a" + ws + "b", ws + "word", "word" + ws, ws * 3 + "x" + ws * 2]
    s += ["", " ", "  leading", "trailing  ", "  both  ", "a  b   c    d", "\n\n\nparagraph\n\n", "tab\tsep\tvalues",
          "x\r\ny\r\n", "     indented", "line1\nline2\n  line3\n\tline4"]
    # Numbers.
    s += ["0", "7", "42", "123", "1234", "12345", "1234567", "3.14159", "-273.15", "1,000,000", "1e-9", "0x1F",
          "v1.2.3", "2024-06-11", "12:30:45", "$99.99", "100%", "1/2", "٣٤٥", "१२३", "一二三", "①②③", "Ⅻ", "½",
          "x²+y²", "abc123def", "123abc", " 2024 ", "phone: +1 (555) 010-9999", "99 bottles"]
    s += [str(rng.randrange(10 ** k)) for k in range(1, 30, 2)]
    # Punctuation and contractions.
    s += ["Hello, world!", "Wait... what?!", "(parens) [brackets] {braces} <angles>", "quote \"double\" 'single'",
          "it's", "IT'S", "we'll", "WE'LL", "they're", "THEY'RE", "I've", "I'm", "he'd", "don't", "'s", "'t",
          "'re 've 'm 'll 'd", "a'b", "rock'n'roll", "''", "'''", "`backticks`", "~tilde~", "a|b", "a^b", "#hash",
          "@user", "email@example.com", "https://example.com/path?q=1&r=2#frag", "--flag=value", "a->b", "a::b",
          "!!!", "???", "...", "—em dash—", "“curly quotes”", "«guillemets»", "¿Qué?", "¡Hola!", "…", "•bullet"]
    # Code.
    s += ["int main() {\n  return 0;\n}\n",
          "#include <vector>\nstd::vector<int> v{1, 2, 3};\nfor (auto& x : v) x *= 2;\n",
          "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }",
          "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x\n",
          "class Foo:\n\tdef __init__(self):\n\t\tself.x = 1\n",
          "import numpy as np\nprint(np.arange(10).reshape(2, 5))",
          "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">Hi</div>", "{\"key\": [1, 2, {\"n\": null}]}",
          "    \n    \n", "x=1;y=2;z=x+y", "fn main() { println!(\"{}\", 1); }", "if (a && b || !c) {}",
          "// comment\n/* block */", "$ ls -la | grep foo > out.txt", "a_b_c snake_case CamelCase kebab-case"]
    # Accents, scripts, emoji.
    s += ["café", "naïve résumé", "Ærøskøbing", "Straße", "ﬁ ligature", "e\u0301", "Ångström", "Ελληνικά", "Русский текст",
          "中文文本", "日本語のテキスト", "한국어 텍스트", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ภาษาไทย",
          "Tiếng Việt", "ქართული", "Հայերեն", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛", "Ⓐⓑⓒ",
          "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇫🇷🇯🇵", "❤️", "✔︎", "🤖 robot", "I ❤ NY", "∑∫√∞≠≤",
          "→←↑↓", "©®™", "€£¥₹", "°C", "µs", "ǅ", "ß", "İstanbul", "ſ", "K", "\u00ad", "\ufeffbom", "\u202eRTL",
          "\U0001f9d1\u200d\U0001f4bb", "ℌ", "ℵ", "𐍈", "\ue000", "\U000f0000", "\u0378", "\U0002ebf0", "\U00031350",
          "\u1c89", "\U00011f00"]
    # Special token texts.
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
          "text<|im_end|>more", "<|im_start|><|im_start|>", "< |im_start|>", "<|im_start", "<|im_end|><|endoftext|>",
          " <|im_start|> ", "<repo_name>x<file_sep>y<filename>z", "<reponame><gh_stars>10", "<jupyter_code>print(1)",
          "<s>", "</s>", "<unk>", "<tool>", "a<tool>b", "<|im_start|>system\nYou are helpful.<|im_end|>",
          "<empty_output>", "<issue_start><issue_comment><issue_closed>"]
    # Long and mixed strings.
    s += ["The quick brown fox jumps over the lazy dog. " * 3,
          "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.",
          "a" * 100, " " * 50, "ab" * 40, "\n" * 20, "1" * 40, "=" * 30, "-" * 25 + ">", "😀" * 12]
    # Random mixtures drawn from a character pool.
    pool = list("abcxyzABCXYZ0123456789 \t\n.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + \
        list("éüñçßøåæœЖжПп中文日本語한국어مرحباनमस्ते😀👍🏽🇫🇷\u00a0\u3000\u2009①½") + ["'s", "'ll", "<|im_start|>", "<|im_end|>"]
    for _ in range(70):
        n = rng.randrange(1, 40)
        s.append("".join(rng.choice(pool) for _ in range(n)))
    corpus = [x.encode("utf-8") for x in s]
    # Invalid UTF-8 (sequences that decode past U+10FFFF are left out: llama.cpp aborts on them).
    corpus += [b"\xff", b"\xfe\xff", b"a\x80b", b"\xc3", b"\xc3(", b"abc\xe2\x82", b"\xe2\x82\xacok", b"\xed\xa0\x80",
               b"\xed\xbf\xbf x", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xf0\x80\x80\x80", b"\xf4\x8f\xbf\xbf",
               b"\xf8\x88\x80\x80\x80", b"\x80\x80\x80", b"caf\xe9", b"\xef\xbf\xbd", b"hello \xf0\x9f\x98 world",
               b"<|im_start|>\xff<|im_end|>", b"\x00", b"a\x00b", b"\x01\x02\x03\x1b[0m", b" \xa0 ", b"\xc2",
               b"12\xff34", b"\xe4\xb8", b"\xe4\xb8\xad\xe6"]
    for _ in range(30):
        corpus.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24))))
    cleaned = []
    for b in corpus:
        if decodes_past_max(b):
            continue
        cleaned.append(b)
    return cleaned


def decodes_past_max(b: bytes) -> bool:
    """True if llama.cpp's lenient decoder would produce a code point > U+10FFFF (it then aborts)."""
    i = 0
    while i < len(b):
        c = b[i]
        if c < 0x80 or not (c & 0x40):
            i += 1
        elif not (c & 0x20):
            i += 2 if i + 1 < len(b) and (b[i + 1] & 0xC0) == 0x80 else 1
        elif not (c & 0x10):
            i += 3 if i + 2 < len(b) and all((b[i + k] & 0xC0) == 0x80 for k in (1, 2)) else 1
        elif not (c & 0x08):
            if i + 3 < len(b) and all((b[i + k] & 0xC0) == 0x80 for k in (1, 2, 3)):
                cp = ((c & 7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F)
                if cp > 0x10FFFF:
                    return True
                i += 4
            else:
                i += 1
        else:
            i += 1
    return False


def load_corpus(rebuild: bool) -> list[bytes]:
    path = os.path.join(OUT, "corpus.json")
    if rebuild or not os.path.exists(path):
        corpus = build_corpus()
        with open(path, "w") as f:
            json.dump({"comment": "Tokenizer test strings as hex bytes (invalid UTF-8 included). "
                                  "Built by tools/reference/gen_tokenizer_refs.py.",
                       "strings": [b.hex() for b in corpus]}, f, indent=0)
            f.write("\n")
    with open(path) as f:
        return [bytes.fromhex(h) for h in json.load(f)["strings"]]


# ---------------------------------------------------------------------------------------------------
# llama.cpp calls

class Vocab:
    def __init__(self, path: str):
        self.llm = Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        return self.llm.tokenize(text, add_bos=add_special, special=parse_special)

    def piece(self, tok: int, special: bool) -> bytes:
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n + 1

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 8 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n + 1

    def info(self) -> dict:
        v = self.vocab
        return {"n_vocab": self.n, "bos": llama_cpp.llama_vocab_bos(v), "eos": llama_cpp.llama_vocab_eos(v),
                "eot": llama_cpp.llama_vocab_eot(v), "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
                "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
                "eog": [i for i in range(self.n) if llama_cpp.llama_vocab_is_eog(v, i)],
                "control": [i for i in range(self.n) if llama_cpp.llama_vocab_is_control(v, i)]}

    def piece_hashes(self) -> dict:
        out = {}
        for special in (False, True):
            hashes = []
            for start in range(0, self.n, BLOCK):
                h = 0xCBF29CE484222325
                for tok in range(start, min(self.n, start + BLOCK)):
                    p = self.piece(tok, special)
                    h = fnv1a64(len(p).to_bytes(4, "little") + p, h)
                hashes.append("%016x" % h)
            out["special" if special else "plain"] = hashes
        return out


def sweep_strings() -> list[bytes]:
    """One string per block of code points, each code point in several contexts."""
    out = []
    for start in range(0, 0x110000, SWEEP_BLOCK):
        parts = []
        for cp in range(start, start + SWEEP_BLOCK):
            c = chr(cp)
            parts.append("x" + c + " " + c + c + "1" + c + "\t")
        out.append("".join(parts).encode("utf-8", "surrogatepass"))
    return out


def case_refs(v: Vocab, corpus: list[bytes]) -> list[dict]:
    cases = []
    for text in corpus:
        c = {"text": text.hex()}
        for a in (0, 1):
            for p in (0, 1):
                c["a%dp%d" % (a, p)] = v.tokenize(text, bool(a), bool(p))
        c["detok"] = v.detokenize(c["a1p1"], False).hex()
        c["detok_special"] = v.detokenize(c["a1p1"], True).hex()
        cases.append(c)
    return cases


def write_json(name: str, data: dict) -> None:
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# ---------------------------------------------------------------------------------------------------
# GGUF writing

def copy_with_pre(src: gguf.GGUFReader, dst_path: str, pre: str) -> None:
    w = gguf.GGUFWriter(dst_path, "llama")
    w.add_block_count(1)
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    f = src.fields
    w.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    w.add_tokenizer_pre(pre)
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for key, fn in [("tokenizer.ggml.bos_token_id", w.add_bos_token_id), ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                    ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
                    ("tokenizer.ggml.padding_token_id", w.add_pad_token_id),
                    ("tokenizer.ggml.add_bos_token", w.add_add_bos_token),
                    ("tokenizer.ggml.add_space_prefix", w.add_add_space_prefix)]:
        if key in f:
            fn(f[key].contents())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_spm_vocab(src: gguf.GGUFReader, dst_path: str) -> None:
    """A SentencePiece-style vocabulary built from the BPE model's tokens (decoded to text)."""
    byte_decoder = {}
    n = 256
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE:
            byte_decoder[chr(b)] = b
        else:
            byte_decoder[chr(n)] = b
            n += 1
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [6] * 256
    tokens += ["<|im_start|>", "<|im_end|>", "<tool>"]
    types += [3, 3, 4]
    seen = set(tokens)
    for t in src.fields["tokenizer.ggml.tokens"].contents()[17:]:
        try:
            text = bytes(byte_decoder[c] for c in t).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        piece = text.replace(" ", "\u2581")
        if piece and piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
        if len(tokens) >= 6000:
            break
    rng = random.Random(7)
    # Scores: mostly by BPE rank, with some noise and ties so that the score order matters.
    scores = [0.0] * len(tokens)
    for i in range(262, len(tokens)):
        scores[i] = -float(i // 2) + (rng.choice([0.0, 0.0, 0.5, -0.25]))
    w = gguf.GGUFWriter(dst_path, "llama")
    w.add_block_count(1)
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def model_refs(path: str, corpus: list[bytes], sweep: list[bytes]) -> dict:
    """A real model's vocabulary: info, piece hashes, the corpus cases and the code point sweep."""
    v = Vocab(path)
    refs = {"source": f"llama-cpp-python {llama_cpp.__version__}", "model": os.path.basename(path),
            "piece_block": BLOCK, "sweep_block": SWEEP_BLOCK}
    refs.update(v.info())
    refs["pieces"] = v.piece_hashes()
    refs["cases"] = case_refs(v, corpus)
    refs["sweep"] = [hash_ids(v.tokenize(s, False, False)) for s in sweep]
    return refs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rebuild-corpus", action="store_true")
    ap.add_argument("--gemma3", help="write only gemma3_refs.json, for this Gemma 3 GGUF")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    corpus = load_corpus(args.rebuild_corpus)
    print(f"corpus: {len(corpus)} strings")
    sweep = sweep_strings()

    if args.gemma3:
        write_json("gemma3_refs.json", model_refs(args.gemma3, corpus, sweep))
        return

    refs = model_refs(args.model, corpus, sweep)

    reader = gguf.GGUFReader(args.model)
    refs["pre"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_TYPES:
            path = os.path.join(tmp, pre + ".gguf")
            copy_with_pre(reader, path, pre)
            pv = Vocab(path)
            refs["pre"][pre] = {"ids": [pv.tokenize(t, False, True) for t in corpus],
                                "sweep": [hash_ids(pv.tokenize(s, False, False)) for s in sweep]}
            del pv
    write_json("smollm2_refs.json", refs)

    spm_path = os.path.join(OUT, "spm_vocab.gguf")
    write_spm_vocab(reader, spm_path)
    print(f"wrote {spm_path} ({os.path.getsize(spm_path)} bytes)")
    sv = Vocab(spm_path)
    spm = {"source": f"llama-cpp-python {llama_cpp.__version__}", "model": "spm_vocab.gguf", "piece_block": BLOCK}
    spm.update(sv.info())
    spm["pieces"] = sv.piece_hashes()
    spm["cases"] = case_refs(sv, corpus)
    write_json("spm_refs.json", spm)


if __name__ == "__main__":
    main()
