"""Every error a user can hit, as one tree.

    SpecsweepError                  one line for the user; the CLI prints it and exits non-zero
    ├── ConfigError                 a bad study file, profile, flag or spec config (names the key)
    ├── StudyInUseError             a study another live run is using (names its pid and host)
    ├── WorkloadError               a workload file that cannot be read or has a bad record
    ├── LaunchError                 a server that could not be started
    │   ├── ReadyTimeoutError       a server that never became ready in time
    │   └── ServerCrashedError      a server process that exited while it was needed
    ├── RequestError                a request that failed (connection, HTTP status, bad stream)
    ├── MetricsError                /metrics missing, unreadable, or without the counters needed
    ├── FitError                    data that cannot support a fit
    └── OutputError                 a file or folder specsweep was asked to write that cannot be written

Messages are complete sentences that say what went wrong and what to do about it.
"""

from __future__ import annotations


class SpecsweepError(Exception):
    """Base class: its message is shown to the user as one line."""

    exit_code = 1  # the command's exit code; 130 (an interrupt) is said without "error:"


class ConfigError(SpecsweepError):
    """A configuration value is missing, unknown or out of range."""


class StudyInUseError(SpecsweepError):
    """Another specsweep run that is still alive holds the study; nothing was changed."""


class WorkloadError(SpecsweepError):
    """A workload file or record is unusable."""


class LaunchError(SpecsweepError):
    """A server could not be started."""


class ReadyTimeoutError(LaunchError):
    """A server did not become ready within its timeout."""


class ServerCrashedError(LaunchError):
    """A server process exited while specsweep needed it."""


class RequestError(SpecsweepError):
    """A request to the server failed."""


class MetricsError(SpecsweepError):
    """The server's metrics are missing or unusable."""


class FitError(SpecsweepError):
    """The data cannot support the requested fit."""


class OutputError(SpecsweepError):
    """A file or folder cannot be written (a read-only place, a missing parent, a full disk)."""
