"""The errors rlcore reports to its user, each with a message that says what to fix; the
`rlcore` command maps them to exit codes (`cli.main`)."""


class ConfigError(ValueError):
    """A configuration the user must fix; the message says which key and how."""


class RunExistsError(FileExistsError):
    """The output directory already holds a complete run."""


class ReplayError(Exception):
    """A replay cannot go on (`rlcore replay` exits 1 with the message)."""


class WorkerFailed(RuntimeError):
    """A worker raised or died; the message names it and carries its traceback."""


class UpdateFailed(RuntimeError):
    """An update that can neither commit nor be skipped: a step it applied was not finite,
    or the loss scaler has skipped every step for too long."""


class DeliveryFailed(RuntimeError):
    """A role loaded a policy version whose state is not the one the parameter service
    published: the weights did not arrive, and sampling would go on from old ones."""


class HarnessFailed(RuntimeError):
    """The reward harness itself raised more often than `reward.max_harness_errors` allows;
    the message names the sample and the exception."""


class KernelsError(ConfigError):
    """The CPU kernels a config asks for are not those in force in this process and can no
    longer be made so (`rlcore/kernels.py`); the message says how to start it instead."""
