"""The registered model's code (MLflow models-from-code: this file is stored with the model, nothing is pickled).

The model's artifact `checkpoint` is a plain Hugging Face checkpoint whose `config.json` carries the
`jacobi_forcing` block (decode config, AR crossover, hardware); its code is `jf_core` (stored with the model as a
code path), so a consumer needs only the URI and the model's requirements:

    model = mlflow.pyfunc.load_model("models:/jf-tiny@champion")
    model.predict(["program: a=85; step -8; return f"], params={"max_new_tokens": 64})

`params`: `max_new_tokens` and `block_size` (0 keeps the tuned n). Greedy Jacobi Forcing decoding is lossless: the
texts are what the model's greedy AR decoding writes.
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


class JacobiForcingModel(PythonModel):
    def load_context(self, context) -> None:
        from jf_core.serving.engine import Engine

        self.engine = Engine.load(context.artifacts["checkpoint"], name="jacobi-forcing")

    # No type hints on purpose: MLflow would infer the signature from them and take the params' defaults from the
    # input example; the logged signature (tasks/tracking.py) states them.
    def predict(self, context, model_input, params=None):
        """Prompts (a list of strings, or a one-column DataFrame as `mlflow models serve` passes) -> completions."""
        from jf_core.serving.engine import Request

        params = params or {}
        budget = int(params.get("max_new_tokens") or self.engine.spec.decode.max_new_tokens)
        block = int(params.get("block_size") or 0) or None
        texts = model_input.iloc[:, 0].tolist() if hasattr(model_input, "iloc") else list(model_input)
        requests = [Request(self.engine.encode(str(text)), budget) for text in texts]
        for request in requests:
            self.engine.check(request, max_tokens_limit=max(budget, 1))
        return [c.text for c in self.engine.complete(requests, block_size=block)]


mlflow.models.set_model(JacobiForcingModel())
