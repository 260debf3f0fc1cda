"""`jf models import`: what it refuses, by name, leaving nothing behind (the real import: tests/test_smollm2.py)."""

from __future__ import annotations

import numpy as np
import pytest

from jf_cli.main import main
from jf_core.model_import import ModelImportError, find_package_gguf, import_gguf, inspect_gguf


def _gguf(path, arch: str = "llama", qtype: str | None = None) -> None:
    """A GGUF file holding one tensor: plain F32, or raw bytes of quantization type `qtype`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if qtype is None:
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    else:
        kind = gguf.GGMLQuantizationType[qtype]
        _, size = gguf.GGML_QUANT_SIZES[kind]
        writer.add_tensor("token_embd.weight", np.zeros((1, size), dtype=np.uint8), raw_dtype=kind)  # one block
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _nothing_written(out) -> bool:
    return not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def test_a_file_that_is_not_gguf_is_refused_and_nothing_is_written(tmp_path, capsys):
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf file")
    out = tmp_path / "model"
    with pytest.raises(SystemExit) as exit_:
        main(["models", "import", str(bad), "--out", str(out)])
    assert exit_.value.code == 2
    assert f"{bad} is not a GGUF file" in capsys.readouterr().err
    assert _nothing_written(out)


def test_a_quantization_the_gguf_package_cannot_dequantize_is_refused_by_name(tmp_path):
    path = tmp_path / "q81.gguf"
    _gguf(path, qtype="Q8_1")
    with pytest.raises(ModelImportError, match=r"quantization type\(s\) Q8_1 cannot be dequantized"):
        inspect_gguf(path)
    out = tmp_path / "model"
    with pytest.raises(ModelImportError, match="Q8_1"):
        import_gguf(path, out)
    assert _nothing_written(out)


def test_an_architecture_transformers_cannot_load_is_refused_by_name(tmp_path):
    path = tmp_path / "rwkv.gguf"
    _gguf(path, arch="rwkv6")
    with pytest.raises(ModelImportError, match="GGUF architecture 'rwkv6' cannot be loaded by transformers"):
        import_gguf(path, tmp_path / "model")
    assert _nothing_written(tmp_path / "model")


def test_a_readable_gguf_passes_inspection(tmp_path):
    path = tmp_path / "ok.gguf"
    _gguf(path, qtype="Q4_1")
    info = inspect_gguf(path)
    assert (info.architecture, info.tensor_types) == ("llama", {"Q4_1": 1})


def test_packages_are_found_without_importing_them_and_missing_ones_are_named():
    with pytest.raises(ModelImportError, match="package 'no-such-package-jf' is not installed"):
        find_package_gguf("no-such-package-jf")
    with pytest.raises(ModelImportError, match=r"holds no \.gguf file"):
        find_package_gguf("pyyaml")


def test_missing_gguf_support_names_the_extra(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    path = tmp_path / "ok.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 16)
    with pytest.raises(ModelImportError, match=r"needs gguf: pip install 'jacobi-forcing\[gguf\]'"):
        inspect_gguf(path)


def test_random_weights_need_only_config_and_tokenizer(profile, tmp_path):
    """A GPU round's timing rehearsal (`jf experiment --random-weights`) builds the model's shape with seeded random
    weights from its config and tokenizer alone."""
    import shutil
    from pathlib import Path

    import torch

    from jf_core.model_import import random_weights_beside
    from jf_core.models import load_model

    source = Path(profile.model.path)
    shape = tmp_path / "shape"
    shape.mkdir()
    for f in source.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "checksums.sha256":
            shutil.copy(f, shape / f.name)
    out = random_weights_beside(str(shape))
    assert random_weights_beside(str(shape)) == out  # built once, beside the shape
    real, _ = load_model(str(source))
    rand, tok = load_model(str(out))
    assert rand.config.to_dict()["num_hidden_layers"] == real.config.num_hidden_layers
    shapes = {k: v.shape for k, v in real.state_dict().items()}
    assert {k: v.shape for k, v in rand.state_dict().items()} == shapes
    assert torch.isfinite(torch.cat([v.flatten().float() for v in rand.state_dict().values()])).all()
    assert (Path(out) / "checksums.sha256").is_file() and not list(shape.glob("*.safetensors"))
    assert tok.eos_token_id is not None
