"""Example tasks for the custom pipeline (``task: custom``): model, data and metric factories a config names."""
