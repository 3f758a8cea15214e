"""Builds the optional compiled twin of data_plane/store/fastpath.py; everything else is in
pyproject.toml. Without a C compiler the build skips it and the pure-Python twin serves."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "data_plane.store._speedups",
            sources=["data_plane/store/_speedups.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
