"""`kolos data prepare --tokenizer` against the Python `tokenizers` package
on the same files in the same run (bench/run_tokenizer_bench.sh).

Usage: bench.py KOLOS WORK MEGABYTES DOCUMENTS REPS

Writes DOCUMENTS files of about MEGABYTES in all (the interop test's corpus
generator: English, CJK, emoji, whitespace runs, code, invalid bytes),
trains a GPT-2-style byte-level BPE (vocab 8000) on the first of them, then
REPS times, alternating the order: kolos writes the token file; the
package reads the same files, decodes them with errors="replace",
encode_batch()es them (its Rust thread pool, as kolos uses one thread per
document) and joins the ids with eos between documents; and, as a
throughput reference, the package encode_batch()es the same text split into
lines (many short inputs, its fast case; token boundaries differ at line
ends). Times compared: the
read-and-encode time of each (kolos reports its own; the package's is
measured around its read + encode_batch), medians over REPS. The two token
streams must be identical.
"""
import array
import os
import random
import re
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "e2e", "tokenizer"))
import interop  # noqa: E402  (the corpus generator)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


def main():
    kolos, work, megabytes, documents, reps = sys.argv[1:6]
    megabytes, documents, reps = float(megabytes), int(documents), int(reps)
    os.makedirs(work, exist_ok=True)
    rng = random.Random(7)
    target = int(megabytes * 1e6 / documents)
    docs = []
    for d in range(documents):
        lines, size = [], 0
        while size < target:
            line = interop.make_line(rng)
            lines.append(line)
            size += len(line) + 1
        path = os.path.join(work, f"doc{d}.txt")
        with open(path, "wb") as f:
            f.write(b"\n".join(lines))
        docs.append(path)
    total = sum(os.path.getsize(p) for p in docs)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    with open(docs[0], "rb") as f:
        sample = f.read().decode("utf-8", errors="replace").split("\n")
    tok.train_from_iterator(sample, trainer=trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_path = os.path.join(work, "tokenizer.json")
    tok.save(tok_path)
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<|endoftext|>")
    print(f"corpus: {documents} documents, {total / 1e6:.1f} MB; tokenizer: GPT-2-style "
          f"byte-level BPE, vocab {tok.get_vocab_size()}; {os.cpu_count()} CPUs; "
          f"tokenizers {__import__('tokenizers').__version__}")

    out = os.path.join(work, "kolos.bin")
    kolos_times, python_times, line_times = [], [], []
    python_ids = None
    line_tokens = 0

    def run_kolos():
        run = subprocess.run([kolos, "data", "prepare", *docs, "--tokenizer", tok_path, "-o", out],
                             capture_output=True, text=True, check=True)
        m = re.search(r"bytes in ([0-9.]+) s", run.stdout)
        kolos_times.append(float(m.group(1)))

    def read_and_encode(as_lines):
        """The package reads and encodes the documents, timed together: one
        text per document, or (as_lines) one per line, its newline kept.
        Returns the seconds and the encodings."""
        start = time.perf_counter()
        texts = []
        for p in docs:
            with open(p, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
            texts += text.splitlines(keepends=True) if as_lines else [text]
        encodings = tok.encode_batch(texts)
        return time.perf_counter() - start, encodings

    def run_python():
        nonlocal python_ids
        seconds, encodings = read_and_encode(as_lines=False)
        python_times.append(seconds)
        ids = []
        for i, e in enumerate(encodings):
            if i:
                ids.append(eos)
            ids += e.ids
        python_ids = ids

    def run_python_lines():
        # The same bytes as many short texts (one per line, its newline kept):
        # the package's fast case. Token boundaries differ at line ends, so
        # this is a throughput reference, not an identity check.
        nonlocal line_tokens
        seconds, encodings = read_and_encode(as_lines=True)
        line_times.append(seconds)
        line_tokens = sum(len(e.ids) for e in encodings)

    for r in range(reps):
        steps = (run_kolos, run_python, run_python_lines)
        for step in (steps if r % 2 == 0 else steps[::-1]):
            step()
    got = array.array("H")
    with open(out, "rb") as f:
        got.frombytes(f.read())
    if got.tolist() != python_ids:
        sys.exit("kolos and tokenizers wrote different ids")
    tokens = len(python_ids)
    k, p = statistics.median(kolos_times), statistics.median(python_times)
    print(f"tokens: {tokens} (identical)")
    print(f"kolos data prepare --tokenizer: {k:.3f} s  {tokens / k / 1e6:.2f} M tokens/s  "
          f"{total / k / 1e6:.1f} MB/s  (runs: {', '.join(f'{t:.3f}' for t in kolos_times)})")
    print(f"tokenizers encode_batch:        {p:.3f} s  {tokens / p / 1e6:.2f} M tokens/s  "
          f"{total / p / 1e6:.1f} MB/s  (runs: {', '.join(f'{t:.3f}' for t in python_times)})")
    q = statistics.median(line_times)
    print(f"tokenizers encode_batch, lines: {q:.3f} s  {line_tokens / q / 1e6:.2f} M tokens/s  "
          f"{total / q / 1e6:.1f} MB/s  (runs: {', '.join(f'{t:.3f}' for t in line_times)}; "
          f"{line_tokens} tokens)")
    print(f"kolos / tokenizers throughput (MB/s): {p / k:.2f} on the same documents, "
          f"{q / k:.2f} against the package on lines")


if __name__ == "__main__":
    main()
