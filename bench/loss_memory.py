"""Peak memory of the Jacobi Forcing loss, forward and backward, on one long packed batch: the model's full logits
(before) against the memory-lean loss (after: the LM head on loss positions only, in checkpointed chunks), for the
loss alone (from the final hidden states to their gradient) and for the whole step (on this CPU the whole step also
holds SDPA's L x L attention scores, which FlexAttention does not materialise on GPUs).

    .venv/bin/python bench/loss_memory.py [--vocab 32000] [--length 4096] [--chunk 1024]

Each mode runs in a fresh process and reports how far the loss pushed the process's peak resident memory
(`getrusage` max RSS) above everything before it; CPU tensors of this size are mmapped by the allocator and given
back when freed, so the growth is the loss's own peak. The two losses must agree.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(mode: str, part: str, vocab: int, length: int, chunk: int) -> dict:
    """In this process: build a random Qwen2 and one packed example of about `length` tokens, run the loss."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jf_core.training.losses import JacobiForcingObjective, JFLossConfig
    from jf_core.training.packing import PackedExample, collate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=vocab,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2 * length,
        )
    ).train()
    n, prompt = 32, 64
    blocks = max(1, (length - prompt) // (2 * n))
    g = torch.Generator().manual_seed(1)
    clean = [torch.randint(3, vocab, (n,), generator=g).tolist() for _ in range(blocks)]
    noisy = [[c[0], *torch.randint(3, vocab, (n - 1,), generator=g).tolist()] for c in clean]
    example = PackedExample(
        "long", torch.randint(3, vocab, (prompt,), generator=g).tolist(), n, noisy, clean, [n] * blocks
    )
    batch = collate([example], 0)
    cfg = JFLossConfig(chunk=chunk)
    if part == "loss":
        # The loss alone: from the final hidden states (a leaf here) to their gradient.
        from jf_core.training.losses import head_fn, hidden_states_at_head, jf_losses

        with torch.no_grad(), hidden_states_at_head(model) as captured:
            model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
            )
        hidden = captured["hidden"].detach().requires_grad_()
        head = head_fn(model)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if mode == "lean":
            loss, _ = jf_losses(hidden, head, batch, cfg)
        else:
            loss, _ = jf_losses(head(hidden), lambda rows: rows, batch, cfg)
        loss.backward()
    else:
        objective = JacobiForcingObjective(cfg, lean=mode == "lean")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loss, _ = objective(model, batch)
        loss.backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "part": part,
        "tokens": example.total_length,
        "vocab": vocab,
        "peak_growth_mib": (after - before) / 1024,  # ru_maxrss is in KiB on Linux
        "loss": float(loss),
        "full_logits_mib": example.total_length * vocab * 4 / 2**20,
    }


def run(vocab: int, length: int, chunk: int) -> list[dict]:
    out = []
    for part in ("loss", "step"):
        for mode in ("full", "lean"):
            argv = ["--one", mode, "--part", part, "--vocab", str(vocab), "--length", str(length)]
            argv += ["--chunk", str(chunk)]
            proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True)
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--one", choices=["full", "lean"], help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=["loss", "step"], default="loss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.part, args.vocab, args.length, args.chunk)))
        return
    rows = run(args.vocab, args.length, args.chunk)
    first = rows[0]
    print(
        f"packed batch of {first['tokens']} tokens, vocabulary {first['vocab']} (full fp32 logits: "
        f"{first['full_logits_mib']:.0f} MiB), LM-head chunk {args.chunk}"
    )
    print("| measured | full logits (before) | memory-lean (after) | after / before | loss values |")
    print("|---|---|---|---|---|")
    parts = (("loss", "the loss: hidden states to their gradient"), ("step", "the whole forward + backward"))
    for part, label in parts:
        full, lean = (next(r for r in rows if r["part"] == part and r["mode"] == m) for m in ("full", "lean"))
        ratio = lean["peak_growth_mib"] / full["peak_growth_mib"]
        print(
            f"| {label} | {full['peak_growth_mib']:.0f} MiB | {lean['peak_growth_mib']:.0f} MiB | {ratio:.3f} | "
            f"{full['loss']:.6f} / {lean['loss']:.6f} |"
        )


if __name__ == "__main__":
    main()
