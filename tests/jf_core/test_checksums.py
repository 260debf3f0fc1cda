"""Corrupted model directories and training checkpoints are refused by checksum, naming the file; the manifest is
`sha256sum -c`'s format; directories without one (older, or from a hub) still load."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from jf_core.checksums import MANIFEST, CorruptFileError
from jf_core.model_dir import save_checkpoint
from jf_core.models import ModelLoadError, load_model
from jf_core.toy.model import ToyModelConfig, build_model
from jf_core.toy.tokenizer import build_tokenizer
from jf_core.training.trainer import Checkpoints, Every, TrainConfig, causal_lm_loss, train

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def tiny(tok):
    return build_model(ToyModelConfig(hidden_size=16, num_hidden_layers=1, intermediate_size=32), len(tok),
                       tok.pad_token_id, tok.eos_token_id, 0)  # fmt: skip


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupted_model_directory_is_refused_naming_the_file(tmp_path, tok):
    out = save_checkpoint(tiny(tok), tmp_path / "model", tokenizer=tok)
    assert (out / MANIFEST).read_text().split("  ")[1].strip() == "model.safetensors"  # the weights, nothing else
    load_model(str(out))  # intact: loads
    if shutil.which("sha256sum"):  # the manifest checks by hand too
        subprocess.run(["sha256sum", "--quiet", "-c", MANIFEST], cwd=out, check=True)
    flip_a_byte(out / "model.safetensors")  # one bit: safetensors itself would load it as slightly wrong weights
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: checksum mismatch .* corrupted or was changed"):
        load_model(str(out))
    (out / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: missing \(listed in checksums\.sha256\)"):
        load_model(str(out))


def test_a_directory_without_a_manifest_still_loads(tmp_path, tok):
    out = save_checkpoint(tiny(tok), tmp_path / "model", tokenizer=tok)
    (out / MANIFEST).unlink()  # as a hub download or a directory from before checksums
    load_model(str(out))


def test_a_corrupted_training_checkpoint_is_refused_not_resumed_from(tmp_path, tok):
    def batches():
        g = torch.Generator().manual_seed(0)
        while True:
            ids = torch.randint(3, len(tok), (2, 12), generator=g)
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    cfg = TrainConfig(steps=4, lr=3e-3, warmup_steps=1, log_every=1)
    train(tiny(tok), batches(), causal_lm_loss, cfg, hooks=[Checkpoints(tmp_path, Every(2))], progress=False)
    latest = sorted(tmp_path.glob("step-*"))[-1]
    flip_a_byte(latest / "optimizer.pt")
    longer = TrainConfig(steps=6, lr=3e-3, warmup_steps=1, log_every=1)
    with pytest.raises(CorruptFileError, match=rf"{latest.name}/optimizer\.pt: checksum mismatch"):
        train(tiny(tok), batches(), causal_lm_loss, longer, hooks=[Checkpoints(tmp_path, Every(2))], progress=False)
