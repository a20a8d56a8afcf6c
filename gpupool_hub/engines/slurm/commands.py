"""Running Slurm's client commands: the one place in the package that starts a process.

:func:`run_slurm` runs a Slurm client command from an argv list (never a shell
string) with a fixed environment (:data:`FORCED_ENV`); a :data:`Runner` is
anything that takes such an argv and returns the command's output, so the
readers in :mod:`gpupool_hub.engines.slurm` are tested on captured output
(``tests/slurm/data``) as well as against a live cluster.

Every failure is a :class:`SlurmError` with a message meant for an admin:
a command that is missing, fails or hangs (:class:`SlurmCommandError`), output
that does not look as expected (:class:`SlurmOutputError`), or a GRES type
with no model (:class:`UnmappedGresType`). :func:`controller_unreachable` tells
slurmctld's absence from other failures; :class:`OutageLog` logs an outage once.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "FORCED_ENV",
    "Runner",
    "SlurmCommandError",
    "SlurmError",
    "SlurmOutputError",
    "UnmappedGresType",
    "controller_unreachable",
    "run_slurm",
]


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class SlurmError(Exception):
    """Anything that went wrong talking to Slurm or reading what it said."""


class SlurmCommandError(SlurmError):
    """A Slurm command is missing, failed, or did not answer in time."""

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class SlurmOutputError(SlurmError, ValueError):
    """Slurm printed something this module does not understand; nothing is guessed."""


class UnmappedGresType(SlurmError, ValueError):
    """A GPU GRES type has no entry in the GRES-to-model map."""

    def __init__(self, gres_type: str, where: str, known: Iterable[str]) -> None:
        known_list = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"GPU GRES type {gres_type!r} ({where}) is not in the GRES-to-model map "
            f"(it maps: {known_list}); add e.g. {{{gres_type!r}: \"<GPU model name>\"}}"
        )
        self.gres_type = gres_type


# ---------------------------------------------------------------------------
# The one I/O seam
# ---------------------------------------------------------------------------

#: What every Slurm command gets in its environment, whatever the caller's:
#: times in UTC as epoch seconds (sacct, scontrol), untranslated messages.
FORCED_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "%s", "LC_ALL": "C"}

Runner = Callable[[Sequence[str]], str]


def run_slurm(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 30,
              input: str | None = None, job_env: bool = False) -> str:
    """Run one Slurm client command and return its standard output: the one process runner of the
    Slurm engine (the service's readers and the spawner's submit, query and cancel).

    ``argv`` is a list (``["scontrol", "-d", "show", "node", "-o"]``), never a
    shell string; callers put only fixed options, job ids and names Slurm
    itself printed into it. ``env`` defaults to this process's environment
    (so ``SLURM_CONF`` is honoured); :data:`FORCED_ENV` is applied, so that
    times and messages parse the same everywhere, except with ``job_env``: a
    command that hands its environment on to a job (``sbatch``) runs with
    ``env`` as given, the user's zone and locale being the job's. ``input`` is
    the command's standard input (``sbatch``'s batch script).
    """
    if isinstance(argv, (str, bytes)) or not argv:
        raise TypeError("argv must be a non-empty list of strings, not a shell string")
    args = list(argv)
    for a in args:
        if not isinstance(a, str) or "\0" in a:
            raise TypeError(f"argv elements must be strings without NUL bytes, got {a!r}")
    full_env = dict(os.environ if env is None else env)
    if not job_env:
        full_env.update(FORCED_ENV)
    cmd = " ".join(args)
    stdin = {"stdin": subprocess.DEVNULL} if input is None else {"input": input.encode()}
    try:
        proc = subprocess.run(args, env=full_env, capture_output=True, timeout=timeout, check=False, **stdin)
    except FileNotFoundError:
        raise SlurmCommandError(
            f"{args[0]} not found on PATH; is the Slurm client (Debian: slurm-client) installed?", argv=args
        ) from None
    except PermissionError as e:
        raise SlurmCommandError(f"{args[0]} cannot be run: {e}", argv=args) from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{cmd!r} did not answer within {timeout:g}s", argv=args) from None
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace").strip()
    if proc.returncode != 0:
        detail = stderr[-1000:] or stdout.strip()[-1000:] or "no output"
        raise SlurmCommandError(
            f"{cmd!r} failed with exit status {proc.returncode}: {detail}",
            argv=args, returncode=proc.returncode, stderr=stderr,
        )
    return stdout


#: what Slurm's client commands print when slurmctld does not answer
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out", "connection refused",
                "zero bytes were transmitted", "controller not responding", "communication connection failure",
                "did not answer within")


def controller_unreachable(message: str) -> bool:
    """Whether a command's error says slurmctld did not answer (a passing outage, not a bug)."""
    text = message.lower()
    return any(marker in text for marker in _UNREACHABLE)


