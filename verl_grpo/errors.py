"""Error types. Retry decisions are made on these types, never on message text.

Every message names the field or resource at fault and the fix.
"""


class VerlGrpoError(Exception):
    """Base of every error this package raises on purpose."""

    retryable = False


class ConfigError(VerlGrpoError):
    """The run configuration is invalid; the user fixes it. Raised before anything is spent."""


class RunNotFound(ConfigError):
    """A run id to resume that the store has no record of. A resume never silently becomes a fresh run (training
    from step 1 under that id, its checkpoints in a second store); raised before anything is spent."""


class DataError(VerlGrpoError):
    """Input data is missing or unusable; the user fixes it. Raised before anything is spent."""


class InfraError(VerlGrpoError):
    """Provisioning, storage or network trouble that a retry may cure."""

    retryable = True


class Preempted(InfraError):
    """The training job lost its machines (spot preemption or a killed worker); resume from the last checkpoint."""


class TrainingError(VerlGrpoError):
    """The training code or its numerics failed; retrying would fail the same way."""


def is_retryable(exc: BaseException) -> bool:
    """True for errors worth a retry from the last checkpoint (infrastructure and preemption)."""
    return isinstance(exc, VerlGrpoError) and exc.retryable


def error_class(name: str | None) -> type[VerlGrpoError]:
    """The error class called `name` (as a training process reports it); TrainingError when unknown."""
    known = {cls.__name__: cls for cls in (ConfigError, DataError, InfraError, Preempted, TrainingError)}
    return known.get(name or "", TrainingError)
