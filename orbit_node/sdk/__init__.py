"""``orbit_node.sdk`` is ``orbit_sdk``: the SDK became a distribution of its own
(``orbit-sdk``), and code written against ``orbit_node.sdk``, ``orbit_node.sdk.client``,
``orbit_node.sdk.worker`` (or any other module of it) keeps working where the node is
installed. Each such module is the same module object as ``orbit_sdk``'s, so classes,
exceptions and ``isinstance`` checks are shared. New code imports ``orbit_sdk``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import orbit_sdk
from orbit_sdk import *  # noqa: F403 (the SDK's public names, as before)
from orbit_sdk import __all__  # noqa: F401

for _module in pkgutil.iter_modules(orbit_sdk.__path__):
    # As an import of the submodule would: in sys.modules and an attribute of this package.
    globals()[_module.name] = sys.modules[f"{__name__}.{_module.name}"] = importlib.import_module(
        f"orbit_sdk.{_module.name}"
    )
