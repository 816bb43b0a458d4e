#!/usr/bin/python3
"""Turns the fortunes into chat conversations for pipelines/chat_sft.pbtxt.

    scripts/make_fortune_chat.py data/fortunes.txt data/fortune_chat.jsonl

Each short fortune (one to three lines) becomes {"messages": [user, assistant]}: the user asks for
a fortune that begins with its first words, the assistant answers with the whole fortune. A model
that learned the format answers with a fortune and stops at the end-of-turn token. Deterministic;
the standard library only. Writes the output whole or not at all.
"""
import json
import os
import sys

QUESTIONS = [
    "Tell me a fortune that begins with \"{}\".",
    "Finish this fortune: {}",
    "What is the fortune that starts \"{}\"?",
]


def fortunes(text):
    for entry in text.split("\n%\n"):
        entry = entry.strip("\n%")
        lines = [line.rstrip() for line in entry.split("\n")]
        if 1 <= len(lines) <= 3 and 20 <= len(entry) <= 200 and "\t" not in entry:
            yield " ".join(line.strip() for line in lines)


def main():
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = []
    for i, fortune in enumerate(fortunes(text)):
        words = fortune.split()
        if len(words) < 5:
            continue
        question = QUESTIONS[i % len(QUESTIONS)].format(" ".join(words[:3]))
        lines.append(json.dumps({"messages": [{"role": "user", "content": question},
                                              {"role": "assistant", "content": fortune}]},
                                ensure_ascii=False))
    temporary = target + ".part"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(temporary, target)
    print(f"wrote {target}: {len(lines)} conversations")


if __name__ == "__main__":
    main()
