// Encode throughput of @huggingface/tokenizers, for bench/tokenizer_bench (which compares ours).
//
//   node bench.mjs TOKENIZER_JSON TEXT_FILE REPEATS
//
// Prints {"seconds": best encode time of the text's lines, "tokens": ids per pass}. Loading is not
// timed; each pass encodes every line (the cache of words fills on the first pass, as ours has
// none, the first pass is reported too).
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizer_file, text_file, repeats] = process.argv.slice(2);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizer_file, "utf8")), {});
const lines = readFileSync(text_file, "utf8").split("\n");
let best = Infinity, first = 0, tokens = 0;
for (let r = 0; r < Number(repeats); ++r) {
  const start = process.hrtime.bigint();
  tokens = 0;
  for (const line of lines) tokens += tokenizer.encode(line, { add_special_tokens: false }).ids.length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  if (r === 0) first = seconds;
  best = Math.min(best, seconds);
}
process.stdout.write(JSON.stringify({ seconds: best, first_seconds: first, tokens }));
