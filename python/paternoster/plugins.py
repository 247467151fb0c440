"""Plugin lookup by name through package entry points.

Tool parsers and reasoning parsers are found the same way: a group of entry
points (``name = "module:Class"``, declared in a package's pyproject.toml)
plus the built-ins, which are also known without the package metadata so an
out-of-date install still finds them. An installed entry point of a name wins
over the built-in one.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points


def available_plugins(group: str, builtins: dict[str, str]) -> list[str]:
    """Names of the built-in and installed plugins of entry-point ``group``, sorted."""
    return sorted({ep.name for ep in entry_points(group=group)} | set(builtins))


def load_plugin(group: str, builtins: dict[str, str], name: str, base: type, kind: str) -> type:
    """The class registered as ``name`` in ``group`` (or among ``builtins``).

    Args:
        group: the entry-point group.
        builtins: built-in name -> ``"module:Class"``.
        name: the plugin asked for.
        base: the class the plugin must subclass.
        kind: what a plugin is, for messages (``"tool parser"``).
    Raises:
        ValueError: ``name`` is unknown (the message names the argument and
            lists the built-in and installed plugins), or the class found is
            not a ``base`` subclass.
    """
    matches = [ep for ep in entry_points(group=group) if ep.name == name]
    if matches:
        cls, where = matches[0].load(), matches[0].value
    elif name in builtins:
        where = builtins[name]
        module, _, attr = where.partition(":")
        cls = getattr(import_module(module), attr)
    else:
        raise ValueError(
            f"{kind} name {name!r} is unknown; built-in: {', '.join(sorted(builtins))}; "
            f"installed: {', '.join(available_plugins(group, builtins))}")  # fmt: skip
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{kind} {name!r} ({where}) is not a {base.__name__} subclass")
    return cls
