#!/usr/bin/env python3
"""The engine against transformers + PEFT on one GPU, in one run: LoRA training tokens/s and peak
GPU memory of the same checkpoint, batch and sequence length, and their ratios.

    python3 bench/gpu_vs_peft.py --engine build/bin/engine [--model qwen2.5-0.5b] [--batch 8]
        [--seq 1024] [--steps 20] [--warmup 3] [--checkpointing both] [--qlora] [--json FILE]

transformers writes one checkpoint from a model's config with random weights (no downloads:
Qwen2.5-0.5B's, Llama-3.2-1B's, TinyLlama-1.1B's, or `tiny` for a CPU smoke test) in bf16; both
sides load that directory. LoRA r=16 (alpha 32, no dropout) on q/k/v/o/gate/up/down of every layer
with f32 adapters (PEFT's default for a bf16 base; the engine's bf16-true keeps f32 masters of what
trains), AdamW (fused on both sides), SDPA attention, gradient checkpointing on both sides and off
on both sides (--checkpointing on|off|both).

  engine:  `engine run` on a generated pipeline (text data: the fortunes, byte tokens, cut into
           windows of --seq); tokens/s from the step_end lines of metrics.jsonl after --warmup
           steps, peak memory from their cuda_peak_allocated_bytes.
  peft:    AutoModelForCausalLM.from_pretrained, get_peft_model, a plain loop on random token ids
           of the same shape; tokens/s over --steps steps after --warmup, peak memory from
           torch.cuda.max_memory_allocated.
--qlora puts the decoder layers' base weights in 4 bits on both sides: the engine's NF4 quantizer
against transformers' BitsAndBytesConfig (NF4, bf16 compute, no double quantization) with PEFT.

Needs transformers and peft (and bitsandbytes for --qlora) in its Python; `--engine-only` runs the
engine's half alone (any device: `--model tiny --device cpu` is the smoke test).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# transformers config arguments, from each model's config.json on the hub.
MODELS = {
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=True),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192},
                         rope_theta=500000.0),
    "tinyllama-1.1b": dict(model_type="llama", vocab_size=32000, hidden_size=2048,
                           intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, max_position_embeddings=2048,
                           rms_norm_eps=1e-5, tie_word_embeddings=False),
    "tiny": dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=176,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=2048, tie_word_embeddings=False),
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def save_random_model(model_class, config, directory):
    """`model_class` from `config` with random weights (seed 1) saved in bf16 to `directory`;
    returns its parameter count."""
    import torch

    torch.manual_seed(1)
    # Initialised on the GPU where there is one: a billion random weights take most of a minute on
    # the CPU, and the GPU machine's time is short.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return parameters


def write_checkpoint(name, directory):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(MODELS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    return save_random_model(AutoModelForCausalLM, config, directory)


def cached_checkpoint(name, cache, write=write_checkpoint):
    """The model's random checkpoint in cache/name, written once by write(name, directory): every
    run that names the same cache shares it."""
    directory = os.path.join(cache, name)
    marker = os.path.join(directory, "parameters.txt")
    if not os.path.exists(marker):
        os.makedirs(directory, exist_ok=True)
        parameters = write(name, directory)
        with open(marker, "w") as f:
            f.write(str(parameters))
    with open(marker) as f:
        return directory, int(f.read())


def engine_pipeline(out_dir, data, checkpoint, args, checkpointing, qlora):
    quantizer = (
        '  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] '
        '{ target_modules: "model.layers.*" } } }\n' if qlora else "")
    return f"""output_dir: "{out_dir}"
seed: 1
stage {{
  name: "bench"
  model {{ plugin: "llama" options {{ [type.googleapis.com/engine.transformer.LlamaOptions] {{
    pretrained: "{checkpoint}"
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


def run_engine(args, checkpoint, checkpointing, qlora):
    with tempfile.TemporaryDirectory(prefix="engine-vs-peft-") as tmp:
        pipeline = os.path.join(tmp, "bench.pbtxt")
        with open(pipeline, "w") as f:
            f.write(engine_pipeline(os.path.join(tmp, "out"), os.path.abspath(args.data), checkpoint,
                                    args, checkpointing, qlora))
        start = time.perf_counter()
        run = subprocess.run([args.engine, "run", pipeline], capture_output=True, text=True)
        wall = time.perf_counter() - start
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
            "final_loss": steps[-1]["metrics"]["loss"], "wall_s": wall}


def run_peft(args, checkpoint, checkpointing, qlora):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    start_wall = time.perf_counter()
    torch.manual_seed(1)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    kwargs = {}
    if qlora:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False, llm_int8_skip_modules=["lm_head"])
        kwargs["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa", use_cache=False,
                                                 **kwargs)
    if not qlora:
        model = model.to("cuda")
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
    ids = torch.randint(0, 256, (args.batch, args.seq), device="cuda")

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
              "peak_bytes": torch.cuda.max_memory_allocated(), "final_loss": loss.item(),
              "wall_s": time.perf_counter() - start_wall}
    del model, optimizer
    torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default=os.path.join(ROOT, "build", "bin", "engine"))
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
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
    parser.add_argument("--checkpoint-cache",
                        help="keep the random checkpoint in DIR/MODEL and reuse it if it is there")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles and allocates)")
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.checkpointing]
    kind = "qlora" if args.qlora else "lora"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-vs-peft-model-") as scratch:
        start = time.perf_counter()
        checkpoint, parameters = cached_checkpoint(args.model, args.checkpoint_cache or scratch)
        print(f"the checkpoint: {time.perf_counter() - start:.1f} s")
        print(f"{args.model} ({parameters / 1e9:.2f} B parameters, random, bf16), {kind}, batch "
              f"{args.batch} x {args.seq} tokens, LoRA r=16, {args.steps} steps after {args.warmup}")
        print(f"{'checkpointing':<14} {'side':<18} {'tokens/s':>10} {'peak GiB':>9} {'loss':>7} "
              f"{'wall s':>7}")
        for checkpointing in modes:
            sides = [("engine", lambda: run_engine(args, checkpoint, checkpointing, args.qlora))]
            if not args.engine_only:
                sides.append(("transformers+peft",
                              lambda: run_peft(args, checkpoint, checkpointing, args.qlora)))
            row = {"checkpointing": checkpointing, "kind": kind}
            for name, run in sides:
                row[name] = run()
                r = row[name]
                print(f"{'on' if checkpointing else 'off':<14} {name:<18} "
                      f"{r['tokens_per_s']:>10,.0f} {r['peak_bytes'] / 2**30:>9.2f} "
                      f"{r['final_loss']:>7.3f} {r['wall_s']:>7.1f}")
            if "transformers+peft" in row:
                engine, peft = row["engine"], row["transformers+peft"]
                row["speed_ratio"] = engine["tokens_per_s"] / peft["tokens_per_s"]
                row["memory_ratio"] = engine["peak_bytes"] / peft["peak_bytes"]
                print(f"{'':<14} {'engine / peft':<18} {row['speed_ratio']:>10.2f} "
                      f"{row['memory_ratio']:>9.2f}")
            rows.append(row)
    write_results(args, parameters, rows)



def write_results(args, parameters, rows):
    """The run's arguments, model parameters and rows, to --json when it is given."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "parameters": parameters, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
