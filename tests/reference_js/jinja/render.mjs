// Renders chat templates with @huggingface/jinja, the reference the engine's renderer is
// compared with (tests/chat/reference_render_test.cc).
//
//   node render.mjs CASES.json > RESULTS.json
//
// CASES.json: {"cases": [{"template_file": PATH, "variables": {...}}, ...]}
// RESULTS.json: [{"text": "..."} or {"error": "..."}, ...], in the same order.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const { cases } = JSON.parse(readFileSync(process.argv[2], "utf8"));
const parsed = new Map();
const results = cases.map(({ template_file, variables }) => {
  try {
    if (!parsed.has(template_file)) {
      parsed.set(template_file, new Template(readFileSync(template_file, "utf8")));
    }
    return { text: parsed.get(template_file).render(variables) };
  } catch (error) {
    return { error: String(error.message ?? error) };
  }
});
process.stdout.write(JSON.stringify(results));
