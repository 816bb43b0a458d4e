#!/usr/bin/env python3
"""Loads `engine export`'s three formats with the libraries users deploy with, and compares.

Run where transformers, peft and (for bnb4, on a CUDA machine) bitsandbytes are installed, as on the
project's GPU machine, after building the engine there:

  python3 scripts/check_exports.py --engine build/bin/engine --source PIPELINE.pbtxt:STAGE \
      --workdir /tmp/exports [--prompt "Hello"]

For a stage with adapters on NF4 layers (a QLoRA stage) it runs `engine export` into
WORKDIR/{hf,peft,bnb4,bnb4_double} (the last with --double_quant), then:
  - hf:   AutoModelForCausalLM.from_pretrained(hf) in f32 and the engine reading the same directory
          (`engine generate hf --raw`) must give the same greedy ids;
  - bnb4: from_pretrained(bnb4) loads (bitsandbytes' own deserialization), and each 4-bit layer
          dequantized by bitsandbytes equals the hf export's weight minus the adapters' product
          (from the peft export) within 1e-5;
  - peft: PeftModel.from_pretrained(base=bnb4 model, peft) loads every adapter (no missing or
          unexpected keys) and its greedy ids are printed beside `engine generate SOURCE`'s (the
          stage computes in its own precision; equality is reported, not required).
Prints one line per check, "ok" or "FAIL: why", and exits 1 when one fails. Nothing here is a
reference implementation: every number compared comes from transformers, PEFT or bitsandbytes.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path


def engine(args, engine_bin):
    done = subprocess.run([engine_bin] + args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"engine {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def engine_greedy(engine_bin, source, prompt, tokens):
    out = engine(["generate", source, "--raw", f"--prompt={prompt}",
                  f"--max_new_tokens={tokens}", "--format=json"], engine_bin)
    return json.loads(out)["outputs"][0]["ids"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True)
    parser.add_argument("--source", required=True, help="PIPELINE.pbtxt:STAGE of a QLoRA stage")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    dirs = {fmt: work / fmt for fmt in ("hf", "peft", "bnb4")}
    for fmt, to in dirs.items():
        if not to.exists():
            engine(["export", args.source, f"--to={to}", f"--format={fmt}"], args.engine)
    double = work / "bnb4_double"
    if not double.exists():
        engine(["export", args.source, f"--to={double}", "--format=bnb4", "--double_quant"],
               args.engine)
    failures = 0

    def report(name, ok, why=""):
        nonlocal failures
        print(f"{name}: {'ok' if ok else 'FAIL: ' + why}")
        failures += 0 if ok else 1

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    tokenizer = AutoTokenizer.from_pretrained(dirs["hf"])
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids

    hf = AutoModelForCausalLM.from_pretrained(dirs["hf"], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=args.tokens, do_sample=False)[0, ids.shape[1]:]
    ours = engine_greedy(args.engine, str(dirs["hf"]), args.prompt, args.tokens)
    report("hf greedy ids equal", theirs.tolist()[:len(ours)] == ours,
           f"transformers {theirs.tolist()} engine {ours}")

    if torch.cuda.is_available():
        bnb = AutoModelForCausalLM.from_pretrained(dirs["bnb4"], device_map="cuda").eval()
        import bitsandbytes.functional as F
        from safetensors.torch import load_file
        adapters = load_file(dirs["peft"] / "adapter_model.safetensors")
        peft_config = json.loads((dirs["peft"] / "adapter_config.json").read_text())
        scale = peft_config["lora_alpha"] / peft_config["r"]
        checked = 0
        for name, module in bnb.named_modules():
            if not (hasattr(module, "weight") and hasattr(module.weight, "quant_state")):
                continue
            dense = F.dequantize_4bit(module.weight.data, module.weight.quant_state).float().cpu()
            a = adapters.get(f"base_model.model.{name}.lora_A.weight")
            b = adapters.get(f"base_model.model.{name}.lora_B.weight")
            base = hf.get_submodule(name).weight.float()
            if a is not None and b is not None:
                base = base - scale * (b.float() @ a.float())
            error = (dense - base).abs().max().item()
            report(f"bnb4 {name} dequantizes to the stage's 4-bit weight", error < 1e-5,
                   f"max difference {error}")
            checked += 1
        report("bnb4 has 4-bit layers", checked > 0, "bitsandbytes loaded no Linear4bit")
        # --double_quant: bitsandbytes reads the nested state and dequantizes within about 1% of
        # each block's scale spread of the plain export.
        nested = AutoModelForCausalLM.from_pretrained(double, device_map="cuda").eval()
        for name, module in nested.named_modules():
            if not (hasattr(module, "weight") and hasattr(module.weight, "quant_state")):
                continue
            state = module.weight.quant_state
            report(f"bnb4 --double_quant {name} loads nested", bool(state.nested))
            dense = F.dequantize_4bit(module.weight.data, state).float()
            plain = bnb.get_submodule(name)
            exact = F.dequantize_4bit(plain.weight.data, plain.weight.quant_state).float()
            relative = ((dense - exact).abs().max() / exact.abs().max()).item()
            report(f"bnb4 --double_quant {name} within 1% of the plain export", relative < 0.01,
                   f"relative difference {relative}")
        from peft import PeftModel
        peft_model = PeftModel.from_pretrained(bnb, dirs["peft"]).eval()
        with torch.no_grad():
            peft_ids = peft_model.generate(ids.cuda(), max_new_tokens=args.tokens,
                                           do_sample=False)[0, ids.shape[1]:].tolist()
        stage_ids = engine_greedy(args.engine, args.source, args.prompt, args.tokens)
        print(f"peft on bnb4 greedy ids {peft_ids}; the stage's {stage_ids} "
              f"({'equal' if peft_ids[:len(stage_ids)] == stage_ids else 'different'})")
    else:
        print("bnb4, peft: skipped (bitsandbytes needs a CUDA device)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
