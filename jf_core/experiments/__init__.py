"""Experiments: variants of a round's data and training from one model, measured side by side. One home:

- `variants.py`: what a variant is (overrides of a profile's sections, `from` an earlier variant's model) and a
  seed; how a run's profile is built from them;
- `run.py`: the one runner of variants, `run_variants` (each through the round's own stages, in this process or as
  Prefect tasks, then a measure of the caller's), and the in-process experiment over it (`jf experiment`), its rows
  and table;
- `measure.py`: how an experiment measures a model, on the questions it trained on and on held-out ones;
- `questions.py`: those question sets for a profile, and the scorer of their answers where the benchmark has one;
- `ablation.py`: the catalog of training variants at equal compute over seeds, and its table: an experiment whose
  runs are `run_variants`' too, measured on the profile's benchmark (the `jf-ablate` flow, `jf ablate`).

Outside the package: `jf_core/evaluation/growth.py` fits TPF against training tokens from the runs' probes
(`training/history.py`), `tasks/experiment_runs.py` logs an experiment's rows to MLflow.
"""
