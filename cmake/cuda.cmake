# The CUDA path: built whenever a CUDA toolkit is found (MOETIER_CUDA=OFF opts out); without one
# the CPU engine builds as before. Sets MOETIER_HAVE_CUDA for the folders that add CUDA sources.
#
# Architectures: CMAKE_CUDA_ARCHITECTURES when given (e.g. 90 for an H100/H200 only, which
# builds fastest); otherwise cubins for Ampere (sm_80, also run by sm_86/87/89 cards), Hopper
# (sm_90) and consumer Blackwell (sm_120), plus compute_80 PTX that newer GPUs compile at load.
set(MOETIER_HAVE_CUDA OFF)
if(MOETIER_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 120-real 80-virtual)
    endif()
    # C++20 as for the host code. CMake 3.25 does not know nvcc's C++20 flag (and would otherwise
    # take the C++ standard for CUDA too): name it, then ask for it.
    enable_language(CUDA)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION -std=c++20)
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION -std=c++20)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # pkg-config targets name /usr/include; passed to nvcc as -isystem it breaks the host
    # compiler's #include_next <math.h>. It is the host compiler's own directory anyway.
    list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
    # The runtime is linked once, as CUDA::cudart_static (src/CMakeLists.txt), by the C++ linker.
    set(CMAKE_CUDA_RUNTIME_LIBRARY None)
    find_package(CUDAToolkit REQUIRED)
    set(MOETIER_HAVE_CUDA ON)
    # Warnings as errors in device and host code alike; the host side gets the C++ flags.
    set(_cuda_warn --Werror all-warnings -Xcompiler=-Wall,-Wextra)
    if(MOETIER_WERROR)
      list(APPEND _cuda_warn -Xcompiler=-Werror)
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:${_cuda_warn};--expt-relaxed-constexpr>")
    message(STATUS "moetier: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "moetier: no CUDA toolkit found; building the CPU engine only")
  endif()
endif()
