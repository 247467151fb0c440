"""Discovery of scheduler policies through Python entry points.

Policies register under the entry-point group ``paternoster.schedulers``
(``name = "module:Class"`` in a package's pyproject.toml) and are selected by
name (``--scheduler NAME``). A policy is loaded only if it implements the
contract version this engine implements (``SCHEDULER_API_VERSION``,
docs/schedulers.md).
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
            installed ones), the entry point is not a ``Scheduler`` subclass,
            or it implements another contract version (:func:`check_api_version`).
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
    check_api_version(cls, name)
    return cls


def check_api_version(cls: type, name: str) -> None:
    """Refuse a policy class written for another version of the contract.

    A class that does not set ``api_version`` inherits the base class's, i.e.
    claims the version installed; one that sets it explicitly is checked.

    Args:
        cls: the policy class.
        name: the name it was selected under (for the message).
    Raises:
        ValueError: ``cls.api_version`` is not ``SCHEDULER_API_VERSION``.
    """
    from paternoster.scheduling.scheduler import SCHEDULER_API_VERSION

    version = getattr(cls, "api_version", None)
    if version != SCHEDULER_API_VERSION:
        raise ValueError(
            f"scheduler {name!r} ({cls.__module__}.{cls.__qualname__}) implements scheduler "
            f"API version {version}, this paternoster implements version "
            f"{SCHEDULER_API_VERSION} (docs/schedulers.md lists the changes)"
        )
