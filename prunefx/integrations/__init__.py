"""Integrations: plugins for third-party libraries, imported by :func:`prunefx._plugins.activate` only once the
library itself is imported. Each registers its op rules, leaves, fixers and free outputs through the public
registries; the core never imports this package's modules."""

from prunefx._plugins import register_plugin
from prunefx.family import register_family

register_plugin("torchvision", "prunefx.integrations.torchvision")
register_plugin("ultralytics", "prunefx.integrations.ultralytics.plugin")
register_plugin("timm", "prunefx.integrations.timm")
register_plugin("transformers", "prunefx.integrations.transformers.plugin")
register_plugin("diffusers", "prunefx.integrations.diffusers")
register_plugin("open_clip", "prunefx.integrations.open_clip")

# How ultralytics models are saved, read back, exported and costed; imported on first use.
register_family("ultralytics", "prunefx.integrations.ultralytics.family:FAMILY")
