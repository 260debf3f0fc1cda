"""The registered model: an MLflow pyfunc whose `predict` runs Jacobi Forcing decoding.

Artifacts: `model_dir` (the HF model and tokenizer, safetensors) and `decode_config` (JSON: the autotuned
Jacobi Forcing config when the round tuned one, else the plain Jacobi config its evaluation picked), so a consumer
needs only the URI:

    model = mlflow.pyfunc.load_model("models:/jf-tiny@champion")
    model.predict(["program: a=85; step -8; return f"])      # -> list of completions

`params` may override `block_size` and `max_new_tokens` per call. Greedy Jacobi decoding is lossless: the text is
what the model's greedy AR decoding would write.
"""

from __future__ import annotations

import json
from typing import Any

import mlflow.pyfunc


class JacobiForcingModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        from jf_core.decoding.config_io import config_from_dict
        from jf_core.models import load_model

        self.model, self.tokenizer = load_model(context.artifacts["model_dir"])
        with open(context.artifacts["decode_config"]) as fh:
            self.decode = config_from_dict(json.load(fh))

    def predict(self, context, model_input: list[str], params: dict[str, Any] | None = None) -> list[str]:
        from dataclasses import replace

        from jf_core.decoding.config_io import decode
        from jf_core.models import stop_tokens

        cfg = replace(self.decode, **{k: v for k, v in (params or {}).items() if k in ("block_size", "max_new_tokens")})
        prompts = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in model_input]
        if any(not ids for ids in prompts):
            raise ValueError("every prompt must encode to at least one token")
        tok = self.tokenizer
        out = decode(self.model, prompts, cfg, **stop_tokens(self.model, tok))
        return [tok.decode(seq, skip_special_tokens=True) for seq in out.sequences]
