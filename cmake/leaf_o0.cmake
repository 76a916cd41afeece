# Note [Leaf targets at -O0]
# DITTO_LEAF_O0=ON (the check preset, CI) compiles the sources of the targets that sit on top of
# ditto's libraries (the test binary, the programs of examples/ and bench/) at -O0 and links
# those libraries first. Under ASan + UBSan at -O1 these sources were half of the check build's
# compile time (the test batches 649 s of CPU, examples/ and bench/ 212 s, the libraries 610 s;
# a22ebbf, 2-core machine), while what they run is mostly the libraries' code, which stays at -O1.
# At -O0: ditto_train.cpp compiles in 14 s of CPU instead of 37 s; the test batches, in about
# 230 s instead of 649 s.
# Why the libraries go first: a linker keeps the first copy it meets of an inline function or a
# template instantiation (a COMDAT group), and a program's own objects come before the static
# libraries it links. At -O0 alone a program ran its own unoptimised copies of the libraries'
# header code (Tensor's accessors, the dtype conversions, the portable maths): the gtest cases
# took 748 s of CPU instead of 354 s. Linked with --whole-archive ahead of the program's objects,
# the libraries' copy of every inline function they emit is the one kept. A function a library
# inlined everywhere has no copy of its own there: a program that calls it in a hot loop of its
# own runs it at -O0; ditto_tests keeps such sources at -O1 in a library of their own, linked
# first too (Note [Test sources at -O0], tests/CMakeLists.txt).
# Measured at 3d81097 on a 2-core machine: ditto_tests' 180 grouped ctests ran in 130.6 s of
# wall (-j2) against 130.5 s with every test source at -O1.
# Off by default: a Release build's programs are optimised, and nothing else changes.
option(DITTO_LEAF_O0 "Compile tests, programs and benchmarks at -O0, ditto's libraries linked first (CI)"
       OFF)

# ditto_leaf_o0(<target> [<library>...]): with DITTO_LEAF_O0, <target>'s own sources at -O0, and
# the <library>s, then ditto_sim, ditto_core and ditto_cuda (those that exist; the order: Note
# [Cold library sources at -O0]), linked with
# --whole-archive ahead of its objects (a target's LINK_OPTIONS come before its objects on
# CMake's link line, CMAKE_CXX_LINK_EXECUTABLE). The target must link the libraries as usual
# too (through ditto), which orders their builds before its link. Does nothing otherwise.
function(ditto_leaf_o0 target)
  if(NOT DITTO_LEAF_O0)
    return()
  endif()
  # After the build's -O1 (add_compile_options): the last -O wins. A source's own
  # COMPILE_OPTIONS come after these.
  target_compile_options(${target} PRIVATE -O0)
  set(files "")
  foreach(lib IN ITEMS ${ARGN} ditto_sim ditto_core ditto_cuda)
    if(TARGET ${lib})
      list(APPEND files $<TARGET_FILE:${lib}>)
    endif()
  endforeach()
  target_link_options(${target} PRIVATE LINKER:--whole-archive ${files} LINKER:--no-whole-archive)
endfunction()

# Note [Cold library sources at -O0]
# With DITTO_LEAF_O0 the core library's sources that read, write or check files and settings
# (checkpoints, safetensors, the weights' import and export, metrics, options, the launcher) are
# compiled at -O0 too: under ASan + UBSan at -O1 they were a third of its compile time (105 s
# of CPU of 330 s at e3048b2, Ninja's log; most of it nlohmann::json's and <regex>'s templates;
# gpt_weights.cpp 23.4 s at -O1, 11.7 s at -O0), while the tests spend their time in the
# kernels, collectives and layers. They go last in their library's archive: ditto_leaf_o0 links the
# libraries with --whole-archive, the linker keeps the first copy it meets of an inline function
# or template (Note [Leaf targets at -O0]), so what a cold source shares with the others (Tensor's
# accessors, the dtype conversions) is kept from an optimised object; only what no other object
# emits runs at -O0. ditto_sim goes ahead of ditto_core for this: the simulator's trace writer
# (trace.cpp, hot in a dry run's trace) shares nlohmann::json's code with the cold sources, and
# behind them it ran their -O0 copies (DittoTrainCli.DryRunOutOfMemoryWritesItsTrace 5.1 s, then
# 13.9 s). ditto_cuda stays last: its .cu objects are g++'s, without the sanitizers, and an
# instrumented copy of what they share with the others is the one to keep.
# Measured on one idle 2-core machine, the 83 ctests that write or read checkpoints, weights,
# metrics, profiles and traces (-j2): 59.4 s of wall before, 52.5 s with the cold sources at -O0
# and ditto_sim first (67.8 s with them at -O0 and ditto_core first).
# ditto_cold_o0(<sources variable> <regex>...): with DITTO_LEAF_O0, the sources of the list that
# match a regex compiled at -O0 and moved to its end. Call before add_library. Does nothing
# otherwise.
function(ditto_cold_o0 sources_var)
  if(NOT DITTO_LEAF_O0)
    return()
  endif()
  list(JOIN ARGN "|" regex)
  set(cold ${${sources_var}})
  list(FILTER cold INCLUDE REGEX "${regex}")
  set(hot ${${sources_var}})
  list(FILTER hot EXCLUDE REGEX "${regex}")
  set(${sources_var} ${hot} ${cold} PARENT_SCOPE)
  set_property(SOURCE ${cold} APPEND PROPERTY COMPILE_OPTIONS -O0)
endfunction()
