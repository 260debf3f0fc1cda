"""Jacobi trajectories: prompt sources, collection through the decoding engine's recorder, and the Parquet store."""
