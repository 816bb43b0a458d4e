"""The small LM's training tokens/s in the engine against Python PyTorch eager, in one run.

    .venv/bin/python bench/lm_vs_pytorch.py [--build build] [--steps 60] [--repeats 2]
    scripts/setup.sh bench        # sets up .venv, builds, runs this

Both sides train the model of pipelines/lm_fortunes.pbtxt (Llama layout: hidden 128, 2 layers,
4 query and 2 key/value heads, SwiGLU 352, tied embeddings, byte vocabulary of 259) on batches of
32 x 128 byte tokens of data/fortunes.txt, with AdamW (lr 0.003, weight decay 0.01) and gradient
clipping at norm 1.0, for --steps steps:

  engine:  build/bin/lm_step_bench, i.e. `engine run`'s path (plan, text loader, llama plugin,
           precision policy, optimizer, clipping), timed over the training steps alone;
  pytorch: the same forward written in eager PyTorch (the project's .venv, the same torch 2.11
           whose LibTorch the engine links), the same step, timed the same way.

Each precision runs both sides --repeats times, alternating, and keeps each side's best. The
ratio is engine tokens/s over PyTorch tokens/s: above 1.00 the engine is faster. Both use every
core: the engine's thread count is given to PyTorch. The engine also applies its allocator settings (engine/src/core/allocator.h),
which are part of what it is.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("lm_vs_pytorch.py needs torch: run it with the project's .venv/bin/python "
             "(scripts/setup.sh build makes it)")

VOCAB, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 259, 128, 352, 4, 2
EPS, THETA = 1e-6, 10000.0


class RmsNorm(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))

    def forward(self, x):
        f = x.float()
        return self.weight * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rotary(x):
    positions, dim = x.shape[2], x.shape[3]
    inv_freq = 1.0 / THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    first, second = x[..., : dim // 2], x[..., dim // 2:]
    return x * cos + torch.cat([-second, first], -1) * sin


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        d = HIDDEN // HEADS
        self.input_layernorm = RmsNorm(HIDDEN)
        self.q_proj = torch.nn.Linear(HIDDEN, HEADS * d, bias=False)
        self.k_proj = torch.nn.Linear(HIDDEN, KV_HEADS * d, bias=False)
        self.v_proj = torch.nn.Linear(HIDDEN, KV_HEADS * d, bias=False)
        self.o_proj = torch.nn.Linear(HEADS * d, HIDDEN, bias=False)
        self.post_attention_layernorm = RmsNorm(HIDDEN)
        self.gate_proj = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = torch.nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def attention(self, x):
        b, t, _ = x.shape
        d = HIDDEN // HEADS
        q = self.q_proj(x).view(b, t, HEADS, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, d).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        groups = HEADS // KV_HEADS
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        mask = torch.arange(t).unsqueeze(0) > torch.arange(t).unsqueeze(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype)
        return self.o_proj(torch.matmul(probs, v).transpose(1, 2).reshape(b, t, HEADS * d))

    def forward(self, x):
        h = x + self.attention(self.input_layernorm(x))
        m = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


class Llama(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))
        self.norm = RmsNorm(HIDDEN)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return torch.matmul(self.norm(h), self.embed_tokens.weight.t())  # tied lm_head


def byte_batches(path, batch, seq, steps):
    """Windows of seq + 1 bytes from the fortunes (bos 256 / eos 257 around each fortune)."""
    with open(path, "rb") as f:
        raw = f.read()
    ids = []
    for doc in raw.split(b"\n%\n"):
        ids.append(256)
        ids.extend(doc)
        ids.append(257)
    data = torch.tensor(ids, dtype=torch.long)
    g = torch.Generator().manual_seed(11)
    starts = torch.randint(0, data.numel() - seq - 1, (steps, batch), generator=g)
    return [torch.stack([data[s: s + seq + 1] for s in row.tolist()]) for row in starts]


def pytorch_tokens_per_s(args, precision):
    torch.manual_seed(0)
    model = Llama(args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
    batches = byte_batches(args.data, args.batch, args.seq, args.steps)
    autocast = precision == "bf16-mixed"
    start = time.perf_counter()
    for window in batches:
        inputs, targets = window[:, :-1], window[:, 1:]
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()  # the engine reads the loss every step too
    seconds = time.perf_counter() - start
    return args.steps * args.batch * args.seq / seconds, loss.item()


def engine_tokens_per_s(args, precision):
    command = [os.path.join(args.build, "bin", "lm_step_bench"), "--precision", precision,
               "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
               "--layers", str(args.layers), "--data", args.data]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["threads"] != torch.get_num_threads():
        torch.set_num_threads(result["threads"])
    return result["tokens_per_s"], result["final_train_loss"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(root, "build"))
    parser.add_argument("--data", default=os.path.join(root, "data", "fortunes.txt"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--precision", action="append",
                        help="fp32, bf16-mixed (default: both; bf16-mixed only where the CPU has "
                             "bf16 autocast)")
    args = parser.parse_args()
    precisions = args.precision or ["fp32", "bf16-mixed"]
    print(f"PyTorch {torch.__version__}, batch {args.batch} x {args.seq} tokens, {args.steps} steps, best of {args.repeats}")
    print(f"{'precision':<12} {'threads':>7} {'engine tok/s':>13} {'pytorch tok/s':>14} {'ratio':>6}   "
          f"final loss engine / pytorch")
    for precision in precisions:
        best_engine, best_torch = (0.0, 0.0), (0.0, 0.0)
        try:
            for _ in range(args.repeats):
                best_engine = max(best_engine, engine_tokens_per_s(args, precision))
                best_torch = max(best_torch, pytorch_tokens_per_s(args, precision))
        except subprocess.CalledProcessError as e:
            print(f"{precision:<12} engine failed: {e.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{precision:<12} {torch.get_num_threads():>7} {best_engine[0]:>13,.0f} {best_torch[0]:>14,.0f} "
              f"{best_engine[0] / best_torch[0]:>6.2f}   {best_engine[1]:.3f} / {best_torch[1]:.3f}")


if __name__ == "__main__":
    main()
