"""Benchmarks and experiments on prunefx; run each as ``python -m experiments.<name>``."""
