"""Builds the optional C extension ``proxy._fastrelay`` (the rest of the metadata is in pyproject.toml).

Optional: without a compiler (or off Linux: it uses epoll and eventfd) the package installs without it and
the proxy runs its Python relay only, saying so in its startup log.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "proxy._fastrelay",
            ["proxy/_fastrelay.c"],
            optional=True,
            extra_compile_args=[
                "-O2",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-Wno-missing-field-initializers",
            ],
        )
    )

setup(ext_modules=ext_modules)
