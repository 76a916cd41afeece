# FindNCCL: finds NVIDIA's NCCL (header nccl.h and library libnccl) and defines NCCL::NCCL.
#
# Hints, in the order they are searched (each as a CMake variable or an environment variable):
#   NCCL_INCLUDE_DIR, NCCL_LIBRARY   exact header folder and library file (cache variables: set
#                                    them to skip the search altogether)
#   NCCL_ROOT, NCCL_HOME, NCCL_DIR   an install prefix with include/ and lib/ (or lib64/)
#   CUDAToolkit_ROOT, CUDA_HOME, CUDA_PATH and the CUDA toolkit found by FindCUDAToolkit
#                                    (NVIDIA's CUDA images ship NCCL inside the toolkit)
#   the Python wheel nvidia-nccl-cu13 / -cu12 (site-packages/nvidia/nccl/{include,lib}, whose
#   library is only libnccl.so.2), located by asking python3 (NCCL_PYTHON_EXECUTABLE overrides
#   which interpreter; set NCCL_NO_PYTHON=ON to skip)
#   then the system's default paths.
#
# Results: NCCL_FOUND, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES, NCCL_VERSION (from nccl.h), the imported
# target NCCL::NCCL. Mirrors the find modules of PyTorch and Caffe2, as a plain find module.
include(FindPackageHandleStandardArgs)

set(_nccl_prefixes "")
foreach(_v NCCL_ROOT NCCL_HOME NCCL_DIR CUDAToolkit_ROOT CUDA_HOME CUDA_PATH)
  if(DEFINED ${_v} AND NOT "${${_v}}" STREQUAL "")
    list(APPEND _nccl_prefixes "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}} AND NOT "$ENV{${_v}}" STREQUAL "")
    list(APPEND _nccl_prefixes "$ENV{${_v}}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_prefixes "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_tk "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_prefixes "${_nccl_tk}")
endif()

# The pip wheel (nvidia-nccl-cu13 or -cu12): nvidia/nccl is a namespace package in some wheels,
# so ask for __path__ rather than __file__.
if(NOT NCCL_NO_PYTHON AND NOT NCCL_INCLUDE_DIR)
  if(NOT NCCL_PYTHON_EXECUTABLE)
    find_program(NCCL_PYTHON_EXECUTABLE NAMES python3 python)
  endif()
  if(NCCL_PYTHON_EXECUTABLE)
    execute_process(
      COMMAND "${NCCL_PYTHON_EXECUTABLE}" -c
              "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _nccl_rc TIMEOUT 20)
    if(_nccl_rc EQUAL 0 AND IS_DIRECTORY "${_nccl_wheel}")
      list(APPEND _nccl_prefixes "${_nccl_wheel}")
    endif()
  endif()
endif()

set(_nccl_inc_hints "")
set(_nccl_lib_hints "")
foreach(_v NCCL_INCLUDE_DIR)
  if(DEFINED ENV{${_v}})
    list(APPEND _nccl_inc_hints "$ENV{${_v}}")
  endif()
endforeach()
foreach(_v NCCL_LIBRARY NCCL_LIB_DIR)
  if(DEFINED ENV{${_v}})
    if(EXISTS "$ENV{${_v}}" AND NOT IS_DIRECTORY "$ENV{${_v}}")
      get_filename_component(_d "$ENV{${_v}}" DIRECTORY)
      list(APPEND _nccl_lib_hints "${_d}")
    else()
      list(APPEND _nccl_lib_hints "$ENV{${_v}}")
    endif()
  endif()
endforeach()
foreach(_p IN LISTS _nccl_prefixes)
  list(APPEND _nccl_inc_hints "${_p}/include")
  list(APPEND _nccl_lib_hints "${_p}/lib" "${_p}/lib64" "${_p}/lib/x86_64-linux-gnu"
       "${_p}/targets/x86_64-linux/lib" "${_p}/targets/sbsa-linux/lib")
endforeach()
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_inc_hints ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND _nccl_lib_hints "${CUDAToolkit_LIBRARY_DIR}")
endif()

find_path(NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${_nccl_inc_hints}
          DOC "Folder holding nccl.h")
# libnccl.so.2 by full name: the pip wheel ships no unversioned libnccl.so symlink.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_lib_hints}
             DOC "NCCL library (libnccl.so)")

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_ver}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT "${_nccl_MAJOR}" STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

# Hints given as exact paths are taken as they are by find_path/find_library: check they exist.
set(_nccl_files_exist TRUE)
if(NCCL_INCLUDE_DIR AND NOT EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  set(_nccl_files_exist FALSE)
endif()
if(NCCL_LIBRARY AND NOT EXISTS "${NCCL_LIBRARY}")
  set(_nccl_files_exist FALSE)
endif()
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR _nccl_files_exist
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY NCCL_PYTHON_EXECUTABLE)

unset(_nccl_prefixes)
unset(_nccl_inc_hints)
unset(_nccl_lib_hints)
unset(_nccl_wheel)
unset(_nccl_rc)
unset(_nccl_ver)
unset(_nccl_files_exist)
