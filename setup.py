"""Builds the optional compiled twins, one module a layer: the store's loops
(data_plane/store/_speedups.c), the SDK's record codecs (data_plane/store/_records.c), the
broker's batch decoding (data_plane/broker/_batch.c), the frame decoder
(data_plane/remoting/_codec.c) and the gRPC endpoint's batch sends
(data_plane/proxy/_v2_codec.c); everything else is in pyproject.toml. Without a C compiler
the build skips them and the pure-Python twins serve."""

from setuptools import Extension, setup

_STORE_HEADERS = [f"data_plane/store/{h}.h" for h in ("_layouts", "_bytes", "_slots", "_properties")]
_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension("data_plane.store._speedups", sources=["data_plane/store/_speedups.c"], extra_compile_args=_FLAGS,
                  depends=_STORE_HEADERS, optional=True),
        Extension("data_plane.store._records", sources=["data_plane/store/_records.c"], extra_compile_args=_FLAGS,
                  depends=_STORE_HEADERS, optional=True),
        Extension("data_plane.broker._batch", sources=["data_plane/broker/_batch.c"], extra_compile_args=_FLAGS,
                  depends=_STORE_HEADERS, optional=True),
        Extension("data_plane.proxy._v2_codec", sources=["data_plane/proxy/_v2_codec.c"], extra_compile_args=_FLAGS,
                  depends=_STORE_HEADERS, libraries=["m"], optional=True),
        Extension("data_plane.remoting._codec", sources=["data_plane/remoting/_codec.c"], extra_compile_args=_FLAGS,
                  optional=True),
    ]
)  # fmt: skip
