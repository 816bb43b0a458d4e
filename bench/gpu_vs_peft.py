#!/usr/bin/env python3
"""The engine against transformers + PEFT on one GPU, in one run: LoRA training tokens/s and peak
GPU memory of the same Llama-shaped model, batch and sequence length, and their ratios.

    python3 bench/gpu_vs_peft.py --engine /tmp/build-gpu/bin/engine [--shape 1.1b] [--batch 8]
        [--seq 1024] [--steps 20] [--warmup 3] [--checkpointing both] [--qlora] [--json FILE]

Both sides build the model from its shape with random weights (no downloads): TinyLlama-1.1B's
(hidden 2048, 22 layers, 32 heads of which 4 key/value, MLP 5632, vocabulary 32000) or `0.5b`
(hidden 1024, 24 layers, 16/16 heads, MLP 2816). Weights in bf16, LoRA r=16 (alpha 32, no dropout)
on q/k/v/o/gate/up/down of every layer with f32 adapters (PEFT's default for a bf16 base; the
engine's bf16-true keeps f32 masters of what trains), AdamW (fused on both sides), SDPA attention,
gradient checkpointing on both sides and off on both sides (--checkpointing on|off|both).

  engine:  `engine run` on a generated pipeline (text data: the fortunes, byte tokens, cut into
           windows of --seq); tokens/s from the step_end lines of metrics.jsonl after --warmup
           steps, peak memory from their cuda_peak_allocated_bytes.
  peft:    LlamaForCausalLM from the same config, get_peft_model, a plain loop on random token ids
           of the same shape; tokens/s over --steps steps after --warmup, peak memory from
           torch.cuda.max_memory_allocated.
--qlora adds the engine's NF4 quantizer on the decoder layers (4-bit base, bf16 compute) against
the same bf16 LoRA on the PEFT side: memory and speed of QLoRA against plain LoRA.

Needs a GPU machine with transformers and peft in its Python; `--engine-only` runs the engine's
half alone (any device; a CPU smoke test with `--shape tiny`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocabulary
    "1.1b": (2048, 22, 32, 4, 5632, 32000),
    "0.5b": (1024, 24, 16, 16, 2816, 32000),
    "tiny": (64, 2, 4, 2, 176, 512),
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine_pipeline(out_dir, data, shape, args, checkpointing, qlora):
    hidden, layers, heads, kv_heads, intermediate, vocab = SHAPES[shape]
    quantizer = (
        '  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] '
        '{ target_modules: "model.layers.*" } } }\n' if qlora else "")
    return f"""output_dir: "{out_dir}"
seed: 1
stage {{
  name: "bench"
  model {{ plugin: "llama" options {{ [type.googleapis.com/engine.transformer.LlamaOptions] {{
    vocab_size: {vocab} hidden_size: {hidden} num_hidden_layers: {layers}
    num_attention_heads: {heads} num_key_value_heads: {kv_heads} intermediate_size: {intermediate}
    max_position_embeddings: {max(2048, args.seq)} tie_word_embeddings: false
    gradient_checkpointing: {"true" if checkpointing else "false"} }} }} }}
{quantizer}  adapter {{ plugin: "lora" options {{ [type.googleapis.com/engine.plugins.LoraOptions] {{
    r: 16 lora_alpha: 32 target_modules: "model.layers.*" }} }} }}
  trainable {{ include: "*.lora_A.*" include: "*.lora_B.*" }}
  data {{ plugin: "text" options {{ [type.googleapis.com/engine.plugins.TextOptions] {{
    path: "{data}" document_separator: "%" sequence_length: {args.seq} eval_fraction: 0.002 }} }} }}
  precision {{ plugin: "bf16-true" }}
  optimizer {{ adamw {{}} learning_rate: 0.0002 }}
  schedule {{ max_steps: {args.warmup + args.steps} batch_size: {args.batch} }}
  checkpoint {{ save_optimizer_state: false }}
  parallel {{ device: "{args.device}" }}
  callback {{ plugin: "metrics_jsonl" }}
}}
"""


def run_engine(args, checkpointing, qlora):
    with tempfile.TemporaryDirectory(prefix="engine-vs-peft-") as tmp:
        pipeline = os.path.join(tmp, "bench.pbtxt")
        with open(pipeline, "w") as f:
            f.write(engine_pipeline(os.path.join(tmp, "out"), os.path.abspath(args.data), args.shape,
                                    args, checkpointing, qlora))
        run = subprocess.run([args.engine, "run", pipeline], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"engine run failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
        steps = []
        with open(os.path.join(tmp, "out", "bench", "metrics.jsonl")) as f:
            for line in f:
                event = json.loads(line)
                if event.get("event") == "step_end":
                    steps.append(event)
    if len(steps) != args.warmup + args.steps:
        sys.exit(f"engine: {len(steps)} step_end lines, expected {args.warmup + args.steps}")
    seconds = steps[-1]["time"] - steps[args.warmup - 1]["time"]
    peak = max(s.get("cuda_peak_allocated_bytes", 0) for s in steps)
    return {"tokens_per_s": args.steps * args.batch * args.seq / seconds, "peak_bytes": peak,
            "final_loss": steps[-1]["metrics"]["loss"]}


def run_peft(args, checkpointing):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, intermediate, vocab = SHAPES[args.shape]
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         intermediate_size=intermediate, max_position_embeddings=max(2048, args.seq),
                         tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(1)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    # Built and cast on the host, then placed, as the engine does: the GPU's peak counts what
    # training holds, on both sides from before the model exists.
    model = LlamaForCausalLM(config).to(torch.bfloat16).to("cuda")
    if model.config._attn_implementation != "sdpa":
        sys.exit(f"transformers built {model.config._attn_implementation} attention, not sdpa")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4, fused=True)
    ids = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"tokens_per_s": args.steps * args.batch * args.seq / seconds,
              "peak_bytes": torch.cuda.max_memory_allocated(), "final_loss": loss.item()}
    del model, optimizer
    torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default=os.path.join(ROOT, "build", "bin", "engine"))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.1b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--checkpointing", choices=["on", "off", "both"], default="both")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--data", default=os.path.join(ROOT, "data", "fortunes.txt"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--engine-only", action="store_true")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles and allocates)")
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.checkpointing]
    rows = []
    print(f"shape {args.shape}, batch {args.batch} x {args.seq} tokens, LoRA r=16, "
          f"{args.steps} steps after {args.warmup}")
    print(f"{'checkpointing':<14} {'side':<16} {'tokens/s':>10} {'peak GiB':>9} {'loss':>7}")
    for checkpointing in modes:
        sides = [("engine", lambda: run_engine(args, checkpointing, False))]
        if args.qlora:
            sides.append(("engine qlora", lambda: run_engine(args, checkpointing, True)))
        if not args.engine_only:
            sides.append(("transformers+peft", lambda: run_peft(args, checkpointing)))
        row = {"checkpointing": checkpointing}
        for name, run in sides:
            row[name] = run()
            r = row[name]
            print(f"{'on' if checkpointing else 'off':<14} {name:<16} {r['tokens_per_s']:>10,.0f} "
                  f"{r['peak_bytes'] / 2**30:>9.2f} {r['final_loss']:>7.3f}")
        if "transformers+peft" in row:
            peft = row["transformers+peft"]
            for name in ("engine", "engine qlora"):
                if name in row:
                    print(f"{'':<14} {name + ' / peft':<16} "
                          f"{row[name]['tokens_per_s'] / peft['tokens_per_s']:>10.2f} "
                          f"{row[name]['peak_bytes'] / peft['peak_bytes']:>9.2f}")
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
