# Note [Precompiled headers]
# DITTO_PCH=ON (the check preset, CI) compiles the C++ standard headers that
# core/runtime/tensor.h and core/base/error.h include once per target, as a precompiled header
# (CMake's target_precompile_headers), instead of once per source. Under ASan + UBSan at -O1 a
# small library source spent most of its compile in parsing them: core/nn/affine.cpp 2.3 s of
# its 2.9 s in clang's front end (-ftime-trace), 1.6 s of it for tensor.h's includes alone.
# The list is tensor.h's own closure on purpose: a source that includes tensor.h (most of them)
# sees exactly what it sees without the PCH, so the check build does not hide a missing
# #include from the Release build, which has no PCH.
# A source compiled with options of its own (-O0 or libFuzzer's coverage, Notes [Cold library
# sources at -O0] and [Fuzz coverage]; the CUDA files) cannot use its target's PCH (clang
# refuses one built with another -O or -fsanitize set): ditto_pch gives each group of 3 or more
# sources with the same options an OBJECT library and a PCH of its own (ditto_core's 17
# fuzz-covered sources and its 11 cold ones) and compiles the rest as before
# (SKIP_PRECOMPILE_HEADERS). Only targets with several C++ sources get one: a PCH costs about what
# parsing its headers once costs (the nine took 22 s of CPU).
# Measured (one full check build each, back to back, 2-core machine, the CPU time of every C++
# compile): 1252 s before, 1075 s after; fresh clones of CI's run in one hour, 1209 s before
# (5464c8a), 1115 s after (docs/sanitizers.md, "CI's time").
# Off by default: a Release build parses each source's includes itself.
option(DITTO_PCH "Precompile the standard headers of core/runtime/tensor.h per target (CI)" OFF)
set(DITTO_PCH_HEADERS <algorithm> <cmath> <cstddef> <cstdint> <cstring> <functional> <limits>
    <memory> <sstream> <stdexcept> <string> <vector>)

# ditto_pch(<target> [<header>...]): with DITTO_PCH, <target>'s C++ sources compiled with
# DITTO_PCH_HEADERS and the <header>s precompiled. Sources with compile options of their own (all
# the same in a group of 3 or more: ditto_core's fuzz-covered and cold sources) move to an OBJECT
# library of that group with its own PCH, built as <target> is but for those options (its objects
# go at the end of <target>'s, in the order of the groups' first sources, so that the cold
# sources stay last: Note [Cold library sources at -O0]); the other sources with options or
# definitions of their own, and those that are not C++, are compiled as before. Call in the
# directory that adds <target>'s sources, after their properties are set and the target's own
# settings are made. Does nothing otherwise.
function(ditto_pch target)
  if(NOT DITTO_PCH)
    return()
  endif()
  set(headers "")
  foreach(h IN LISTS DITTO_PCH_HEADERS ARGN)
    list(APPEND headers "$<$<COMPILE_LANGUAGE:CXX>:${h}>")
  endforeach()
  target_precompile_headers(${target} PRIVATE ${headers})
  get_target_property(sources ${target} SOURCES)
  set(kept "")
  set(groups "")  # group ids in order of first source: 0, 1, ...
  set(skipped "")
  foreach(s IN LISTS sources)
    if(s MATCHES "^\\$<")  # $<TARGET_OBJECTS:...>: compiled by their own target
      list(APPEND kept "${s}")
      continue()
    endif()
    get_source_file_property(opts ${s} COMPILE_OPTIONS)
    get_source_file_property(defs ${s} COMPILE_DEFINITIONS)
    if(NOT s MATCHES "\\.(cpp|cc|cxx)$" OR defs)  # compiled as before
      list(APPEND kept "${s}")
      list(APPEND skipped "${s}")
      continue()
    endif()
    if(NOT opts)  # the target's PCH
      list(APPEND kept "${s}")
      continue()
    endif()
    string(MD5 key "${opts}")
    if(NOT DEFINED group_${key})
      list(LENGTH groups n)
      set(group_${key} ${n})
      set(group_${n}_opts "${opts}")
      set(group_${n}_sources "")
      list(APPEND groups ${n})
    endif()
    list(APPEND group_${group_${key}}_sources "${s}")
  endforeach()
  foreach(n IN LISTS groups)
    list(LENGTH group_${n}_sources count)
    if(count LESS 3)
      list(APPEND kept ${group_${n}_sources})
      list(APPEND skipped ${group_${n}_sources})
      continue()
    endif()
    set(obj ${target}_pch${n})
    add_library(${obj} OBJECT ${group_${n}_sources})
    foreach(p INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS COMPILE_FEATURES
              LINK_LIBRARIES CXX_STANDARD POSITION_INDEPENDENT_CODE)
      get_target_property(v ${target} ${p})
      if(v)
        set_property(TARGET ${obj} PROPERTY ${p} "${v}")
      endif()
    endforeach()
    target_compile_options(${obj} PRIVATE ${group_${n}_opts})
    set_source_files_properties(${group_${n}_sources} PROPERTIES COMPILE_OPTIONS "")
    target_precompile_headers(${obj} PRIVATE ${headers})
    list(APPEND kept $<TARGET_OBJECTS:${obj}>)
  endforeach()
  set_property(TARGET ${target} PROPERTY SOURCES ${kept})
  if(skipped)
    set_source_files_properties(${skipped} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
