// Encodes and decodes texts with @huggingface/tokenizers, the reference the engine's tokenizer.json
// implementation is compared with (tests/tokenizer/reference_encode_test.cc).
//
//   node encode.mjs CASES.json > RESULTS.json
//
// CASES.json: {"cases": [{"tokenizer_file": PATH, "text_file": PATH, "lines": true|false,
//                         "add_special_tokens": true|false}, ...]}
// Text files are read as UTF-8 (invalid bytes become U+FFFD); with "lines" each line is one text.
// RESULTS.json: [{"ids": [[...], ...], "decoded": ["...", ...]} or {"error": "..."}, ...].
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const { cases } = JSON.parse(readFileSync(process.argv[2], "utf8"));
const tokenizers = new Map();
const load = (file) => {
  if (!tokenizers.has(file)) {
    tokenizers.set(file, new Tokenizer(JSON.parse(readFileSync(file, "utf8")),
                                       { clean_up_tokenization_spaces: false }));
  }
  return tokenizers.get(file);
};
const results = cases.map(({ tokenizer_file, text_file, lines, add_special_tokens }) => {
  try {
    const tokenizer = load(tokenizer_file);
    const text = readFileSync(text_file, "utf8");
    const texts = lines ? text.split("\n") : [text];
    const ids = texts.map((t) => tokenizer.encode(t, { add_special_tokens }).ids);
    const decoded = ids.map((i) => i.length === 0 ? "" :
                            tokenizer.decode(i, { skip_special_tokens: true }));
    return { ids, decoded };
  } catch (error) {
    return { error: String(error.message ?? error) };
  }
});
process.stdout.write(JSON.stringify(results));
