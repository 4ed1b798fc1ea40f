"""Names a package re-exports lazily: imported on first use, so that importing
the package stays cheap and has no side effects.

Only the interpreter uses the ``__getattr__`` made here; type checkers see the
package's ``if TYPE_CHECKING:`` imports instead (the real classes and
functions, and an error for a name the package does not export).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for ``package``: ``name`` imported from
    the module ``exports[name]`` on first use, then kept in ``namespace`` (the
    package's globals), so later lookups do not come back here."""

    def lazy_getattr(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return lazy_getattr
