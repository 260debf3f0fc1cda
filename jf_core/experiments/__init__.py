"""Experiments: variants of a round's data and training from one model, measured side by side. One home:

- `variants.py`: what a variant is (overrides of a profile's sections, `from` an earlier variant's model) and a
  seed; how a run's profile is built from them;
- `run.py`: the in-process experiment (`jf experiment`): each variant (per seed) through the round's own stages,
  its rows and table;
- `measure.py`: how an experiment measures a model, on the questions it trained on and on held-out ones;
- `questions.py`: those question sets for a profile, and the scorer of their answers where the benchmark has one;
- `ablation.py`: the catalog of training variants at equal compute over seeds, scored on the profile's benchmark
  (the `jf-ablate` flow, `jf ablate`), and its table.

Outside the package: `jf_core/evaluation/growth.py` fits TPF against training tokens from the runs' probes
(`training/history.py`), `tasks/experiment_runs.py` logs an experiment's rows to MLflow.
"""
