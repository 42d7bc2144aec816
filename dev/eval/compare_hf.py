#!/usr/bin/env python3
"""
compare_hf.py: checks an export_hf directory by running it in Hugging Face's transformers and
comparing its logits with ours, computed from the model file by dev/train_gpt2.py (the PyTorch
reference the trainers are tested against).

  ./export_hf -i out/model_00005000.bin -o out/hf
  python dev/eval/compare_hf.py out/model_00005000.bin out/hf

Needs torch, numpy and transformers (pip install torch numpy transformers); no test depends on
it, and without them it says which is missing and exits with status 1. It runs two batches of
random tokens (seeded) of up to 64 positions through both models in fp32 on the CPU and prints
the largest difference of any logit. It passes (exit 0) within 1e-4 of the largest logit's size
for an f32 export (only the order of float additions differs) and within 5e-2 for a bf16 one
(bf16 keeps 8 bits of mantissa, so each weight moves by up to 2^-9 of itself).
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description="compare an export_hf directory's logits with the model file's")
    ap.add_argument("model", help="the model file export_hf read (llm.c's v3 or v5)")
    ap.add_argument("hf_dir", help="the directory export_hf wrote")
    ap.add_argument("-T", type=int, default=64, help="positions per sequence (at most the model's maxT)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    missing = []
    for module in ("numpy", "torch", "transformers"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        print(f"compare_hf: needs {', '.join(missing)}: pip install {' '.join(missing)}", file=sys.stderr)
        sys.exit(1)
    import torch
    from transformers import GPT2LMHeadModel

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import train_gpt2 as ref  # the PyTorch reference: reads our model file, runs our forward

    cfg, params, version = ref.read_model(args.model)
    hf = GPT2LMHeadModel.from_pretrained(args.hf_dir, torch_dtype=torch.float32)
    hf.eval()
    st_dtype = str(next(hf.parameters()).dtype)
    T = min(args.T, cfg.maxT)
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, cfg.V, (2, T), generator=g)
    with torch.no_grad():
        ours = ref.forward(cfg, params, tokens)
        theirs = hf(tokens).logits
    if theirs.shape != ours.shape:
        print(f"compare_hf: FAIL: transformers' logits are {tuple(theirs.shape)}, ours {tuple(ours.shape)}")
        sys.exit(1)
    import json
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        exported_bf16 = json.load(f).get("torch_dtype") == "bfloat16"
    scale = ours.abs().max().item()
    diff = (theirs - ours).abs().max().item()
    tolerance = (5e-2 if exported_bf16 else 1e-4) * max(scale, 1.0)
    same_argmax = (theirs.argmax(-1) == ours.argmax(-1)).float().mean().item()
    print(f"compare_hf: {cfg}, model file version {version}, export {'bf16' if exported_bf16 else 'f32'} "
          f"(loaded as {st_dtype})")
    print(f"compare_hf: logits of 2 x {T} random tokens: largest |ours - transformers| = {diff:.3e} "
          f"(largest |logit| {scale:.3f}, tolerance {tolerance:.1e}); same argmax at {100 * same_argmax:.1f}% of positions")
    ok = diff <= tolerance
    print(f"compare_hf: {'ok' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
