#!/usr/bin/env python3
"""Recipe r3's two stages at Qwen2-VL-2B's real shape, the engine against transformers + PEFT on
one GPU: load time, step time, tokens/s and peak GPU memory of each stage, and their ratios.

    python3 bench/gpu_vl_vs_peft.py --engine build/bin/engine [--model qwen2-vl-2b|tiny]
        [--batch 8] [--image-size 448] [--steps 5] [--warmup 2] [--stages vision,llm]
        [--device cuda] [--checkpoint-cache DIR] [--json FILE]

transformers writes one checkpoint from Qwen2-VL-2B-Instruct's config.json (its values below; no
downloads) with random weights in bf16; both sides load it. The data: --batch conversations
"<image>What digit is this?" -> "seven" over random --image-size x --image-size RGB images (448 x
448: 1024 patches, 256 image tokens each), as many again for the eval split. The tokenizer is the
byte-level BPE of tests/fixtures/tokenizers/qwen2_vl_bpe.json with its special tokens moved to
Qwen2-VL's ids (<|image_pad|> 151655 ...), Qwen2-VL's chat template and image processor
(pipelines/qwen2_vl_tiny). The two stages, as pipelines/qwen2_vl_r3.pbtxt trains them, each from
the same random checkpoint:
  vision  the vision tower and merger train in full (675 M of the 2.2 B parameters), the decoder
          frozen, gradient checkpointing on;
  llm     the decoder's linear layers in NF4 (blocks of 64, no double quantization) under LoRA r=16
          (alpha 32) on q/k/v/o/gate/up/down, the merger training, the vision blocks frozen.
Both sides: bf16-mixed (f32 weights, products in bf16: the engine's bf16-mixed, torch.autocast on
transformers' side), AdamW (lr 2e-4, weight decay 0.01; fused on transformers' side), SDPA
attention; transformers' QLoRA is BitsAndBytesConfig (NF4, bf16 compute, no double quantization,
the vision tower and lm_head left dense) with PEFT.

  engine:  `engine run` of the stage; load seconds from the process's start to its stage_begin
           event, step seconds and peak memory from the step_end lines of metrics.jsonl after
           --warmup steps. Then `engine eval --logits --split=train` writes the batch exactly as
           the model took it (ids, labels, pixels, grids), which transformers trains on.
  peft:    from_pretrained (+ get_peft_model), in this process; load seconds until the model is on
           the device, step seconds over --steps steps after --warmup, torch.cuda.max_memory_allocated.

`--model tiny --device cpu` (pipelines/qwen2_vl_tiny's config) is the smoke test that runs anywhere.
Needs transformers, peft and bitsandbytes in its Python.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from gpu_vs_peft import cached_checkpoint, save_random_model, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_VL = os.path.join(ROOT, "pipelines", "qwen2_vl_tiny")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "qwen2_vl_bpe.json")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 2e-4
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# Qwen2-VL-2B-Instruct's config.json on the hub.
QWEN2_VL_2B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
    rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False, sliding_window=32768,
    max_window_layers=28, tie_word_embeddings=True, attention_dropout=0.0, bos_token_id=151643,
    eos_token_id=151645, vision_start_token_id=151652, vision_end_token_id=151653,
    vision_token_id=151654, image_token_id=151655, video_token_id=151656,
    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    vision_config=dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, in_chans=3,
                       hidden_size=1536, patch_size=14, spatial_merge_size=2,
                       spatial_patch_size=14, temporal_patch_size=2))
# The fixture tokenizer's special tokens and the ids Qwen2-VL's vocabulary gives them.
QWEN2_VL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655,
                "<|video_pad|>": 151656}


def say(text):
    print(text, flush=True)


# --- What both sides share ----------------------------------------------------------------------

def write_tokenizer(path, real_ids):
    with open(TOKENIZER, encoding="utf-8") as f:
        tokenizer = json.load(f)
    if real_ids:
        for token in tokenizer["added_tokens"]:
            token["id"] = QWEN2_VL_IDS[token["content"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f)


def write_checkpoint(name, directory):
    """The model's config with random weights in bf16, with the tokenizer, its config and the image
    processor's beside them. Returns the parameter count."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    if name == "tiny":
        config = AutoConfig.from_pretrained(TINY_VL)
    else:
        config = AutoConfig.for_model("qwen2_vl", **QWEN2_VL_2B)
    parameters = save_random_model(AutoModelForImageTextToText, config, directory)
    write_tokenizer(os.path.join(directory, "tokenizer.json"), real_ids=name != "tiny")
    for file in ("tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(os.path.join(TINY_VL, file), os.path.join(directory, file))
    return parameters


def write_conversations(directory, count, size):
    """`count` digit questions over random size x size RGB images (seed 3), as a chat JSONL."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(3)
    os.makedirs(os.path.join(directory, "images"), exist_ok=True)
    path = os.path.join(directory, "conversations.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            image = f"images/{i:04d}.png"
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(directory, image))
            out.write(json.dumps({
                "messages": [{"role": "user", "content": "<image>What digit is this?"},
                             {"role": "assistant", "content": DIGITS[i % 10]}],
                "images": [image]}) + "\n")
    return path


def max_length_for(size):
    """Image tokens (one per 28 x 28 pixels) and the template's text, with room to spare."""
    return (size // 28) ** 2 + 64


# --- The engine's side --------------------------------------------------------------------------

def engine_pipeline(out_dir, checkpoint, data, args, stage):
    quantizer, adapter = "", ""
    if stage == "vision":
        trainable = 'include: "visual.*"'
        checkpointing = "true"
    else:
        quantizer = ('  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.'
                     'Nf4Options] { target_modules: "model.layers.*" double_quant: false } } }\n')
        adapter = ('  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.'
                   'LoraOptions] { r: 16 lora_alpha: 32 target_modules: "model.layers.*" } } }\n')
        trainable = 'include: "*.lora_A.*" include: "*.lora_B.*" include: "visual.merger.*"'
        checkpointing = "false"
    return f"""output_dir: "{out_dir}"
seed: 1
stage {{
  name: "{stage}"
  model {{ plugin: "qwen2_vl" options {{ [type.googleapis.com/engine.transformer.Qwen2VlOptions] {{
    pretrained: "{checkpoint}" gradient_checkpointing: {checkpointing} }} }} }}
{quantizer}{adapter}  trainable {{ {trainable} }}
  data {{ plugin: "chat" options {{ [type.googleapis.com/engine.plugins.ChatOptions] {{
    path: "{data}" max_length: {max_length_for(args.image_size)} eval_fraction: 0.5
    tokenizer {{ kind: HF_JSON path: "{checkpoint}/tokenizer.json"
                config: "{checkpoint}/tokenizer_config.json" }}
    images {{ processor: "{checkpoint}/preprocessor_config.json" }} }} }} }}
  precision {{ plugin: "bf16-mixed" }}
  optimizer {{ adamw {{ weight_decay: 0.01 }} learning_rate: {LEARNING_RATE} }}
  schedule {{ max_steps: {args.warmup + args.steps} batch_size: {args.batch}
              eval_batch_size: {args.batch} }}
  checkpoint {{ save_optimizer_state: false }}
  parallel {{ device: "{args.device}" }}
  callback {{ plugin: "metrics_jsonl" }}
}}
"""


def run_tool(args, what, command):
    run = subprocess.run([args.engine] + command, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"engine {what} failed ({run.returncode}):\n{run.stdout[-2000:]}"
                 f"{run.stderr[-3000:]}")
    return run.stdout


def run_engine(args, pipeline, out_dir, stage, inputs_file):
    """Trains the stage, then writes the training batch as the model took it to `inputs_file`."""
    start_epoch, start = time.time(), time.perf_counter()
    run_tool(args, "run", ["run", pipeline])
    wall = time.perf_counter() - start
    steps, begin = [], None
    with open(os.path.join(out_dir, stage, "metrics.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("event") == "stage_begin":
                begin = event
            if event.get("event") == "step_end":
                steps.append(event)
    if len(steps) != args.warmup + args.steps or begin is None:
        sys.exit(f"engine: {len(steps)} step_end lines and {'a' if begin else 'no'} stage_begin, "
                 f"expected {args.warmup + args.steps} and one")
    run_tool(args, "eval --logits", ["eval", pipeline, f"--logits={inputs_file}", "--split=train",
                                     f"--examples={args.batch}"])
    return {"load_s": begin["time"] - start_epoch,
            "step_s": (steps[-1]["time"] - steps[args.warmup - 1]["time"]) / args.steps,
            "peak_bytes": max(s.get("cuda_peak_allocated_bytes", 0) for s in steps),
            "final_loss": steps[-1]["metrics"]["loss"], "wall_s": wall}


# --- transformers + PEFT's side -----------------------------------------------------------------

def training_batch(inputs_file, config, device):
    """The engine's batch, as transformers 5 takes it (mm_token_type_ids marks the image tokens,
    from which it computes the multimodal positions)."""
    from safetensors.torch import load_file

    saved = load_file(inputs_file)
    batch = {name: saved[name] for name in ("input_ids", "attention_mask", "labels",
                                            "pixel_values", "image_grid_thw")}
    batch["mm_token_type_ids"] = (batch["input_ids"] == config.image_token_id).int()
    return {name: value.to(device) for name, value in batch.items()}


def peft_model(checkpoint, stage, device):
    import torch
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    kwargs = {}
    if stage == "llm":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False,
            bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=["lm_head", "model.visual"])
        kwargs["device_map"] = {"": device}
    model = AutoModelForImageTextToText.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="sdpa", **kwargs)
    model.config.use_cache = False
    if stage == "vision":
        model = model.to(device)
        for name, p in model.named_parameters():
            p.requires_grad_(".visual." in f".{name}")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model
    import bitsandbytes
    from peft import LoraConfig, get_peft_model

    # The engine's nf4 quantizes the decoder layers only (target_modules "model.layers.*").
    outside = [name for name, module in model.named_modules()
               if isinstance(module, bitsandbytes.nn.Linear4bit) and
               (".layers." not in name or "visual" in name)]
    if outside:
        sys.exit(f"bitsandbytes quantized layers the engine does not: {outside[:3]}")
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
    model = get_peft_model(model, lora)
    for name, p in model.named_parameters():
        if ".visual.merger." in name:
            p.requires_grad_(True)
    return model


def run_peft(args, checkpoint, stage, inputs_file):
    import torch

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    model = peft_model(checkpoint, stage, args.device)
    if cuda:
        torch.cuda.synchronize()
    load = time.perf_counter() - start
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.01, fused=True)
    batch = training_batch(inputs_file, model.config, args.device)
    device_type = "cuda" if cuda else "cpu"

    def step():
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    result = {"load_s": load, "step_s": (time.perf_counter() - begin) / args.steps,
              "peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
              "final_loss": loss.item(), "wall_s": time.perf_counter() - start,
              "positions": int(batch["input_ids"].numel())}
    del model, optimizer, batch
    if cuda:
        torch.cuda.empty_cache()
    return result


# --- The run ------------------------------------------------------------------------------------

def print_side(stage, name, r, positions):
    say(f"{stage:<7} {name:<18} {r['load_s']:>7.1f} {r['step_s']:>7.3f} "
        f"{positions / r['step_s']:>10,.0f} {r['peak_bytes'] / 2**30:>9.2f} {r['final_loss']:>7.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default=os.path.join(ROOT, "build", "bin", "engine"))
    parser.add_argument("--model", choices=["qwen2-vl-2b", "tiny"], default="qwen2-vl-2b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--stages", default="vision,llm")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--checkpoint-cache",
                        help="keep the random checkpoint in DIR/MODEL and reuse it if it is there")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles and allocates)")
    if args.image_size % 28 != 0:
        parser.error("--image-size must be a multiple of 28 (the processor would resize it)")
    stages = args.stages.split(",")
    if not set(stages) <= {"vision", "llm"}:
        parser.error("--stages takes vision and llm")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-vl-vs-peft-") as tmp:
        start = time.perf_counter()
        checkpoint, parameters = cached_checkpoint(args.model, args.checkpoint_cache or tmp,
                                                   write_checkpoint)
        data = write_conversations(os.path.join(tmp, "data"), 2 * args.batch, args.image_size)
        say(f"{args.model} ({parameters / 1e9:.2f} B parameters, random, bf16 on disk), batch "
            f"{args.batch} of one {args.image_size}x{args.image_size} image and a question, "
            f"bf16-mixed, {args.steps} steps after {args.warmup}; the checkpoint and data took "
            f"{time.perf_counter() - start:.1f} s")
        say(f"{'stage':<7} {'side':<18} {'load s':>7} {'step s':>7} {'tokens/s':>10} "
            f"{'peak GiB':>9} {'loss':>7}")
        for stage in stages:
            out_dir = os.path.join(tmp, "out")
            pipeline = os.path.join(tmp, f"{stage}.pbtxt")
            with open(pipeline, "w") as f:
                f.write(engine_pipeline(out_dir, checkpoint, data, args, stage))
            inputs_file = os.path.join(tmp, f"{stage}_inputs.safetensors")
            engine = run_engine(args, pipeline, out_dir, stage, inputs_file)
            peft = run_peft(args, checkpoint, stage, inputs_file)
            os.remove(inputs_file)
            shutil.rmtree(out_dir)
            positions = peft["positions"]
            print_side(stage, "engine", engine, positions)
            print_side(stage, "transformers+peft", peft, positions)
            row = {"stage": stage, "positions": positions, "engine": engine,
                   "transformers+peft": peft, "speed_ratio": peft["step_s"] / engine["step_s"],
                   "load_ratio": engine["load_s"] / peft["load_s"]}
            if peft["peak_bytes"]:
                row["memory_ratio"] = engine["peak_bytes"] / peft["peak_bytes"]
            say(f"{'':<7} {'engine / peft':<18} {row['load_ratio']:>7.2f} {'':>7} "
                f"{row['speed_ratio']:>10.2f} {row.get('memory_ratio', float('nan')):>9.2f}")
            rows.append(row)
    write_results(args, parameters, rows)


if __name__ == "__main__":
    main()
