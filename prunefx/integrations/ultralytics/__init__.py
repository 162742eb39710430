"""ultralytics integration: offline setup (``env``), checkpoints (``io``), the trainer hand-over (``train``), its
output distillation (``distill``), ultralytics' GFLOPs convention (``gflops``), the model family (``family``:
saving, export and costs of a loaded SPEC) and the analysis plugin (``plugin``, imported once ultralytics is).

This package's ``__init__`` imports nothing from ultralytics: ``env.setup_offline()`` must run before the first
``import ultralytics``.
"""
