"""Build hook for pymq's C accelerators; everything else is in pyproject.toml.

Each module sits beside the Python module it speeds up, with the same function names as its
Python twins and a ``.pyi`` stub (see :mod:`pymq.common.native`); they share
``pymq/common/_native.h``.  All are optional: without a C compiler pymq installs and runs in pure
Python, only slower.
"""

from setuptools import Extension, setup

SHARED_HEADER = "pymq/common/_native.h"
MODULES = (
    "pymq.common._recordc",  # record codec
    "pymq.remoting._codecc",  # frames and request headers
    "pymq.broker._sendc",  # send answers
    "pymq.store._commitlogc",  # commit-log puts, page population, the fdatasync thread
    "pymq.store._dispatchc",  # dispatch to consume queues and index
    "pymq.client._producerc",  # the producer's frames and batch bodies
    "pymq.export._columnsc",  # Arrow columns
)

setup(
    ext_modules=[
        Extension(
            name,
            [name.replace(".", "/") + ".c"],
            depends=[SHARED_HEADER],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # The group commit's sync worker is a pthread (in libc itself from glibc 2.34).
            libraries=["pthread"],
        )
        for name in MODULES
    ]
)
