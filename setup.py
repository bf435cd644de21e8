"""Build hook for pymq's one C extension; everything else is in pyproject.toml.

``pymq.common._recordc`` speeds up the commit-log record codec (see its source).  It is
optional: without a C compiler pymq installs and runs in pure Python, only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pymq.common._recordc",
            ["pymq/common/_recordc.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # The group commit's sync worker is a pthread (in libc itself from glibc 2.34).
            libraries=["pthread"],
        )
    ]
)
