# Dependencies from GALLEY_DEPS_DIR (default: .deps at the top of the source tree, filled by
# scripts/pack-gpu-deps.sh) for machines that cannot install packages. Each one is used only when
# the system's package is not found, unless GALLEY_DEPS_ONLY=ON: then find_package is skipped for
# every bundled dependency and .deps must hold them all (zlib's library, OpenMP and the CUDA
# libraries still come from the system). scripts/gpu-check.sh builds that way, so that its dry run
# on a machine that has the packages builds exactly as the GPU machine, which lacks them, will.
set(GALLEY_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps" CACHE PATH "Bundled dependencies")
option(GALLEY_DEPS_ONLY "Take Eigen, nlohmann_json, toml++, GoogleTest and zlib's headers from GALLEY_DEPS_DIR alone" OFF)
if(GALLEY_DEPS_ONLY)
  if(NOT EXISTS "${GALLEY_DEPS_DIR}")
    message(FATAL_ERROR "galley: GALLEY_DEPS_ONLY=ON but ${GALLEY_DEPS_DIR} does not exist "
                        "(run scripts/pack-gpu-deps.sh on a machine that has the packages)")
  endif()
  message(STATUS "galley: GALLEY_DEPS_ONLY=ON, bundled dependencies from ${GALLEY_DEPS_DIR} alone")
  set(_galley_deps_hint "${GALLEY_DEPS_DIR} lacks it: run scripts/pack-gpu-deps.sh again")
else()
  set(_galley_deps_hint "install it, or run scripts/pack-gpu-deps.sh on a machine that has it and bring .deps")
endif()

if(NOT GALLEY_DEPS_ONLY)
  find_package(Eigen3 3.3 QUIET NO_MODULE)
endif()
if(NOT Eigen3_FOUND)
  if(NOT EXISTS "${GALLEY_DEPS_DIR}/eigen3/Eigen/Core")
    message(FATAL_ERROR "galley: Eigen 3.3+ not found (${_galley_deps_hint})")
  endif()
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${GALLEY_DEPS_DIR}/eigen3")
  message(STATUS "galley: Eigen from ${GALLEY_DEPS_DIR}/eigen3")
endif()

if(NOT GALLEY_DEPS_ONLY)
  find_package(nlohmann_json 3 QUIET)
endif()
if(NOT nlohmann_json_FOUND)
  if(NOT EXISTS "${GALLEY_DEPS_DIR}/json/include/nlohmann/json.hpp")
    message(FATAL_ERROR "galley: nlohmann_json 3 not found (${_galley_deps_hint})")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${GALLEY_DEPS_DIR}/json/include")
  message(STATUS "galley: nlohmann_json from ${GALLEY_DEPS_DIR}/json")
endif()

if(NOT GALLEY_DEPS_ONLY)
  find_package(ZLIB QUIET)
endif()
if(NOT ZLIB_FOUND AND EXISTS "${GALLEY_DEPS_DIR}/zlib/zlib.h")
  # The library itself is nearly always there (Python links it); only the headers are missing.
  find_library(GALLEY_ZLIB_LIBRARY NAMES z libz.so.1
               PATHS /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu /usr/lib)
  if(GALLEY_ZLIB_LIBRARY)
    set(ZLIB_INCLUDE_DIR "${GALLEY_DEPS_DIR}/zlib" CACHE PATH "" FORCE)
    set(ZLIB_LIBRARY "${GALLEY_ZLIB_LIBRARY}" CACHE FILEPATH "" FORCE)
    find_package(ZLIB QUIET)
    message(STATUS "galley: zlib's headers from ${GALLEY_DEPS_DIR}/zlib, library ${GALLEY_ZLIB_LIBRARY}")
  endif()
endif()
if(NOT ZLIB_FOUND)
  message(FATAL_ERROR "galley: zlib not found (its library libz.so.1 must be installed; for its "
                      "headers, ${_galley_deps_hint})")
endif()

# GoogleTest, for the tests (the library's and galley-launch's).
if(GALLEY_BUILD_TESTS)
  if(NOT GALLEY_DEPS_ONLY)
    find_package(GTest QUIET)
  endif()
  if(NOT GTest_FOUND)
    if(NOT EXISTS "${GALLEY_DEPS_DIR}/googletest/CMakeLists.txt")
      message(FATAL_ERROR "galley: GoogleTest not found (${_galley_deps_hint})")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory(${GALLEY_DEPS_DIR}/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    message(STATUS "galley: GoogleTest built from ${GALLEY_DEPS_DIR}/googletest")
  endif()
endif()

# toml++ (header-only use), for galley-launch.
if(NOT GALLEY_DEPS_ONLY)
  find_package(tomlplusplus 3 CONFIG QUIET)
endif()
if(NOT tomlplusplus_FOUND AND EXISTS "${GALLEY_DEPS_DIR}/tomlplusplus/include/toml++/toml.h")
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
  set_target_properties(tomlplusplus::tomlplusplus PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${GALLEY_DEPS_DIR}/tomlplusplus/include"
    INTERFACE_COMPILE_DEFINITIONS "TOML_HEADER_ONLY=1")
  set(tomlplusplus_FOUND TRUE)
  message(STATUS "galley: toml++ from ${GALLEY_DEPS_DIR}/tomlplusplus")
elseif(NOT tomlplusplus_FOUND AND GALLEY_DEPS_ONLY AND GALLEY_BUILD_LAUNCHER)
  message(FATAL_ERROR "galley: toml++ not found, needed by galley-launch (${_galley_deps_hint})")
endif()
unset(_galley_deps_hint)
