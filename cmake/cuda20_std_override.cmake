# For CMake older than 3.26 with nvcc >= 12: those CMake versions do not know
# nvcc's flag for C++20 and refuse CMAKE_CUDA_STANDARD 20 ("requires the
# language dialect CUDA20 ... CMake does not know the flags to enable it").
# CMakeLists.txt names this file as CMAKE_USER_MAKE_RULES_OVERRIDE_CUDA when
# it finds such a CMake. Harmless elsewhere.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
