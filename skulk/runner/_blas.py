"""A fast CPU BLAS for the runners, by the operator's choice (``--cpu-blas openblas``).

The ``mlx[cpu]`` wheel for Linux links the reference BLAS and LAPACK, so every float32 matrix
product on a CPU runs in unoptimised code (a ``(512, 512) @ (512, 1536)`` product: hundreds of
milliseconds instead of a few). ``--cpu-blas openblas`` gives the runner processes OpenBLAS
instead, from the ``scipy-openblas32`` wheel (the OpenBLAS build NumPy and SciPy ship; LP64,
32-bit integers, as mlx's ``cblas_sgemm`` calls expect). That wheel exports its functions under
a ``scipy_`` prefix, so that it never clashes with another BLAS in the same process; mlx asks
for the plain names. :func:`openblas_library` therefore writes, once per wheel version, a copy
of the library into the node's cache that also exports, under their plain names, the functions
``libmlx`` imports (``cblas_sgemm``, ``sgetrf_``, …: the ELF is edited with ``lief``, a library
built for the job). Each runner is started with that copy in ``LD_PRELOAD``, so the dynamic
linker binds mlx's calls to OpenBLAS before the bundled reference BLAS.

**Trade-off.** OpenBLAS picks its kernels by matrix shape and splits work across threads, so a
row's result depends in its last bits on the rows batched with it: seeded requests are no
longer bit-identical across different batch neighbours, nor a prefix-cache hit bit-identical to
a cold run. Off by default; the bit-identity tests run with it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

#: The choices of ``--cpu-blas``.
CPU_BLAS = ("reference", "openblas")
#: OpenBLAS threads per runner unless ``OPENBLAS_NUM_THREADS`` is set: one. mlx runs its CPU
#: work on a thread of its own, several runners may share a machine, and OpenBLAS threads that
#: find their cores busy spin: on 2 shared cores, two threads made decode 4x slower than one.
THREADS = "1"
#: The prefix the ``scipy-openblas32`` wheel gives every function it exports.
PREFIX = "scipy_"


class CpuBlasUnavailable(Exception):
    """``--cpu-blas openblas`` cannot be honoured here; the message says why and what to do."""


def openblas_library(cache: Path) -> Path:
    """The OpenBLAS library the runners preload (written into ``cache`` the first time; a few
    seconds). Raises :class:`CpuBlasUnavailable` off Linux or without the ``cpu-blas`` extra."""
    if sys.platform != "linux":
        raise CpuBlasUnavailable(
            "--cpu-blas openblas is for Linux: mlx on macOS uses Accelerate already"
        )
    try:
        import lief
        import scipy_openblas32
    except ImportError as exc:
        raise CpuBlasUnavailable(
            f"--cpu-blas openblas needs the cpu-blas extra ({exc.name} is missing): "
            "pip install 'skulk[cpu-blas]'"
        ) from None
    source = Path(scipy_openblas32.get_lib_dir()) / scipy_openblas32.get_library(fullname=True)
    mlx = _libmlx()
    key = hashlib.sha256(
        f"{source}:{source.stat().st_size}:{mlx}:{mlx.stat().st_size}".encode()
    ).hexdigest()[:16]
    target = cache / f"libopenblas-{scipy_openblas32.__version__}-{key}.so"
    if target.exists():
        return target
    importer = _parse(lief, mlx)  # held while its symbols are read: lief frees them with it
    wanted = {s.name for s in importer.imported_symbols}
    library = _parse(lief, source)
    exported = {s.name: s.value for s in library.exported_symbols}
    aliased = sorted(name for name in wanted if PREFIX + name in exported)
    if "cblas_sgemm" not in aliased:
        raise CpuBlasUnavailable(f"{source.name} exports no {PREFIX}cblas_sgemm for mlx")
    for name in aliased:
        library.add_exported_function(exported[PREFIX + name], name)
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    library.write(str(partial))
    os.replace(partial, target)  # whole or not at all: a runner never preloads half a file
    return target


def preload_env(library: str, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``library`` first in ``LD_PRELOAD`` (``""``: unchanged), and OpenBLAS
    kept to one thread unless ``OPENBLAS_NUM_THREADS`` says otherwise (see :data:`THREADS`)."""
    if not library:
        return environ
    rest = environ.get("LD_PRELOAD", "")
    return {
        "OPENBLAS_NUM_THREADS": THREADS,
        **environ,
        "LD_PRELOAD": f"{library}:{rest}" if rest else library,
    }


def _libmlx() -> Path:
    """mlx's shared library (found without importing mlx: this package never does)."""
    spec = importlib.util.find_spec("mlx")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        found = Path(root) / "lib" / "libmlx.so"
        if found.exists():
            return found
    raise CpuBlasUnavailable(f"no libmlx.so under {roots or 'an installed mlx'}")


def _parse(lief: Any, path: Path) -> Any:
    parsed = lief.parse(str(path))
    if parsed is None:
        raise CpuBlasUnavailable(f"{path} is not a shared library lief can read")
    return parsed
