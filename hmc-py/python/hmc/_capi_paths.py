"""Where the wheel's copy of libhmc, the C and C++ API, lies: its headers, its library and
its relocatable ``hmc.pc`` (numpy's ``get_include()`` and pybind11's conventions).

The wheels that ``cargo xtask`` builds carry, under ``hmc/_capi/``::

    include/hmc/hmc.h, include/hmc/hmc.hpp
    lib/libhmc.so.0            the library (SONAME libhmc.so.0)
    lib/libhmc.so              a linker script, INPUT(libhmc.so.0), for -lhmc
    lib/pkgconfig/hmc.pc       prefix from its own place; Libs with an rpath to lib/
    lib/cmake/hmc/             the CMake package (find_package(hmc) with hmc_DIR)

so a C or C++ program builds against the installed package::

    cc app.c $(PKG_CONFIG_PATH=$(python -c 'import hmc; print(hmc.get_pkgconfig_dir())') \\
        pkg-config --cflags --libs hmc)

and runs without ``LD_LIBRARY_PATH`` (the rpath names the wheel's ``lib/``); or with CMake,
``-Dhmc_DIR=$(python -c 'import hmc; print(hmc.get_cmake_dir())')``. A package
built from source by pip (a PEP 517 build, without ``cargo xtask``) has only the Python
extension: each function then raises :class:`FileNotFoundError` saying how to get the
files.
"""

from pathlib import Path

_ROOT = Path(__file__).resolve().parent / "_capi"

# Each folder, with the file that must be in it for the folder to be the C API's.
_INCLUDE = ("include", "hmc/hmc.h")
_LIB = ("lib", "libhmc.so.0")
_PKGCONFIG = ("lib/pkgconfig", "hmc.pc")
_CMAKE = ("lib/cmake/hmc", "hmcConfig.cmake")


def _folder(folder: str, witness: str) -> str:
    path = _ROOT / folder
    if not (path / witness).is_file():
        raise FileNotFoundError(
            f"this hmc package ({Path(__file__).resolve().parent}) does not carry libhmc's C "
            f"API ({path / witness} is missing): it was built from source without "
            "`cargo xtask`, which stages the headers and the library into the wheel. "
            "Install a wheel built by `cargo xtask` (`cargo xtask test` leaves one in "
            "target/py-wheels/dev), or build libhmc from the HMC source with "
            "`cargo xtask install --prefix PREFIX` and use PREFIX/include, PREFIX/lib and "
            "PREFIX/lib/pkgconfig"
        )
    return str(path)


def get_include() -> str:
    """The folder holding ``hmc/hmc.h`` and ``hmc/hmc.hpp``: pass it as ``-I``.

    Raises :class:`FileNotFoundError` (saying how to get them) when this package was built
    without the C API.
    """
    return _folder(*_INCLUDE)


def get_library_dir() -> str:
    """The folder holding ``libhmc.so.0`` and the ``libhmc.so`` that ``-lhmc`` finds: pass
    it as ``-L`` and as an rpath (``-Wl,-rpath,DIR``) or ``LD_LIBRARY_PATH``.

    Raises :class:`FileNotFoundError` (saying how to get it) when this package was built
    without the C API.
    """
    return _folder(*_LIB)


def get_pkgconfig_dir() -> str:
    """The folder holding ``hmc.pc``: put it in ``PKG_CONFIG_PATH``, then
    ``pkg-config --cflags --libs hmc`` gives the include and library flags with an rpath.

    Raises :class:`FileNotFoundError` (saying how to get it) when this package was built
    without the C API.
    """
    return _folder(*_PKGCONFIG)


def get_cmake_dir() -> str:
    """The folder holding ``hmcConfig.cmake``: pass it as ``-Dhmc_DIR=...``, then
    ``find_package(hmc CONFIG REQUIRED)`` and ``target_link_libraries(app hmc::hmc)``.

    Raises :class:`FileNotFoundError` (saying how to get it) when this package was built
    without the C API.
    """
    return _folder(*_CMAKE)
