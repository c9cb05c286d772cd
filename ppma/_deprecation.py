"""Deprecation aliases of renamed public names: the old name keeps working and warns
(``DeprecationWarning``, naming the new one) until it is removed."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
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


class _MovedModule(types.ModuleType):
    """Stands at a module's old path: every attribute read warns and is served by the module at
    its new path (a package's submodules are found by :class:`_MovedFinder`)."""

    def __init__(self, old: str, new: str):
        super().__init__(old)
        self._moved_to = new
        if hasattr(importlib.import_module(new), "__path__"):
            self.__path__ = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        warn_renamed(f"module {self.__name__}", self._moved_to)
        return getattr(importlib.import_module(self._moved_to), name)


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec) -> types.ModuleType:
        return _MovedModule(spec.name, self.new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the submodules of moved packages at their old paths."""

    def __init__(self, moved: dict[str, str]):
        self.moved = moved

    def find_spec(self, fullname: str, path=None, target=None):
        package, _, rest = fullname.rpartition(".")
        while package and package not in self.moved:
            package, _, parent = package.rpartition(".")
            rest = f"{parent}.{rest}"
        if not package:
            return None
        new = f"{self.moved[package]}.{rest}"
        if importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


def moved_packages(moved: dict[str, str]) -> None:
    """Keep each package of ``moved`` (old dotted path -> new) importable at its old path, and its
    submodules, as warning stand-ins for the new modules. The old path is entered in
    ``sys.modules`` directly, so importing it never rebinds the parent's attribute of that name
    (in ``ppma.ops`` the public function)."""
    for old, new in moved.items():
        sys.modules.setdefault(old, _MovedModule(old, new))
    sys.meta_path.append(_MovedFinder(dict(moved)))
