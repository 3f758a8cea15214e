"""Builds the optional compiled twins (data_plane/store/_speedups.c: the store's loops and the SDK's
record codecs; data_plane/remoting/_codec.c: the frame decoder); everything else is in
pyproject.toml. Without a C compiler the build skips it and the pure-Python twin serves."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension("data_plane.store._speedups", sources=["data_plane/store/_speedups.c"], extra_compile_args=_FLAGS,
                  depends=["data_plane/store/_layouts.h"], optional=True),
        Extension("data_plane.remoting._codec", sources=["data_plane/remoting/_codec.c"], extra_compile_args=_FLAGS,
                  optional=True),
    ]
)  # fmt: skip
