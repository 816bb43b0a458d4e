"""Encodes and decodes texts with Hugging Face's tokenizers library (the Rust tokenizers that
transformers runs), the reference the engine's tokenizer.json implementation is compared with
(tests/tokenizer/reference_encode_test.cc).

    .venv/bin/python tests/reference/encode_tokenizer.py CASES.json > RESULTS.json

CASES.json: {"cases": [{"tokenizer_file": PATH, "text_file": PATH, "lines": true|false,
                        "add_special_tokens": true|false}, ...]}
Text files are read as UTF-8 (invalid bytes become U+FFFD); with "lines" each line is one text.
RESULTS.json: [{"ids": [[...], ...], "decoded": ["...", ...], "normalized": ["...", ...]}
               or {"error": "..."}, ...] ("normalized": each text through the normalizer alone).
"""
import json
import sys

from tokenizers import Tokenizer


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    tokenizers = {}
    results = []
    for case in cases:
        try:
            path = case["tokenizer_file"]
            if path not in tokenizers:
                tokenizers[path] = Tokenizer.from_file(path)
            tokenizer = tokenizers[path]
            with open(case["text_file"], encoding="utf-8", errors="replace", newline="") as f:
                text = f.read()
            texts = text.split("\n") if case["lines"] else [text]
            encodings = tokenizer.encode_batch(texts, add_special_tokens=case["add_special_tokens"])
            ids = [e.ids for e in encodings]
            decoded = tokenizer.decode_batch(ids, skip_special_tokens=True)
            normalizer = tokenizer.normalizer
            normalized = [normalizer.normalize_str(t) if normalizer else t for t in texts]
            results.append({"ids": ids, "decoded": decoded, "normalized": normalized})
        except Exception as error:  # noqa: BLE001 - every failure is a result to compare
            results.append({"error": f"{type(error).__name__}: {error}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
