"""Build hook: the hot modules are compiled with mypyc where a C compiler is there."""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup

# Byte-level loops of the worker's per-job path (its decoder and encoder).
NATIVE = ["dueflow/records/worker_decoder.py", "dueflow/records/worker_encoder.py"]


def native_modules() -> list[Any]:
    if os.environ.get("DUEFLOW_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    # Type-checked as they compile; what they import is read for its types only
    # (the build environment need not have the dependencies installed).
    flags = ["--follow-imports=silent", "--ignore-missing-imports"]
    extensions = mypycify([*flags, *NATIVE], opt_level="3", group_name="dueflow_native")
    for extension in extensions:
        extension.optional = True  # no compiler: the same modules run as Python
    return list(extensions)


setup(ext_modules=native_modules())
