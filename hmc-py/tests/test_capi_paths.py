"""hmc.get_include(), get_library_dir(), get_pkgconfig_dir(), get_cmake_dir(): the C API a
wheel built by `cargo xtask` carries (HMC_TEST_WHEEL_CAPI=1 there: the files must be
present), or, in a package built from source without it, a FileNotFoundError saying how to
get them."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hmc

CALLS = [hmc.get_include, hmc.get_library_dir, hmc.get_pkgconfig_dir, hmc.get_cmake_dir]


def has_capi():
    """Whether this package carries the C API; required where xtask built the wheel."""
    required = os.environ.get("HMC_TEST_WHEEL_CAPI") == "1"
    try:
        hmc.get_include()
    except FileNotFoundError:
        assert not required, "HMC_TEST_WHEEL_CAPI=1 but the installed hmc has no C API"
        return False
    return True


def package_dir():
    return Path(hmc.__file__).resolve().parent


def test_the_paths_hold_the_headers_library_and_pc_inside_the_package():
    if not has_capi():
        pytest.skip("this hmc was built without the C API (test_missing_capi_says_how)")
    inc, lib, pc, cmake = (Path(f()) for f in CALLS)
    for d in (inc, lib, pc, cmake):
        assert d.is_absolute() and d.is_relative_to(package_dir()), d
    assert "hmc_engine_open" in (inc / "hmc/hmc.h").read_text()
    assert "namespace hixl" in (inc / "hmc/hmc.hpp").read_text()
    assert (lib / "libhmc.so.0").read_bytes()[:4] == b"\x7fELF"
    # -lhmc finds libhmc.so: a linker script naming the library beside it.
    assert "INPUT(libhmc.so.0)" in (lib / "libhmc.so").read_text()
    text = (pc / "hmc.pc").read_text()
    assert "prefix=${pcfiledir}/../.." in text and "-Wl,-rpath,${libdir}" in text
    assert Path(pc).parent == lib
    assert (cmake / "hmcConfig.cmake").is_file() and (cmake / "hmcConfigVersion.cmake").is_file()


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="pkg-config is not installed")
def test_pkg_config_resolves_the_pc_to_the_installed_package():
    if not has_capi():
        pytest.skip("this hmc was built without the C API (test_missing_capi_says_how)")
    env = dict(os.environ, PKG_CONFIG_PATH=hmc.get_pkgconfig_dir())

    def variable(name):
        out = subprocess.run(
            ["pkg-config", f"--variable={name}", "hmc"], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip()).resolve()

    assert variable("includedir") == Path(hmc.get_include())
    assert variable("libdir") == Path(hmc.get_library_dir())


def test_missing_capi_says_how():
    if has_capi():
        pytest.skip("this hmc carries the C API (the other tests check it)")
    for call in CALLS:
        with pytest.raises(FileNotFoundError, match="cargo xtask install --prefix PREFIX"):
            call()
