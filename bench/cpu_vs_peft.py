#!/usr/bin/env python3
"""The engine against transformers + PEFT on the same CPU, in one run: LoRA and QLoRA training
tokens/s and peak RSS on the same weights, adapters, batches and threads, the losses both sides
reached, where the step time goes, evaluation examples/s, and greedy generation tokens/s.

    .venv/bin/python bench/cpu_vs_peft.py [--engine build/bin/engine] [--model qwen2.5-0.5b|tiny]
        [--batch 4] [--seq 512] [--steps 3] [--warmup 1] [--eval-examples 8] [--threads N]
        [--kinds lora,qlora] [--vl-batch 16 --vl-steps 20] [--precision auto|fp32|bf16-mixed]
        [--generate 1,8] [--new-tokens 32] [--json FILE]

Two models: --model (default Qwen2.5-0.5B's config) on chat text, --batch x --seq tokens; and the
main job's tiny Qwen2-VL (pipelines/qwen2_vl_tiny) on the digit images' conversations, --vl-batch
of them (--vl-batch 0 leaves it out). What both sides share, so that a ratio compares the same work:
  weights   transformers writes one checkpoint (f32 safetensors) from the model's config with random
            weights (no downloads), with the tokenizer beside it; both sides load it.
  adapters  PEFT makes the LoRA adapters (r=16, alpha 32, no dropout, on q/k/v/o/gate/up/down of
            every decoder layer; A random, B zero, as PEFT initialises them) and saves them; the
            engine's `lora` loads that directory (`peft_adapter`), PEFT loads it back.
  examples  text: conversations built from data/fortunes.txt, each longer than --seq tokens,
            rendered by the chat template of pipelines/qwen2_vl_tiny (a ChatML one) with the
            byte-level BPE of tests/fixtures/tokenizers/qwen2_vl_bpe.json and cut to --seq tokens;
            images: the first lines of data/digit_chat. Only the assistant's turns carry loss.
            Exactly one batch of them is the training split, so every step of both sides trains on
            that batch (what a step costs does not depend on which text it holds); the rest is the
            eval split. transformers reads the engine's own inputs: ids and loss masks from `engine
            preview --format=json [--split=eval]`, and with images the whole batch (pixels, grids)
            from `engine eval --logits=FILE [--split=train]`.
  step      AdamW (lr 2e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01; torch's fused CPU AdamW on
            the PEFT side), no clipping, constant learning rate, SDPA attention, no checkpointing.
  precision bf16-mixed (autocast to bf16 on the PEFT side) where the CPU has bf16 instructions
            (avx512_bf16 or amx_bf16), f32 elsewhere (--precision overrides).
  QLoRA     the decoder layers' linear weights in NF4 (blocks of 64, no double quantization): the
            engine's `nf4` quantizer against bitsandbytes' 4-bit CPU backend through
            BitsAndBytesConfig, computing in the precision above.
  threads   --threads (default: all cores) on both sides: OMP_NUM_THREADS for the engine,
            torch.set_num_threads for transformers. Each side runs in a process of its own; its
            peak RSS is that process's (VmHWM).

Tokens/s counts every position of the batch (rows x padded length) over the steps after the
warm-up. The losses after the first and the last step and the eval losses are printed side by side:
both sides start from the same weights and read the same inputs, so they agree to the precision's
tolerance (LOSS_TOLERANCE) or the benchmark says they do not. The step time by phase comes from the
engine's step_end events (their `seconds/*` metrics in metrics.jsonl) and from timers around
transformers' forward, backward and optimizer step.

Evaluation: the engine's final evaluation of the stage (the seconds between its last step_end and
its eval event) against a transformers loop over the same eval examples in batches of the training
batch's size, without gradients, after the same training: examples/s and both eval losses.

--generate P1,P2 times greedy generation of --new-tokens tokens for P1, P2... prompts at once with
the text model (KV cache on both sides: `engine generate --raw` on the checkpoint directory against
transformers' generate). Each side's decoding rate is (the new tokens of a run of --new-tokens + 1)
less (those of a run of 1) over the difference in time, so loading and the prefill cancel out.

Needs the project's .venv (torch 2.11, transformers 5.17, peft, bitsandbytes).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_VL = os.path.join(ROOT, "pipelines", "qwen2_vl_tiny")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "qwen2_vl_bpe.json")
FORTUNES = os.path.join(ROOT, "data", "fortunes.txt")
DIGITS = os.path.join(ROOT, "data", "digit_chat")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 2e-4
# Loss agreement, by precision. f32: the two sides sum in other orders (measured: 1e-6 after 4
# steps). bf16-mixed: products rounded to bf16 (8 bits of mantissa) in other orders on each side:
# measured up to 1.0e-3 after 4 steps on a CPU with bf16 instructions (2026-11-29).
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16-mixed": 2e-2}

# transformers config arguments, from each model's config.json on the hub.
MODELS = {
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=True),
    "tiny": dict(model_type="qwen2", vocab_size=1024, hidden_size=64, intermediate_size=176,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def say(text):
    print(text, flush=True)


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# --- What both sides share ----------------------------------------------------------------------

def write_model(directory, config_args=None, vl=False):
    """A model's config with random weights (seed 1), f32, and its tokenizer beside them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    if vl:
        config = AutoConfig.from_pretrained(TINY_VL)
        model_class = AutoModelForImageTextToText
    else:
        spec = dict(config_args)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        model_class = AutoModelForCausalLM
    torch.manual_seed(1)
    model = model_class.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    shutil.copy(TOKENIZER, os.path.join(directory, "tokenizer.json"))
    for name in ("tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(os.path.join(TINY_VL, name), os.path.join(directory, name))
    return sum(p.numel() for p in model.parameters())


def model_class_of(checkpoint):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    with open(os.path.join(checkpoint, "config.json")) as f:
        vl = "vision_config" in json.load(f)
    return AutoModelForImageTextToText if vl else AutoModelForCausalLM


def write_adapter(checkpoint, directory):
    """PEFT's LoRA adapters for the checkpoint, as PEFT initialises them (seed 2)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = model_class_of(checkpoint).from_pretrained(checkpoint, dtype=torch.float32)
    torch.manual_seed(2)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=LORA_TARGETS)
    get_peft_model(model, lora).save_pretrained(directory)


def fortunes():
    with open(FORTUNES, encoding="utf-8") as f:
        return [t.strip() for t in f.read().split("\n%\n") if len(t.strip()) > 40]


def write_conversations(path, count, seq):
    """`count` conversations, each of fortunes asked for and answered until it is longer than `seq`
    tokens (counted generously: a byte-level BPE token holds at least one byte)."""
    texts, at = fortunes(), 0
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(count):
            messages, chars = [], 0
            while chars < 4 * seq:
                fortune = texts[at % len(texts)]
                at += 1
                messages.append({"role": "user",
                                 "content": "Finish this fortune: " + " ".join(fortune.split()[:4])})
                messages.append({"role": "assistant", "content": fortune})
                chars += len(fortune) + 40
            out.write(json.dumps({"messages": messages}) + "\n")


def write_digit_conversations(directory, count):
    """The first `count` lines of the digit conversations, with their images, into `directory`."""
    with open(os.path.join(DIGITS, "digits.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for _, line in zip(range(count), f)]
    for line in lines:
        images = line.get("images") or [line["image"]]
        for image in images:
            os.makedirs(os.path.dirname(os.path.join(directory, image)), exist_ok=True)
            shutil.copy(os.path.join(DIGITS, image), os.path.join(directory, image))
    path = os.path.join(directory, "digits.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line) + "\n")
    return path


class Case:
    """One model, its data and the shapes of its batches, for both sides."""

    def __init__(self, name, checkpoint, adapter, data, batch, eval_examples, max_length, steps,
                 warmup, vl):
        self.name, self.checkpoint, self.adapter, self.data = name, checkpoint, adapter, data
        self.batch, self.eval_examples, self.max_length = batch, eval_examples, max_length
        self.steps, self.warmup, self.vl = steps, warmup, vl

    def pipeline(self, out_dir, precision, qlora, threads):
        eval_fraction = self.eval_examples / (self.batch + self.eval_examples)
        quantizer = (
            '  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] '
            '{ target_modules: "model.layers.*" double_quant: false } } }\n' if qlora else "")
        model = ('plugin: "qwen2_vl" options { [type.googleapis.com/engine.transformer.Qwen2VlOptions]'
                 if self.vl else
                 'plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions]')
        images = (f'\n    images {{ processor: "{self.checkpoint}/preprocessor_config.json" }}'
                  if self.vl else "")
        return f"""output_dir: "{out_dir}"
seed: 1
stage {{
  name: "bench"
  model {{ {model} {{ pretrained: "{self.checkpoint}" }} }} }}
{quantizer}  adapter {{ plugin: "lora" options {{ [type.googleapis.com/engine.plugins.LoraOptions] {{
    peft_adapter: "{self.adapter}" }} }} }}
  trainable {{ include: "*.lora_A.*" include: "*.lora_B.*" }}
  data {{ plugin: "chat" options {{ [type.googleapis.com/engine.plugins.ChatOptions] {{
    path: "{self.data}" max_length: {self.max_length} eval_fraction: {eval_fraction!r}
    tokenizer {{ kind: HF_JSON path: "{self.checkpoint}/tokenizer.json"
                config: "{self.checkpoint}/tokenizer_config.json" }}{images} }} }} }}
  precision {{ plugin: "{precision}" }}
  optimizer {{ adamw {{ beta1: 0.9 beta2: 0.999 epsilon: 1e-8 weight_decay: 0.01 }}
               learning_rate: {LEARNING_RATE} }}
  schedule {{ max_steps: {self.warmup + self.steps} batch_size: {self.batch}
              eval_batch_size: {self.batch} }}
  checkpoint {{ save_optimizer_state: false }}
  parallel {{ device: "cpu" num_threads: {threads} }}
  callback {{ plugin: "metrics_jsonl" }}
}}
"""


# --- The engine's side --------------------------------------------------------------------------

def engine_env(args):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def run_tool(args, what, command):
    run = subprocess.run([args.engine] + command, capture_output=True, text=True,
                         env=engine_env(args))
    if run.returncode != 0:
        sys.exit(f"engine {what} failed ({run.returncode}):\n{run.stdout[-2000:]}"
                 f"{run.stderr[-3000:]}")
    return run.stdout


def engine_rows(args, case, pipeline, split, count):
    """The ids and loss masks of a split's first examples (`engine preview --format=json`)."""
    shown = run_tool(args, "preview", ["preview", pipeline, "--format=json", "-n", str(count),
                                       f"--split={split}"])
    examples = json.loads(shown)["examples"]
    if len(examples) != count:
        sys.exit(f"engine preview gave {len(examples)} {split} examples, expected {count}")
    lengths = sorted({len(e["input_ids"]) for e in examples})
    if lengths != [case.max_length]:
        sys.exit(f"the conversations gave rows of {lengths} tokens, not {case.max_length}")
    return {"rows": [{"input_ids": e["input_ids"], "loss_mask": e["loss_mask"]} for e in examples]}


def engine_inputs_file(args, pipeline, split, count, path):
    """A split's first examples as the model takes them, images included (`engine eval
    --logits`, on the stage's final checkpoint: the inputs do not depend on the weights)."""
    run_tool(args, "eval --logits", ["eval", pipeline, f"--logits={path}", f"--split={split}",
                                     f"--examples={count}"])
    return {"file": path}


def run_engine(args, case, pipeline, out_dir):
    start = time.perf_counter()
    run_tool(args, "run", ["run", pipeline])
    wall = time.perf_counter() - start
    steps, evals, peak_rss = [], [], 0
    with open(os.path.join(out_dir, "bench", "metrics.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            peak_rss = max(peak_rss, event.get("peak_rss_bytes", 0))
            if event.get("event") == "step_end":
                steps.append(event)
            if event.get("event") == "eval":
                evals.append(event)
    if len(steps) != case.warmup + case.steps or len(evals) != 1:
        sys.exit(f"engine: {len(steps)} step_end and {len(evals)} eval lines, expected "
                 f"{case.warmup + case.steps} and the final evaluation")
    seconds = steps[-1]["time"] - steps[case.warmup - 1]["time"]
    phases = {}
    for step in steps[case.warmup:]:
        for name, value in step["metrics"].items():
            if name.startswith("seconds/"):
                phases[name[len("seconds/"):]] = phases.get(name[len("seconds/"):], 0) + value
    return {"step_s": seconds / case.steps, "peak_rss_bytes": peak_rss,
            "losses": [s["metrics"]["loss"] for s in steps],
            "phases_s": {k: v / case.steps for k, v in phases.items()}, "wall_s": wall,
            "eval_examples_per_s": case.eval_examples / (evals[0]["time"] - steps[-1]["time"]),
            "eval_loss": evals[0]["metrics"]["eval/loss"]}


# --- transformers + PEFT's side (a process of its own: --side=peft) ----------------------------

def batches(source, size, config):
    """The model inputs of `source` (preview's rows or an `engine eval --logits` file), in batches
    of at most `size` rows: input_ids, attention_mask, labels (-100 where no loss) and, with
    images, pixel_values, image_grid_thw and which tokens are the images' (mm_token_type_ids, from
    which transformers 5 computes the multimodal positions)."""
    import torch

    if "file" in source:
        from safetensors.torch import load_file

        saved = load_file(source["file"])
        batch = {name: saved[name] for name in ("input_ids", "attention_mask", "labels",
                                                "pixel_values", "image_grid_thw") if name in saved}
        if "image_grid_thw" in batch:
            batch["mm_token_type_ids"] = (batch["input_ids"] == config.image_token_id).int()
        return [batch]
    out = []
    for begin in range(0, len(source["rows"]), size):
        rows = source["rows"][begin:begin + size]
        ids = torch.tensor([e["input_ids"] for e in rows], dtype=torch.long)
        mask = torch.tensor([e["loss_mask"] for e in rows], dtype=torch.bool)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                    "labels": torch.where(mask, ids, torch.full_like(ids, -100))})
    return out


def peft_model(spec):
    import torch
    from peft import PeftModel
    from transformers import BitsAndBytesConfig

    kwargs = {}
    if spec["qlora"]:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False,
            bnb_4bit_compute_dtype=torch.bfloat16 if spec["bf16"] else torch.float32,
            llm_int8_skip_modules=["lm_head", "model.visual"])
        kwargs["device_map"] = {"": "cpu"}
    model = model_class_of(spec["checkpoint"]).from_pretrained(
        spec["checkpoint"], dtype=torch.float32, attn_implementation="sdpa", **kwargs)
    model.config.use_cache = False
    if spec["qlora"]:
        import bitsandbytes

        quantized = [name for name, module in model.named_modules()
                     if isinstance(module, bitsandbytes.nn.Linear4bit)]
        # The engine's nf4 quantizes the decoder layers only (target_modules "model.layers.*").
        outside = [name for name in quantized if ".layers." not in name or "visual" in name]
        if outside:
            sys.exit(f"bitsandbytes quantized layers the engine does not: {outside[:3]}")
    if model.config._attn_implementation != "sdpa":
        sys.exit(f"transformers built {model.config._attn_implementation} attention, not sdpa")
    return PeftModel.from_pretrained(model, spec["adapter"], is_trainable=True)


def peft_side(spec):
    """Trains and evaluates as the engine does; prints one JSON line of results."""
    import torch

    torch.set_num_threads(spec["threads"])
    model = peft_model(spec)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01, fused=True)
    (batch,) = batches(spec["train"], spec["batch"], model.config)
    phases = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    losses = []

    def step(timed):
        marks = [time.perf_counter()]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["bf16"]):
            loss = model(**batch).loss
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        losses.append(loss.item())
        if timed:
            for name, begin, end in zip(phases, marks, marks[1:]):
                phases[name] += end - begin

    for _ in range(spec["warmup"]):
        step(False)
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        step(True)
    seconds = time.perf_counter() - start
    eval_seconds, eval_loss, eval_examples = evaluate(model, spec)
    print(json.dumps({"step_s": seconds / spec["steps"], "peak_rss_bytes": peak_rss_bytes(),
                      "losses": losses,
                      "phases_s": {k: v / spec["steps"] for k, v in phases.items()},
                      "eval_examples_per_s": eval_examples / eval_seconds,
                      "eval_loss": eval_loss}))


def evaluate(model, spec):
    """The eval examples without gradients: seconds, the loss over every token that carries it
    (as the engine's eval/loss) and the number of examples."""
    import torch

    model.eval()
    loss_sum, loss_count, examples = 0.0, 0, 0
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches(spec["eval"], spec["batch"], model.config):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["bf16"]):
                loss = model(**batch).loss
            count = int((batch["labels"][:, 1:] != -100).sum())
            loss_sum += loss.item() * count
            loss_count += count
            examples += batch["input_ids"].size(0)
    return time.perf_counter() - start, loss_sum / loss_count, examples


def positions(source):
    """Rows x padded length of the inputs' (one) batch."""
    if "file" in source:
        from safetensors import safe_open

        with safe_open(source["file"], "np") as f:
            rows, length = f.get_slice("input_ids").get_shape()
        return rows * length
    return sum(len(row["input_ids"]) for row in source["rows"])


def run_peft(spec, tmp):
    spec_file = os.path.join(tmp, "peft_spec.json")
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--side=peft", spec_file],
                         capture_output=True, text=True)
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {run.returncode}",
                "stderr": run.stderr[-3000:]}
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - start
    return result


# --- Generation ---------------------------------------------------------------------------------

def prompts(count):
    return [" ".join(text.split()[:12]) for text in fortunes()[:count]]


def engine_generate(args, checkpoint, texts, new_tokens):
    """The best of two runs' wall seconds (a process each: loading included), the new tokens and
    their ids."""
    command = ["generate", checkpoint, "--raw", "--format=json", f"--max_new_tokens={new_tokens}",
               f"--batch_size={len(texts)}"] + [f"--prompt={t}" for t in texts]
    best = None
    for _ in range(2):
        start = time.perf_counter()
        outputs = json.loads(run_tool(args, "generate", command))["outputs"]
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return best, sum(len(o["ids"]) for o in outputs), [o["ids"] for o in outputs]


def generate_side(spec):
    """transformers' greedy generate, timed in-process after a warm-up; one JSON line."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["checkpoint"], dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    tokenizer = Tokenizer.from_file(os.path.join(spec["checkpoint"], "tokenizer.json"))
    encoded = [tokenizer.encode(t, add_special_tokens=False).ids for t in spec["prompts"]]
    width = max(len(e) for e in encoded)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # left padding
    attention = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])

    def generate(new_tokens):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attention, do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=pad, use_cache=True)
        return time.perf_counter() - start, out[:, width:]

    generate(2)  # warm-up
    short = min(generate(1)[0] for _ in range(2))
    long, out = generate(spec["new_tokens"] + 1)
    long = min(long, generate(spec["new_tokens"] + 1)[0])
    print(json.dumps({"short_s": short, "long_s": long, "ids": out.tolist()}))


def run_generation(args, checkpoint, tmp, count):
    texts = prompts(count)
    short_s, short_n, _ = engine_generate(args, checkpoint, texts, 1)
    long_s, long_n, engine_ids = engine_generate(args, checkpoint, texts, args.new_tokens + 1)
    engine = {"tokens_per_s": (long_n - short_n) / (long_s - short_s)}
    spec_file = os.path.join(tmp, "generate_spec.json")
    with open(spec_file, "w") as f:
        json.dump({"checkpoint": checkpoint, "prompts": texts, "threads": args.threads,
                   "new_tokens": args.new_tokens}, f)
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--side=generate",
                          spec_file], capture_output=True, text=True)
    if run.returncode != 0:
        return {"engine": engine, "transformers": {"error": run.stderr[-2000:]}}
    hf = json.loads(run.stdout.strip().splitlines()[-1])
    transformers = {"tokens_per_s": count * args.new_tokens / (hf["long_s"] - hf["short_s"])}
    same = sum(a == b[:len(a)] for a, b in zip(engine_ids, hf["ids"]))
    return {"engine": engine, "transformers": transformers,
            "ratio": engine["tokens_per_s"] / transformers["tokens_per_s"],
            "same_tokens": f"{same}/{count}"}


# --- The run ------------------------------------------------------------------------------------

def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def train_kind(args, case, kind, precision, tmp):
    qlora = kind == "qlora"
    out_dir = os.path.join(tmp, f"out-{case.name}-{kind}")
    pipeline = os.path.join(tmp, f"{case.name}-{kind}.pbtxt")
    with open(pipeline, "w") as f:
        f.write(case.pipeline(out_dir, precision, qlora, args.threads))
    if not case.vl:
        train = engine_rows(args, case, pipeline, "train", case.batch)
        evaluation = engine_rows(args, case, pipeline, "eval", case.eval_examples)
    engine = run_engine(args, case, pipeline, out_dir)
    if case.vl:
        train = engine_inputs_file(args, pipeline, "train", case.batch,
                                   os.path.join(tmp, f"{case.name}-train.safetensors"))
        evaluation = engine_inputs_file(args, pipeline, "eval", case.eval_examples,
                                        os.path.join(tmp, f"{case.name}-eval.safetensors"))
    peft = run_peft({"checkpoint": case.checkpoint, "adapter": case.adapter, "train": train,
                     "eval": evaluation, "batch": case.batch, "threads": args.threads,
                     "bf16": precision == "bf16-mixed", "qlora": qlora, "warmup": case.warmup,
                     "steps": case.steps}, tmp)
    row = {"model": case.name, "kind": kind, "precision": precision, "engine": engine,
           "transformers+peft": peft, "positions_per_step": positions(train)}
    engine["tokens_per_s"] = row["positions_per_step"] / engine["step_s"]
    if "error" not in peft:
        peft["tokens_per_s"] = row["positions_per_step"] / peft["step_s"]
    if "error" not in peft:
        row["speed_ratio"] = peft["step_s"] / engine["step_s"]
        row["rss_ratio"] = engine["peak_rss_bytes"] / peft["peak_rss_bytes"]
        row["eval_ratio"] = engine["eval_examples_per_s"] / peft["eval_examples_per_s"]
        row["loss_difference"] = [abs(engine["losses"][i] - peft["losses"][i]) for i in (0, -1)]
        row["loss_difference"].append(abs(engine["eval_loss"] - peft["eval_loss"]))
        row["losses_agree"] = max(row["loss_difference"]) <= LOSS_TOLERANCE[precision]
    return row


def print_row(row):
    engine, peft = row["engine"], row["transformers+peft"]
    tokens_per_step = row["positions_per_step"]
    label = f"{row['model']} {row['kind']}"
    say(f"{label:<24} {'engine':<18} {tokens_per_step / engine['step_s']:>9,.1f} "
        f"{engine['step_s']:>7.2f} {engine['peak_rss_bytes'] / 2**30:>8.2f} "
        f"{engine['losses'][0]:>8.4f} {engine['losses'][-1]:>8.4f}")
    if "error" in peft:
        say(f"{'':<24} {'transformers+peft':<18} cannot train: {peft['error']}")
        return
    say(f"{'':<24} {'transformers+peft':<18} {tokens_per_step / peft['step_s']:>9,.1f} "
        f"{peft['step_s']:>7.2f} {peft['peak_rss_bytes'] / 2**30:>8.2f} "
        f"{peft['losses'][0]:>8.4f} {peft['losses'][-1]:>8.4f}")
    agree = "agree" if row["losses_agree"] else "DO NOT AGREE"
    first, last, evaluated = row["loss_difference"]
    say(f"{'':<24} {'engine / peft':<18} {row['speed_ratio']:>9.2f} {'':>7} "
        f"{row['rss_ratio']:>8.2f}   losses {agree} (differences: first {first:.1e}, last "
        f"{last:.1e}, eval {evaluated:.1e}; tolerance {LOSS_TOLERANCE[row['precision']]:g})")
    say(f"{'':<24} {'evaluation':<18} engine {engine['eval_examples_per_s']:.2f} examples/s "
        f"(eval/loss {engine['eval_loss']:.4f}), transformers+peft "
        f"{peft['eval_examples_per_s']:.2f} ({peft['eval_loss']:.4f}), engine / peft "
        f"{row['eval_ratio']:.2f}")
    for side, phases in (("engine", engine["phases_s"]), ("peft", peft["phases_s"])):
        total = sum(phases.values())
        parts = ", ".join(f"{name} {seconds:.3f} s ({seconds / total:.0%})"
                          for name, seconds in phases.items() if seconds > 0)
        say(f"{'':<24} {side + ' step:':<18} {parts}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("--side=peft", "--side=generate"):
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        (peft_side if sys.argv[1] == "--side=peft" else generate_side)(spec)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default=os.path.join(ROOT, "build", "bin", "engine"))
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--eval-examples", type=int, default=8)
    parser.add_argument("--vl-batch", type=int, default=16,
                        help="digit conversations per batch for the tiny Qwen2-VL; 0: leave it out")
    parser.add_argument("--vl-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--kinds", default="lora,qlora", help="empty: no training, only generation")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16-mixed"], default="auto")
    parser.add_argument("--generate", default="1,8",
                        help="prompt counts to time generation for; empty: none")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step allocates)")
    kinds = [k for k in args.kinds.split(",") if k]
    if any(k not in ("lora", "qlora") for k in kinds):
        parser.error(f"--kinds takes lora and qlora, not '{args.kinds}'")
    precision = args.precision
    if precision == "auto":
        precision = "bf16-mixed" if cpu_has_bf16() else "fp32"
    import torch
    import transformers

    results = {"args": vars(args), "precision": precision, "torch": torch.__version__,
               "transformers": transformers.__version__, "rows": [], "generation": []}
    with tempfile.TemporaryDirectory(prefix="cpu-vs-peft-") as tmp:
        cases = []
        text_dir = os.path.join(tmp, "text")
        parameters = write_model(text_dir, MODELS[args.model])
        write_adapter(text_dir, os.path.join(tmp, "text-adapter"))
        write_conversations(os.path.join(tmp, "conversations.jsonl"),
                            args.batch + args.eval_examples, args.seq)
        cases.append(Case(args.model, text_dir, os.path.join(tmp, "text-adapter"),
                          os.path.join(tmp, "conversations.jsonl"), args.batch,
                          args.eval_examples, args.seq, args.steps, args.warmup, vl=False))
        say(f"{args.model}: {parameters / 1e6:,.1f} M parameters (random, f32), batch {args.batch} x "
            f"{args.seq} tokens of chat, {args.steps} steps after {args.warmup}")
        if args.vl_batch > 0:
            vl_dir = os.path.join(tmp, "vl")
            vl_parameters = write_model(vl_dir, vl=True)
            write_adapter(vl_dir, os.path.join(tmp, "vl-adapter"))
            data = write_digit_conversations(os.path.join(tmp, "digits"), 2 * args.vl_batch)
            # Longer than any digit conversation, so that nothing is cut.
            cases.append(Case("qwen2-vl-tiny", vl_dir, os.path.join(tmp, "vl-adapter"), data,
                              args.vl_batch, args.vl_batch, 128, args.vl_steps, 3, vl=True))
            say(f"qwen2-vl-tiny: {vl_parameters / 1e6:.2f} M parameters (random, f32), batch "
                f"{args.vl_batch} digit conversations with their images, {args.vl_steps} steps "
                f"after 3")
        say(f"LoRA r=16 on every decoder linear layer (QLoRA: NF4 base), {args.threads} threads, "
            f"{precision}; torch {torch.__version__}, transformers {transformers.__version__}")
        say(f"{'model, kind':<24} {'side':<18} {'tokens/s':>9} {'step s':>7} {'peak GiB':>8} "
            f"{'loss 1st':>8} {'loss end':>8}")
        for case in cases:
            for kind in kinds:
                row = train_kind(args, case, kind, precision, tmp)
                print_row(row)
                results["rows"].append(row)
        counts = [int(c) for c in args.generate.split(",") if c]
        if counts:
            say(f"greedy generation with {args.model}, {args.new_tokens} new tokens, KV cache "
                f"(tokens/s decoding)")
        for count in counts:
            g = run_generation(args, text_dir, tmp, count)
            g["prompts"] = count
            results["generation"].append(g)
            if "error" in g["transformers"]:
                say(f"  {count} prompts: engine {g['engine']['tokens_per_s']:,.1f}; transformers "
                    f"failed: {g['transformers']['error'][-300:]}")
                continue
            say(f"  {count} prompts: engine {g['engine']['tokens_per_s']:,.1f}, transformers "
                f"{g['transformers']['tokens_per_s']:,.1f}, engine / transformers "
                f"{g['ratio']:.2f} (same tokens: {g['same_tokens']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
