"""Glue for third-party frameworks (ultralytics)."""
