"""Encode throughput of Hugging Face's tokenizers library, for bench/tokenizer_bench (which
compares ours with it).

    .venv/bin/python bench/tokenizer_bench_reference.py TOKENIZER_JSON TEXT_FILE REPEATS

Prints {"seconds": best encode time of the text's lines, "first_seconds": the first pass's,
"tokens": ids per pass}. Loading is not timed; each line is encoded by its own call, one at a
time, as the engine's data loaders encode documents (encode_batch would spread them over threads).
"""
import json
import sys
import time

from tokenizers import Tokenizer


def main():
    tokenizer_file, text_file, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tokenizer = Tokenizer.from_file(tokenizer_file)
    with open(text_file, encoding="utf-8", errors="replace", newline="") as f:
        lines = f.read().split("\n")
    best, first, tokens = float("inf"), 0.0, 0
    for r in range(repeats):
        start = time.perf_counter()
        tokens = 0
        for line in lines:
            tokens += len(tokenizer.encode(line, add_special_tokens=False).ids)
        seconds = time.perf_counter() - start
        if r == 0:
            first = seconds
        best = min(best, seconds)
    json.dump({"seconds": best, "first_seconds": first, "tokens": tokens}, sys.stdout)


if __name__ == "__main__":
    main()
