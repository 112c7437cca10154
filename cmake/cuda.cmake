include(${CMAKE_CURRENT_LIST_DIR}/cuda_stubs.cmake)

# The CUDA backend. GALLEY_WITH_CUDA: AUTO builds it when nvcc, cuBLAS, cuDNN and NCCL are all
# found (also on machines without a GPU, so that every build compiles and links the kernels),
# ON requires them, OFF leaves it out. CUDNN_ROOT and NCCL_ROOT (CMake or environment variables)
# point at installs outside the toolkit, including the layout of Python's nvidia-cudnn-cu* /
# nvidia-nccl-cu* packages: site-packages/nvidia/cudnn/{include,lib}, where the library may exist
# only as libcudnn.so.9 (libnccl.so.2), with no unversioned name. Those are namespace packages:
# their folder is `nvidia.cudnn.__path__[0]` (`__file__` is None). Architectures default to 80;90
# (never "native": the build machine may have no GPU).
include(CheckLanguage)

# Finds `header` and the library `name` (or its versioned file, lib<name>.so.<N>), looking in
# the given roots before the toolkit, and each folder for every name before the next folder, so
# that a header and a library from two different installs are never paired.
function(galley_find_cuda_library out name header)
  set(hints)
  foreach(root ${ARGN})
    if(root)
      list(APPEND hints ${root} ${root}/lib ${root}/lib64 ${root}/include)
    endif()
  endforeach()
  find_path(${out}_INCLUDE_DIR ${header} HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(${out}_LIBRARY NAMES ${name} lib${name}.so.9 lib${name}.so.2 NAMES_PER_DIR
               HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(${out}_INCLUDE_DIR AND ${out}_LIBRARY)
    set(${out}_FOUND ON PARENT_SCOPE)
  else()
    set(${out}_FOUND OFF PARENT_SCOPE)
  endif()
endfunction()

# Decides whether the backend is built; sets GALLEY_CUDA_ENABLED in the caller's scope. Must be
# called from the top-level CMakeLists (enable_language is directory-scoped).
macro(galley_detect_cuda)
  set(GALLEY_CUDA_ENABLED OFF)
  if(NOT GALLEY_WITH_CUDA STREQUAL "OFF")
    check_language(CUDA)
    find_package(CUDAToolkit QUIET)
    set(_galley_cuda_missing "")
    if(NOT CMAKE_CUDA_COMPILER OR NOT CUDAToolkit_FOUND)
      set(_galley_cuda_missing "nvcc / the CUDA toolkit")
    else()
      galley_find_cuda_library(GALLEY_CUDNN cudnn cudnn.h $ENV{CUDNN_ROOT} ${CUDNN_ROOT})
      galley_find_cuda_library(GALLEY_NCCL nccl nccl.h $ENV{NCCL_ROOT} ${NCCL_ROOT})
      if(NOT TARGET CUDA::cublas)
        set(_galley_cuda_missing "cuBLAS")
      elseif(NOT GALLEY_CUDNN_FOUND)
        set(_galley_cuda_missing "cuDNN (set CUDNN_ROOT)")
      elseif(NOT GALLEY_NCCL_FOUND)
        set(_galley_cuda_missing "NCCL (set NCCL_ROOT)")
      endif()
    endif()
    if(_galley_cuda_missing STREQUAL "")
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)
      set(CMAKE_CUDA_STANDARD 17)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      set(GALLEY_CUDA_ENABLED ON)
      message(STATUS "galley: CUDA backend ON (CUDA ${CUDAToolkit_VERSION}, architectures "
                     "${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${GALLEY_CUDNN_LIBRARY}, NCCL ${GALLEY_NCCL_LIBRARY})")
    elseif(GALLEY_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "galley: GALLEY_WITH_CUDA=ON but ${_galley_cuda_missing} was not found")
    else()
      message(STATUS "galley: CUDA backend OFF (${_galley_cuda_missing} not found)")
    endif()
  else()
    message(STATUS "galley: CUDA backend disabled")
  endif()
endmacro()

# Adds the CUDA sources and libraries to `target` when the backend is enabled.
function(galley_configure_cuda target)
  if(NOT GALLEY_CUDA_ENABLED)
    # The launchers, each throwing: the op layer's single dispatch links either way.
    galley_cuda_stubs(${PROJECT_SOURCE_DIR} stubs)
    target_sources(${target} PRIVATE ${stubs})
    return()
  endif()
  file(GLOB cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  target_sources(${target} PRIVATE ${cuda_sources})
  target_compile_definitions(${target} PRIVATE GALLEY_HAVE_CUDA=1)
  target_include_directories(${target} PRIVATE ${GALLEY_CUDNN_INCLUDE_DIR} ${GALLEY_NCCL_INCLUDE_DIR})
  target_link_libraries(${target} PRIVATE CUDA::cudart_static CUDA::cublas CUDA::cublasLt
                                          ${GALLEY_CUDNN_LIBRARY} ${GALLEY_NCCL_LIBRARY})
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
endfunction()
