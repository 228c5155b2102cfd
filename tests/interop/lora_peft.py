#!/usr/bin/env python3
"""megatrain's LoRA against peft's, for tests/e2e/lora_interop.sh.

    lora_peft.py loss BASE_HF ADAPTER DATA_PREFIX SEQ_LENGTH SAMPLES
    lora_peft.py first-step BASE_HF ADAPTER DATA_PREFIX SEQ_LENGTH SAMPLES LR [EPS]

loss: the base model (a transformers export) with the PEFT adapter (megatrain's `ckpt export --lora peft`) loaded by
peft; the mean next-token loss in float32 over SAMPLES samples read in file order (sample j is tokens
[j*S, j*S + S]), printed with full precision.
first-step: the adapter of a checkpoint taken after one training step with weight decay 0 (so A is still its
initial value, B's gradient was the only one: dA = 0 while B = 0) is loaded with B set back to 0; peft's loss and
gradients on the SAMPLES samples (one global batch) are printed as JSON: the loss, the grad norm, and the largest
difference between megatrain's first Adam step on B (B1 = -lr g / (|g| + eps), Adam's bias-corrected first step)
and the one peft's gradient gives, relative to lr, and the largest |g|. With a large EPS (optimizer.eps; default 1e-8)
the step is lr g / (|g| + EPS), nearly linear in g, so the difference compares the gradients element by element.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
import peft

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import indexed_file  # noqa: E402


def batch(prefix, S, K):
    tokens = np.array(indexed_file.read_tokens(prefix), dtype=np.int64)
    return torch.stack([torch.tensor(tokens[j * S:j * S + S + 1]) for j in range(K)])


def model_with_adapter(base, adapter):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return peft.PeftModel.from_pretrained(model, adapter, is_trainable=True).float()


def mean_loss(model, windows):
    logits = model(windows[:, :-1]).logits.double()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


def main():
    cmd, base, adapter, data, S, K = sys.argv[1:7]
    S, K = int(S), int(K)
    model = model_with_adapter(base, adapter)
    windows = batch(data, S, K)
    if cmd == "loss":
        model.eval()
        with torch.no_grad():
            print(repr(mean_loss(model, windows).item()))
        return
    lr = float(sys.argv[7])
    eps = float(sys.argv[8]) if len(sys.argv) > 8 else 1e-8
    model.eval()  # no dropout (the test trains with none)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.zero_()
    loss = mean_loss(model, windows)
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    norm = float(torch.sqrt(sum((g * g).sum() for g in grads.values())))
    worst, largest = 0.0, 0.0
    for n, b1 in trained.items():
        g = grads[n]
        predicted = -lr * g / (g.abs() + eps)
        worst = max(worst, float((predicted - b1.double()).abs().max()) / lr)
        largest = max(largest, float(g.abs().max()))
    print(json.dumps({"loss": loss.item(), "grad_norm": norm, "worst_step_difference": worst,
                      "largest_grad": largest, "lora_params": len(grads)}))


if __name__ == "__main__":
    main()
