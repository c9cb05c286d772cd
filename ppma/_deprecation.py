"""Deprecation aliases of renamed public names: the old name keeps working and warns
(``DeprecationWarning``, naming the new one) until it is removed."""
from __future__ import annotations

import warnings
from typing import Any, Callable


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now ``new``."""
    warnings.warn(f"{old} is renamed {new}; the old name will be removed", DeprecationWarning, stacklevel=stacklevel)


def renamed_attributes(module: str, namespace: dict, renamed: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves each old name of ``renamed`` (old -> new) as the
    object ``namespace[new]``, with a warning; any other missing name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{module}.{renamed[name]}")
        return namespace[renamed[name]]

    return __getattr__


def renamed_keyword(owner: str, old: str, new: str, old_value: Any, new_value: Any, new_default: Any) -> Any:
    """The value of keyword ``new`` of ``owner``, or that of its deprecated name ``old`` when
    given (not ``None``); ``TypeError`` when both are given (``new_value`` is not its default)."""
    if old_value is None:
        return new_value
    if new_value != new_default:
        raise TypeError(f"{owner}: pass {new}= only ({old}= is its deprecated name)")
    warn_renamed(f"{owner}({old}=...)", f"{owner}({new}=...)", stacklevel=4)
    return old_value


def renamed_property(old: str, new: str) -> property:
    """A read-only class attribute ``old`` that returns attribute ``new``, with a warning."""

    def get(self):
        warn_renamed(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new}")
        return getattr(self, new)

    return property(get, doc=f"Deprecated name of ``{new}``.")
