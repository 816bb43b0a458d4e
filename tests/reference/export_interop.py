"""What the engine exports, read by the Hugging Face libraries themselves (transformers, PEFT), for
tests/e2e/export_interop_test.cc. Two commands, each one Python start:

    .venv/bin/python tests/reference/export_interop.py bases OUT_DIR VOCAB_SIZE
        A random base checkpoint per family (llama, mistral, qwen2, qwen3) in OUT_DIR/<family>,
        written by transformers' save_pretrained: the family fixtures' configs
        (tests/fixtures/hf/make_fixtures.py) with VOCAB_SIZE ids and its seeded O(1) weights.

    .venv/bin/python tests/reference/export_interop.py peft_adapter OUT_DIR BASE_DIR [saved]
        A LoRA adapter PEFT makes on BASE_DIR and saves in OUT_DIR, as a user who trained with
        PEFT has one: every linear layer of the decoder, r 4, lora_alpha 8, use_rslora, a
        rank_pattern and an alpha_pattern, lora_dropout 0.05, and random A and B (as if trained).
        With "saved": LoRA on q_proj and v_proj, bias "all" and modules_to_save ["model.norm"],
        the biases and the norm's weight moved at random (as if trained), so that PEFT saves them
        beside the adapters (q_proj's bias as "...q_proj.base_layer.bias").

    .venv/bin/python tests/reference/export_interop.py bnb4_source OUT_DIR BASE_DIR [double]
        BASE_DIR quantized to 4 bits by transformers + bitsandbytes on the CPU (NF4, f32 compute;
        with "double", double-quantized scales) and saved in OUT_DIR, as a hub's "-bnb-4bit"
        directory is.

    .venv/bin/python tests/reference/export_interop.py check CASES.json > RESULTS.json
        CASES.json: {"cases": [{"name", "base": DIR, "hf": DIR, "peft": DIR, "prompt": TEXT,
                                "max_new_tokens": N, "texts": [TEXT, ...], "logits": FILE,
                                "bnb4": DIR, "bnb4_double": DIR (a QLoRA stage's)}, ...]}
        For each case, RESULTS.json holds (or {"error": "..."}):
          hf_missing, hf_unexpected   the keys from_pretrained(hf, output_loading_info=True) reports
          peft_warnings               what PeftModel.from_pretrained(base, peft) warned
          peft_adapter_keys, peft_loaded_keys
                                      the adapter tensors the export holds, and those PEFT put into
                                      the model (as get_peft_model_state_dict names them)
          peft_vs_hf                  the largest |logit| difference between the PEFT model and the
                                      hf export on `texts` (a padded batch, f32), at real tokens
          hf_vs_base                  the same between the hf export and the base (adapters off)
          hf_greedy                   transformers' greedy continuation of `prompt` on the hf export
                                      (the ids after the prompt)
          hf_vs_engine                with "logits" (a file `engine eval --logits` wrote for the
                                      stage): the largest |logit| difference between the hf export
                                      on the file's inputs and the engine's logits, at real tokens
          positions_equal             (image-text) whether transformers' multimodal positions for
                                      the file's inputs are the engine's, at real tokens
        A case with "peft_source" (a PEFT adapter directory) and "logits" (of a stage that loaded
        it, before it learned anything) gives instead:
          peft_vs_engine              the largest |logit| difference between PEFT's model (the
                                      adapter on "base") and the engine's, on the file's inputs
          adapters_effect             the same between PEFT's model with and without the adapter
        A case with "bnb4_source" (a directory bnb4_source wrote), "logits" (of a stage that read
        it) and "hf" (that stage's hf export) gives instead:
          bnb4_source_layers          the Linear4bit layers transformers built from it
          bnb4_source_weights_vs_hf   the largest difference between a layer's weight as
                                      bitsandbytes dequantizes it and the hf export's
          bnb4_source_vs_engine       the largest |logit| difference between transformers' 4-bit
                                      model and the engine's, on the file's inputs
        A case with "kind": "image_text_logits", "hf" and "logits" (an image-text stage's, its
        eval batch with images or videos) gives hf_missing, hf_unexpected, hf_vs_engine and
        positions_equal only.
        A case with "image" and "prompt_text" (a Qwen2-VL or Qwen2.5-VL stage's) is checked through
        AutoModelForImageTextToText and the processor, the logits on the prompt with its image
        (with "bnb4", a QLoRA stage's, as below).
        And for a QLoRA stage (bnb4 given; PEFT's base is then the bnb4 export, loaded through
        bitsandbytes on the CPU):
          bnb4_missing, bnb4_unexpected
          bnb4_layers                 the Linear4bit layers bitsandbytes built
          bnb4_vs_hf                  the largest difference between a layer's weight as bitsandbytes
                                      dequantizes it and the hf export's weight less the adapters'
                                      product (lora_alpha / r * B A, from the peft export)
          bnb4_double_layers          the Linear4bit layers of the --double_quant export
          bnb4_double_nested          whether every layer of the --double_quant export has nested
                                      (double-quantized) scales in bitsandbytes
          bnb4_double_vs_bnb4         the largest difference between the two exports' dequantized
                                      weights, relative to the layer's largest weight
"""
import json
import pathlib
import sys
import traceback
import warnings

HERE = pathlib.Path(__file__).resolve().parent
FAMILIES = {"llama": "llama", "mistral": "mistral_sliding", "qwen2": "qwen2", "qwen3": "qwen3"}


def make_bases(out_dir, vocab_size):
    sys.path.insert(0, str(HERE.parent / "fixtures" / "hf"))
    import make_fixtures as fixtures

    for family, fixture in FAMILIES.items():
        spec = fixtures.SPECS[fixture]
        # Every linear layer's rows hold whole NF4 blocks of 64 (hidden 64, intermediate 128;
        # qwen3's 4 heads of 16): bitsandbytes 0.50's CPU kernel on an AVX-512 CPU dequantizes
        # rows narrower than a block wrongly (the fixtures' width of 32 reads up to 1.5 off).
        overrides = dict(spec["config"], vocab_size=vocab_size, max_position_embeddings=512,
                         hidden_size=64, intermediate_size=128, pad_token_id=vocab_size - 4,
                         bos_token_id=None, eos_token_id=vocab_size - 2)
        model = fixtures.build_model(spec["arch"], fixtures.make_config(spec["arch"], overrides))
        fixtures.randomize(model)
        directory = pathlib.Path(out_dir) / family
        model.save_pretrained(directory)
        (directory / "generation_config.json").unlink(missing_ok=True)
        print(f"{family}: {directory}")


PEFT_SOURCE = dict(r=4, lora_alpha=8, lora_dropout=0.05, use_rslora=True,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                   "down_proj"],
                   # In sorted order, as PEFT saves them, so that creating and loading pick the
                   # same first match: layer 1's k_proj takes "k_proj", not its own key.
                   rank_pattern={"k_proj": 3, "layers.1.mlp.down_proj": 6,
                                 "layers.1.self_attn.k_proj": 5, "self_attn.q_proj": 2},
                   alpha_pattern={"v_proj": 3.0}, init_lora_weights=False)


def auto_class(directory):
    """transformers' class for a base directory: image-text for a config with a vision tower."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = json.loads((pathlib.Path(directory) / "config.json").read_text())
    return AutoModelForImageTextToText if "vision_config" in config else AutoModelForCausalLM


PEFT_SAVED = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], bias="all",
                  modules_to_save=["model.norm"], init_lora_weights=False)


def make_peft_adapter(out_dir, base_dir, variant=None):
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(7)
    base = auto_class(base_dir).from_pretrained(base_dir, dtype=torch.float32)
    config = PEFT_SAVED if variant == "saved" else PEFT_SOURCE
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **config))
    if variant == "saved":
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if parameter.requires_grad and "lora_" not in name:
                    parameter.add_(torch.randn_like(parameter) * 0.5)
    model.save_pretrained(out_dir)
    print(f"peft adapter: {out_dir}")


def make_bnb4_source(out_dir, base_dir, double=None):
    import torch
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=double == "double",
                                      bnb_4bit_compute_dtype=torch.float32)
    model = auto_class(base_dir).from_pretrained(base_dir, quantization_config=quantization,
                                                 dtype=torch.float32, device_map="cpu")
    model.save_pretrained(out_dir)
    print(f"bnb4 source: {out_dir}")


def check_bnb4_source(case):
    """transformers + bitsandbytes on a 4-bit directory, against a stage that read it."""
    import bitsandbytes.functional as bnb
    import torch
    from safetensors.torch import load_file

    model = bitsandbytes_4bit(auto_class(case["bnb4_source"]).from_pretrained(
        case["bnb4_source"], device_map="cpu", attn_implementation="eager").eval())
    hf = load_file(pathlib.Path(case["hf"]) / "model.safetensors")
    layers = four_bit_layers(model)
    worst = 0.0
    for name, module in layers.items():
        dense = bnb.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
        worst = max(worst, (dense - hf[f"{name}.weight"].float()).abs().max().item())
    saved = load_file(case["logits"])
    mask = saved["attention_mask"]
    with torch.no_grad():
        theirs = model(**model_inputs(model, saved)).logits.float()
    return {"bnb4_source_layers": len(layers), "bnb4_source_weights_vs_hf": worst,
            "bnb4_source_vs_engine": real_max_abs_diff(theirs, saved["logits"], mask)}


def check_peft_source(case):
    """PEFT's own model with the adapter it saved, on the inputs of the engine's logits file."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    saved = load_file(case["logits"])
    base = auto_class(case["base"]).from_pretrained(case["base"], dtype=torch.float32,
                                                    attn_implementation="eager")
    peft = PeftModel.from_pretrained(base, case["peft_source"]).eval()
    mask = saved["attention_mask"]
    inputs = model_inputs(base, saved)
    with torch.no_grad():
        theirs = peft(**inputs).logits
        with peft.disable_adapter():
            plain = peft(**inputs).logits
    return {"peft_vs_engine": real_max_abs_diff(theirs, saved["logits"], mask),
            "adapters_effect": real_max_abs_diff(theirs, plain, mask)}


def real_max_abs_diff(a, b, mask):
    return (a - b).abs().amax(-1).masked_select(mask.bool()).max().item()


def load_hf(auto_class, directory, result):
    """The hf export in f32, with from_pretrained's missing and unexpected keys in `result`."""
    import torch

    model, info = auto_class.from_pretrained(directory, dtype=torch.float32,
                                             output_loading_info=True, attn_implementation="eager")
    result["hf_missing"] = sorted(info["missing_keys"])
    result["hf_unexpected"] = sorted(info["unexpected_keys"])
    return model.eval()


def check_peft(hf, base, peft_dir, inputs, result):
    """PEFT's adapters from `peft_dir` on `base`: the warnings, the keys, and the logits on `inputs`
    against the hf export's, with the adapters on and off."""
    import torch
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict, load_peft_weights

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft = PeftModel.from_pretrained(base, peft_dir).eval()
    result["peft_warnings"] = [str(w.message) for w in caught]
    result["peft_adapter_keys"] = sorted(load_peft_weights(peft_dir).keys())
    result["peft_loaded_keys"] = sorted(get_peft_model_state_dict(peft).keys())
    mask = inputs["attention_mask"]
    with torch.no_grad():
        theirs = hf(**inputs).logits
        adapters = peft(**inputs).logits
        with peft.disable_adapter():
            plain = peft(**inputs).logits
    result["peft_vs_hf"] = real_max_abs_diff(adapters, theirs, mask)
    result["hf_vs_base"] = real_max_abs_diff(plain, theirs, mask)


def model_inputs(model, saved):
    """The inputs of an `engine eval --logits` file as `model` takes them: text models get the
    engine's positions; image-text models get the images and videos (Qwen2.5-VL's with their
    second_per_grid_ts) and work out their own multimodal positions from the image and video tokens
    (mm_token_type_ids: 1 and 2) and grids."""
    inputs = {"input_ids": saved["input_ids"], "attention_mask": saved["attention_mask"]}
    if "image_grid_thw" not in saved and "video_grid_thw" not in saved:
        inputs["position_ids"] = saved["position_ids"]
        return inputs
    kinds = (saved["input_ids"] == model.config.image_token_id).int()
    if "image_grid_thw" in saved:
        inputs.update(pixel_values=saved["pixel_values"], image_grid_thw=saved["image_grid_thw"])
    if "video_grid_thw" in saved:
        kinds += 2 * (saved["input_ids"] == model.config.video_token_id).int()
        inputs.update(pixel_values_videos=saved["pixel_values_videos"],
                      video_grid_thw=saved["video_grid_thw"])
        if model.config.model_type == "qwen2_5_vl":
            inputs["second_per_grid_ts"] = saved["second_per_grid_ts"]
    inputs["mm_token_type_ids"] = kinds
    return inputs


def check_engine_logits(hf, path, result):
    """The hf export on the inputs of an `engine eval --logits` file, against its logits: text
    models are given the engine's positions; image-text models work out their own multimodal
    positions (from the image tokens and grids), which are compared with the engine's."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(path)
    mask = saved["attention_mask"]
    inputs = model_inputs(hf, saved)
    if "mm_token_type_ids" in inputs:
        grids = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
                 if k in inputs}
        positions, _ = hf.model.get_rope_index(
            inputs["input_ids"], inputs["mm_token_type_ids"], attention_mask=mask, **grids)
        real = mask.bool().unsqueeze(0).expand_as(positions)
        result["positions_equal"] = bool(
            positions.masked_select(real).equal(saved["position_ids"].masked_select(real)))
    with torch.no_grad():
        theirs = hf(**inputs).logits
    result["hf_vs_engine"] = real_max_abs_diff(theirs, saved["logits"], mask)


def four_bit_layers(model):
    return {name: module for name, module in model.named_modules()
            if hasattr(module, "weight") and hasattr(module.weight, "quant_state")}


def bitsandbytes_4bit(model):
    """`model` (4-bit layers from bitsandbytes) computing as bitsandbytes does on every CPU and GPU.
    On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a layer's codes at its first forward
    without gradients and rounds its scales to bf16 (Linear4bit.forward,
    _convert_weight_packed_for_cpu): an f32 reference would no longer be one, and layers narrower
    than a block (these tests' tiny models) fail to repack ("shape '[32, 0]' is invalid")."""
    for module in four_bit_layers(model).values():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


def check_bnb4(case, hf, result):
    """bitsandbytes reads both bnb4 exports; returns the plain one as PEFT's base."""
    import bitsandbytes.functional as bnb
    import torch
    from safetensors.torch import load_file

    model, info = auto_class(case["bnb4"]).from_pretrained(
        case["bnb4"], device_map="cpu", output_loading_info=True, attn_implementation="eager")
    bitsandbytes_4bit(model)
    result["bnb4_missing"] = sorted(info["missing_keys"])
    result["bnb4_unexpected"] = sorted(info["unexpected_keys"])
    adapters = load_file(pathlib.Path(case["peft"]) / "adapter_model.safetensors")
    config = json.loads((pathlib.Path(case["peft"]) / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    layers = four_bit_layers(model)
    result["bnb4_layers"] = len(layers)
    worst = 0.0
    for name, module in layers.items():
        dense = bnb.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
        a = adapters[f"base_model.model.{name}.lora_A.weight"].float()
        b = adapters[f"base_model.model.{name}.lora_B.weight"].float()
        merged = hf.get_submodule(name).weight.float()
        worst = max(worst, (dense - (merged - scale * (b @ a))).abs().max().item())
    result["bnb4_vs_hf"] = worst
    double = bitsandbytes_4bit(auto_class(case["bnb4_double"]).from_pretrained(
        case["bnb4_double"], device_map="cpu"))
    nested, relative = True, 0.0
    double_layers = four_bit_layers(double)
    result["bnb4_double_layers"] = len(double_layers)
    for name, module in double_layers.items():
        state = module.weight.quant_state
        nested = nested and bool(state.nested)
        dense = bnb.dequantize_4bit(module.weight.data, state).float()
        plain = layers[name]
        exact = bnb.dequantize_4bit(plain.weight.data, plain.weight.quant_state).float()
        relative = max(relative, ((dense - exact).abs().max() / exact.abs().max()).item())
    result["bnb4_double_nested"] = nested
    result["bnb4_double_vs_bnb4"] = relative
    return model


def peft_base(case, hf, result):
    """The base PEFT's adapters go on: a QLoRA stage's bnb4 export (checked on the way), else the
    dense base in f32."""
    import torch

    if "bnb4" in case:
        return check_bnb4(case, hf, result)
    return auto_class(case["base"]).from_pretrained(case["base"], dtype=torch.float32,
                                                    attn_implementation="eager")


def check_image_text(case):
    """A Qwen2-VL, Qwen2.5-VL or Qwen3-VL stage's exports: hf loaded by AutoModelForImageTextToText,
    and its greedy continuation of `prompt_text` (the engine's rendering, image placeholders
    included) about `image`, through transformers 5's default processor read from the export (the
    families use Qwen2VLImageProcessor, Qwen3-VL's with its own patch size, mean and std; their
    processors differ only for videos); peft on the base."""
    import torch
    from PIL import Image
    from transformers import (AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    result = {}
    hf = load_hf(AutoModelForImageTextToText, case["hf"], result)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor.from_pretrained(case["hf"]),
                                 tokenizer=AutoTokenizer.from_pretrained(case["hf"]),
                                 video_processor=Qwen2VLVideoProcessor())
    inputs = processor(text=[case["prompt_text"]], images=[Image.open(case["image"])],
                       return_tensors="pt")
    with torch.no_grad():
        generated = hf.generate(**inputs, max_new_tokens=case["max_new_tokens"], do_sample=False)
    result["hf_greedy"] = generated[0, inputs["input_ids"].shape[1]:].tolist()
    if "logits" in case:
        check_engine_logits(hf, case["logits"], result)
    check_peft(hf, peft_base(case, hf, result), case["peft"], inputs, result)
    return result


def check_image_text_logits(case):
    """An image-text stage's hf export, loaded by AutoModelForImageTextToText, on the inputs of its
    `engine eval --logits` file (images and videos)."""
    from transformers import AutoModelForImageTextToText

    result = {}
    hf = load_hf(AutoModelForImageTextToText, case["hf"], result)
    check_engine_logits(hf, case["logits"], result)
    return result


def check(case):
    if case.get("kind") == "image_text_logits":
        return check_image_text_logits(case)
    if "peft_source" in case:
        return check_peft_source(case)
    if "bnb4_source" in case:
        return check_bnb4_source(case)
    if "image" in case:
        return check_image_text(case)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = {}
    hf = load_hf(AutoModelForCausalLM, case["hf"], result)
    if "logits" in case:
        check_engine_logits(hf, case["logits"], result)
    base = peft_base(case, hf, result)
    tokenizer = AutoTokenizer.from_pretrained(case["hf"])
    tokenizer.padding_side = "right"
    batch = tokenizer(case["texts"], return_tensors="pt", padding=True)
    check_peft(hf, base, case["peft"], batch, result)

    prompt = tokenizer(case["prompt"], return_tensors="pt")
    with torch.no_grad():
        generated = hf.generate(**prompt, max_new_tokens=case["max_new_tokens"], do_sample=False)
    result["hf_greedy"] = generated[0, prompt["input_ids"].shape[1]:].tolist()
    return result


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "bases":
        make_bases(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) in (4, 5) and sys.argv[1] == "peft_adapter":
        make_peft_adapter(*sys.argv[2:])
        return
    if len(sys.argv) in (4, 5) and sys.argv[1] == "bnb4_source":
        make_bnb4_source(*sys.argv[2:])
        return
    if len(sys.argv) != 3 or sys.argv[1] != "check":
        sys.exit(__doc__)
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    results = []
    for case in cases:
        try:
            results.append(check(case))
        except Exception as error:  # noqa: BLE001 - every failure is a result to report
            traceback.print_exc()  # where it failed, for whoever reads the test's output
            results.append({"error": f"{type(error).__name__}: {error}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
