#!/usr/bin/python3
"""Turns scikit-learn's handwritten digits into image-text conversations for the qwen2_vl recipes.

    scripts/make_digit_chat.py data/digits.csv.gz data/digit_chat

Writes DIR/images/NNNN.png (each 8x8 digit as a 64x64 greyscale PNG: dark ink on white, every
pixel an 8x8 block, which Qwen2-VL's image processor resizes to 56x56, 4 image tokens) and
DIR/digits.jsonl, one conversation per digit asking "What digit is this?" and answering with its
name ("seven"). Lines alternate between LLaMA-Factory's layout ({"messages", "images"}) and
Qwen-VL's ({"image", "conversations"}). Deterministic; the standard library only; the JSON Lines
file is written last and whole, so its presence means the images are all there.
"""
import gzip
import json
import os
import struct
import sys
import zlib

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SCALE = 8
QUESTION = "What digit is this?"


def png(width, height, rows):
    """A greyscale 8-bit PNG of `rows` (lists of 0..255)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(row) for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def digit_image(values):
    rows = []
    for y in range(8):
        row = []
        for x in range(8):
            row += [255 - round(values[y * 8 + x] * 255 / 16)] * SCALE
        rows += [row] * SCALE
    return png(8 * SCALE, 8 * SCALE, rows)


def conversation(index, image, label):
    answer = NAMES[label]
    if index % 2 == 0:
        return {"messages": [{"role": "user", "content": "<image>" + QUESTION},
                             {"role": "assistant", "content": answer}],
                "images": [image]}
    return {"image": image,
            "conversations": [{"from": "human", "value": "<image>\n" + QUESTION},
                              {"from": "gpt", "value": answer}]}


def main():
    source, target = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(target, "images"), exist_ok=True)
    lines = []
    with gzip.open(source, "rt") as f:
        for index, line in enumerate(f):
            fields = [int(float(v)) for v in line.strip().split(",")]
            values, label = fields[:64], fields[64]
            image = f"images/{index:04d}.png"
            with open(os.path.join(target, image), "wb") as out:
                out.write(digit_image(values))
            lines.append(json.dumps(conversation(index, image, label)))
    jsonl = os.path.join(target, "digits.jsonl")
    with open(jsonl + ".tmp", "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(jsonl + ".tmp", jsonl)
    print(f"wrote {len(lines)} digits to {target}")


if __name__ == "__main__":
    main()
