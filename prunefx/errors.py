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


class StorageError(PrunefxError, OSError):
    """A file or directory could not be written: the disk is full or read-only, or permission is denied."""

    # An OSError too (errno and filename kept): code that handles OSError still handles it.
    def __init__(self, message: str, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno, self.filename = errno, filename

    def __str__(self) -> str:
        return str(self.args[0])  # OSError's own str would be "[Errno N] ..." from errno and filename


class UnsafePathError(PrunefxError):
    """A write would leave the directory it belongs in: a symbolic link on its way, or a name read from a file that is
    not one plain file name (``..``, a separator)."""


class PrunefxWarning(UserWarning):
    """Base class of prunefx's warnings: a result to doubt, with what to do about it."""


class RegistryOverrideWarning(PrunefxWarning):
    """A ``register_*`` call replaced an entry prunefx registered itself, without ``replace=True``."""


class RuleOverrideWarning(RegistryOverrideWarning):
    """``register_rule`` replaced one of prunefx's built-in op rules without ``replace=True``."""


class TrustWarning(PrunefxWarning):
    """A file is loaded with full unpickling because the caller said it trusts it."""


class TargetMissedWarning(PrunefxWarning):
    """A plan could not reach its MACs / params / ratio target: it names the value reached and what froze the rest."""


class TiedScoresWarning(PrunefxWarning):
    """The plan cut among channels whose scores are (near-)tied, so by their position, not their importance."""


class ScoreScaleWarning(PrunefxWarning):
    """A global plan ranked raw scores of groups whose scales differ widely, so one group's scale decided the cut."""
