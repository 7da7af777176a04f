# CMake package of libhmc: find_package(hmc CONFIG REQUIRED), then
# target_link_libraries(app hmc::hmc) (the shared library; hmc::hmc_static for libhmc.a).
# Installed at PREFIX/lib/cmake/hmc/, so the prefix is found from this file's place
# (the install can be moved). The Python wheel carries it too (hmc.get_cmake_dir()), where
# lib/libhmc.so is a linker script naming lib/libhmc.so.0.
get_filename_component(_hmc_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET hmc::hmc)
  add_library(hmc::hmc SHARED IMPORTED)
  set_target_properties(hmc::hmc PROPERTIES
    IMPORTED_LOCATION "${_hmc_prefix}/lib/libhmc.so"
    IMPORTED_SONAME "libhmc.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "${_hmc_prefix}/include")
endif()

if(NOT TARGET hmc::hmc_static AND EXISTS "${_hmc_prefix}/lib/libhmc.a")
  find_package(Threads REQUIRED)
  add_library(hmc::hmc_static STATIC IMPORTED)
  set_target_properties(hmc::hmc_static PROPERTIES
    IMPORTED_LOCATION "${_hmc_prefix}/lib/libhmc.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_hmc_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;dl;m;rt;util")
endif()

set(hmc_INCLUDE_DIRS "${_hmc_prefix}/include")
set(hmc_LIBRARIES hmc::hmc)
unset(_hmc_prefix)
