"""Discovery of scheduler policies through Python entry points.

Policies register under the entry-point group ``paternoster.schedulers``
(``name = "module:Class"`` in a package's pyproject.toml) and are selected by
name (``--scheduler NAME``).
"""

from __future__ import annotations

from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "paternoster.schedulers"


def available_schedulers() -> list[str]:
    """Names of the installed scheduler policies, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_scheduler_class(name: str) -> type:
    """Load the policy class registered as ``name``.

    Raises:
        ValueError: no policy of that name is installed (the message lists the
            installed ones), or the entry point is not a ``Scheduler`` subclass.
    """
    from paternoster.scheduling.scheduler import Scheduler

    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise ValueError(
            f"unknown scheduler {name!r}; installed: {', '.join(available_schedulers()) or 'none'}"
        )
    cls = matches[0].load()
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ValueError(f"scheduler {name!r} ({matches[0].value}) is not a Scheduler subclass")
    return cls
