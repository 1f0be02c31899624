"""Mooring under Mooncake's import name (``pip install ./python/mooncake-compat``).

Only :mod:`mooncake.store` is provided, re-exporting :mod:`mooring.store`. Installing this
package replaces a real Mooncake's ``mooncake`` package in the same environment, which is why
``pip install ./python`` never installs it: install it only where Mooring is meant to answer
to Mooncake's name. The rest of Mooncake (its transfer engine, ``mooncake.engine``; its
``mooncake_master`` and other tools) is not Mooring's and is not here: importing it raises an
:class:`ImportError` that says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

#: What answers to ``mooncake``: Mooring, through this package.
PROVIDED_BY = "mooring"


class _NotMooring(importlib.abc.MetaPathFinder):
    """Refuses every ``mooncake.*`` module but ``mooncake.store`` with a reason, instead of
    Python's bare "No module named" (which reads as a broken install)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("mooncake.") and fullname.split(".")[1] != "store":
            raise ImportError(
                f"{fullname} is part of Mooncake, not Mooring: the mooncake package installed "
                "here is Mooring's compatibility shim (mooring-mooncake-compat), which provides "
                "only mooncake.store. Use Mooring's own commands (`mooring master`, `mooring "
                "node`) for the rest, or uninstall the shim to use a real Mooncake.",
                name=fullname,
            )
        # Anything else (mooncake.store): the normal finders find it.


if not any(isinstance(finder, _NotMooring) for finder in sys.meta_path):
    sys.meta_path.insert(0, _NotMooring())
