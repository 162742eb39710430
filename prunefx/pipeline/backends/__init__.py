"""What differs between the pipelines: one backend per model family (see ``prunefx.pipeline.job.Backend``)."""
