"""Errors prunefx raises on bad input; each message names the problem and the fix."""


class PrunefxError(Exception):
    """Base class: a user-facing error whose message is meant to be printed as is."""


class TraceFailure(PrunefxError):
    """The model could not be captured as a torch.fx graph."""


class ShapeError(PrunefxError):
    """The example inputs do not run through the model."""


class SpecError(PrunefxError):
    """A model SPEC (``torchvision:resnet50``, a checkpoint path, ...) could not be resolved."""


class VerificationError(PrunefxError):
    """The pruned model differs from its masked original, even after freezing the groups that failed the check."""


class UntrustedFileError(PrunefxError):
    """A file would run code to load (full unpickling) or to build (an evaluated model yaml), and is not trusted."""


class TrustWarning(UserWarning):
    """A file is loaded with full unpickling because the caller said it trusts it."""
