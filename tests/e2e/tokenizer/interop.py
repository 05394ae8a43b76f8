"""kolos's tokenizers against the Python `tokenizers` and `sentencepiece`
packages (tests/e2e/tokenizer/CMakeLists.txt, label interop).

1. Writes a corpus of CORPUS_LINES lines (CJK, emoji, whitespace runs, code,
   special-token look-alikes and invalid UTF-8 bytes) to WORK/corpus.txt.
2. Trains its own tokenizers on it (no hub): GPT-2-style byte-level BPE,
   LLaMA-3-style (Split regex + ByteLevel, special tokens, a
   TemplateProcessing that puts <|begin_of_text|> first), Qwen-style (its
   Split regex, its NFC normalizer, special tokens, added non-special tokens
   with lstrip / rstrip / single_word), a byte-fallback BPE (NFKC, no
   ByteLevel; <0xXX> tokens), a LLaMA-2-style one as Hugging Face converts
   it (Prepend and Replace normalizers for "▁", byte fallback, the
   Replace/ByteFallback/Fuse/Strip decoders, <s> first) and SentencePiece
   BPE and unigram models with byte_fallback.
3. For each, `tokenizer_lines` (kolos) encodes and decodes every line;
   the Python package must give the same ids and the same decoded text.
   Lines are raw bytes split on b"\\n"; the Python side feeds
   line.decode("utf-8", errors="replace"), which is what kolos does with
   invalid bytes (tokenizer.h).
4. `kolos data prepare --tokenizer` over three document files must write
   the Python package's ids: doc1 + [eos] + doc2 + [eos] + doc3, as uint16
   (vocab <= 65536) or uint32 (a GPT-2-style tokenizer widened to 66,001
   ids, its eos named by a tokenizer_config.json).

Usage: interop.py TOKENIZER_LINES KOLOS WORK
"""
import array
import json
import os
import random
import subprocess
import sys
import time

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

CORPUS_LINES = 12000
VOCAB = 2000

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for on that with as by at from it an be this are or his "
         "which had not but have were they their one all has been who more when there can "
         "kolos tensor parallel pipeline gradient shard rank mesh checkpoint token").split()
CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可也你说"
KANA_HANGUL = "ひらがなカタカナ한국어텍스트토크나이저"
# Not in NFC / NFKC form: e + U+0301, A + ring, Hangul jamo, the Angstrom
# sign, the fi ligature, full-width letters, superscript two.
UNNORMALIZED = ["e\u0301", "A\u030a", "\u1100\u1161\u11a8", "\u212b", "\ufb01", "\uff2b\uff4f",
                "x\u00b2", "cafe\u0301", "\u00c5"]
EMOJI = ["😀", "🚀", "👩‍💻", "🇫🇷", "👍🏽", "❤️", "🧪", "🐍", "😂😂", "🤖"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\r", "\u00a0", "\u3000", "\u2003",
          "\u0085", "\u180e", "\u200b", "\u2028", "     "]
CODE = [
    "def f(x):", "    return x ** 2  # square", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "if (x != nullptr && *x >= 0x7f) return -1;", "std::vector<int> v{1, 2, 3};",
    "    \tprint(f'{name!r}: {value:>10.3f}')", "SELECT id, name FROM users WHERE age > 42;",
    "x=1;y=2;z=x+y", "#include <kolos/tokenizer/tokenizer.h>", "    }", "        ",
]
SPECIAL_LOOKALIKES = ["<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>", "<|im_start|>",
                      "<|im_end|>", "<|endof", "<|im_start", "<s>", "</s>", "<0x41>", "<unk>",
                      "kolos", "Kolos", "xkolosx", " kolos ", "kolos!"]
INVALID = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80\x80",
           b"\xf4\x90\x80\x80", b"\xfe\xfe", b"\xe0\x80\x80", b"\xc2"]


def make_line(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.35:
            w = rng.choice(WORDS)
            r = rng.random()
            if r < 0.1:
                w = w.upper()
            elif r < 0.2:
                w = w.capitalize()
            elif r < 0.3:
                w += rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"])
            parts.append(w)
        elif kind < 0.45:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        elif kind < 0.55:
            parts.append("".join(rng.choice(CJK) for _ in range(rng.randint(1, 8))))
        elif kind < 0.6:
            parts.append("".join(rng.choice(KANA_HANGUL) for _ in range(rng.randint(1, 5))))
        elif kind < 0.67:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.77:
            parts.append(rng.choice(CODE))
        elif kind < 0.8:
            parts.append(rng.choice(SPECIAL_LOOKALIKES))
        elif kind < 0.82:
            parts.append(rng.choice(UNNORMALIZED))
        elif kind < 0.87:
            parts.append(rng.choice(".,;:!?-()[]{}\"'/\\@#$%^&*+=~`|"))
        else:
            parts.append(rng.choice(SPACES))
        parts.append(rng.choice(SPACES) if rng.random() < 0.3 else " " if rng.random() < 0.8 else "")
    line = "".join(parts).encode("utf-8")
    if rng.random() < 0.08:  # invalid UTF-8 somewhere in the line
        bad = rng.choice(INVALID)
        at = rng.randint(0, len(line))
        line = line[:at] + bad + line[at:]
    if rng.random() < 0.02:
        line = b""
    if rng.random() < 0.02:
        line = b" " * rng.randint(1, 40)
    return line


def write_corpus(path):
    rng = random.Random(1234)
    lines = [make_line(rng) for _ in range(CORPUS_LINES)]
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    return lines


def texts(lines):
    return [line.decode("utf-8", errors="replace") for line in lines]


def train_bpe(tok, lines, special, **kw):
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, show_progress=False, **kw)
    tok.train_from_iterator(texts(lines), trainer=trainer)
    return tok


def gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return train_bpe(tok, lines, ["<|endoftext|>"],
                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()), "<|endoftext|>"


def llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>"]
    train_bpe(tok, lines, special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok, "<|end_of_text|>"


def qwen2(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # as Qwen2's tokenizer.json has it
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, lines, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Added tokens that are not special, with the matching options.
    tok.add_tokens([AddedToken("kolos", single_word=True, lstrip=True, rstrip=False,
                               normalized=False),
                    AddedToken("tensor", lstrip=False, rstrip=True, normalized=True),
                    AddedToken("<|endof", normalized=False)])
    return tok, "<|endoftext|>"


def byte_fallback(lines):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" ?[^\s]+|\s+"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    # A small alphabet: rare characters are left out and fall back to bytes.
    train_bpe(tok, lines, ["<unk>", "</s>"], limit_alphabet=120)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec)), "</s>"


def llama2(lines):
    # LLaMA-2 / Mistral as Hugging Face converts them: no pre-tokenizer, "▁"
    # for spaces by normalizers, byte fallback, <s> first.
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    train_bpe(tok, lines, ["<unk>", "<s>", "</s>"], limit_alphabet=150)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok, "</s>"


def sentencepiece_model(lines, work, model_type):
    prefix = os.path.join(work, f"sp_{model_type}")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(t for t in texts(lines) if t.strip()), model_prefix=prefix,
        vocab_size=VOCAB, model_type=model_type, byte_fallback=True, character_coverage=0.995,
        minloglevel=2, num_threads=2,
        # Fewer unigram seeds and EM sub-iterations: half the training time.
        seed_sentencepiece_size=20000, num_sub_iterations=1)
    return prefix + ".model"


def run_lines(tool, tokenizer, corpus):
    out = subprocess.run([tool, tokenizer, corpus], check=True, capture_output=True).stdout
    return [json.loads(line) for line in out.decode("utf-8").split("\n") if line]


def compare(name, expected_ids, expected_text, lines, got):
    if len(got) != len(lines):
        sys.exit(f"{name}: kolos gave {len(got)} lines, the corpus has {len(lines)}")
    bad = 0
    for i, (ids, text, g) in enumerate(zip(expected_ids, expected_text, got)):
        if g["ids"] != ids or g["text"] != text:
            bad += 1
            if bad <= 3:
                print(f"{name}: line {i + 1} differs\n  input  {lines[i]!r}\n"
                      f"  python {ids}\n  kolos  {g['ids']}\n  python text {text!r}\n"
                      f"  kolos text  {g['text']!r}")
    if bad:
        sys.exit(f"{name}: {bad} of {len(lines)} lines differ")
    n = sum(len(ids) for ids in expected_ids)
    print(f"{name}: {len(lines)} lines, {n} tokens: ids and decoded text identical")


def check_prepare(name, kolos, tokenizer_path, docs, encode, eos, vocab, work):
    out = os.path.join(work, f"{name}.bin")
    run = subprocess.run([kolos, "data", "prepare", *docs, "--tokenizer", tokenizer_path, "-o", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{name}: kolos data prepare failed:\n{run.stdout}{run.stderr}")
    expected = []
    for i, doc in enumerate(docs):
        if i:
            expected.append(eos)
        with open(doc, "rb") as f:
            expected += encode(f.read().decode("utf-8", errors="replace"))
    dtype = "uint16" if vocab <= 65536 else "uint32"
    got = array.array("H" if dtype == "uint16" else "I")
    with open(out, "rb") as f:
        got.frombytes(f.read())
    if sys.byteorder != "little":
        got.byteswap()
    got = got.tolist()
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                     min(len(got), len(expected)))
        sys.exit(f"{name}: data prepare wrote {len(got)} tokens, python {len(expected)}; "
                 f"first difference at {first}")
    print(f"{name}: data prepare: {len(got)} tokens ({dtype}) identical; "
          f"kolos said: {run.stdout.strip()}")


def main():
    tool, kolos, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.txt")
    start = time.time()
    lines = write_corpus(corpus)
    decoded = texts(lines)
    # Three documents for data prepare: thirds of the corpus.
    docs = []
    third = len(lines) // 3
    for k in range(3):
        path = os.path.join(work, f"doc{k}.txt")
        with open(path, "wb") as f:
            f.write(b"\n".join(lines[k * third:(k + 1) * third]))
        docs.append(path)

    hf = {"gpt2": gpt2, "llama3": llama3, "qwen2": qwen2, "byte_fallback": byte_fallback,
          "llama2": llama2}
    for name, make in hf.items():
        tok, eos_token = make(lines)
        directory = os.path.join(work, name)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "tokenizer.json")
        tok.save(path)
        tok = Tokenizer.from_file(path)
        encodings = tok.encode_batch(decoded)
        ids = [e.ids for e in encodings]
        text = tok.decode_batch(ids)
        compare(name, ids, text, lines, run_lines(tool, path, corpus))
        eos = tok.token_to_id(eos_token)
        if name == "llama3":
            # tokenizer_config.json names the eos: kolos reads it from the directory.
            eos_token = "<|eot_id|>"
            eos = tok.token_to_id(eos_token)
            with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
                json.dump({"bos_token": "<|begin_of_text|>", "eos_token": eos_token}, f)
        check_prepare(name, kolos, directory, docs, lambda t: tok.encode(t).ids, eos,
                      tok.get_vocab_size(with_added_tokens=True), work)

    # A vocabulary past 65536 ids: the GPT-2-style tokenizer widened with
    # unused tokens and an eos at id 66000, so data prepare writes uint32.
    with open(os.path.join(work, "gpt2", "tokenizer.json")) as f:
        spec = json.load(f)
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), 66000):
        vocab[f"<unused{i}>"] = i
    vocab["<|big|>"] = 66000
    spec["added_tokens"].append({"id": 66000, "content": "<|big|>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": True})
    wide = os.path.join(work, "gpt2_wide")
    os.makedirs(wide, exist_ok=True)
    with open(os.path.join(wide, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    with open(os.path.join(wide, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|big|>"}, f)
    tok = Tokenizer.from_file(os.path.join(wide, "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 66001
    check_prepare("gpt2_wide", kolos, wide, docs, lambda t: tok.encode(t).ids,
                  tok.token_to_id("<|big|>"), tok.get_vocab_size(with_added_tokens=True), work)

    for model_type in ("bpe", "unigram"):
        name = f"sentencepiece_{model_type}"
        path = sentencepiece_model(lines, work, model_type)
        sp = spm.SentencePieceProcessor(model_file=path)
        ids = sp.encode(decoded)
        text = [sp.decode(i) for i in ids]
        compare(name, ids, text, lines, run_lines(tool, path, corpus))
        check_prepare(name, kolos, path, docs, sp.encode, sp.eos_id(), sp.get_piece_size(), work)
    print(f"interop: all tokenizers identical ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()
