# ctest helper: runs ditto-train --trainer dp in one process with --devices NP, then
# `mpirun -np NP ditto-train --trainer ddp` (one rank per process, MPI), other arguments the same
# (ARGS, a ;-list), and fails unless both succeed, the mpirun job prints exactly one final line
# (rank 0's) and both print the same params_checksum (bitwise mode).
#   cmake -DTRAIN=ditto-train "-DMPIRUN=mpiexec;--oversubscribe" -DNP=4 "-DARGS=--epochs;2"
#         -P compare_mpi_trainer.cmake
execute_process(COMMAND ${TRAIN} --trainer dp --devices ${NP} ${ARGS}
                OUTPUT_VARIABLE out_dp ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ditto-train --trainer dp --devices ${NP} failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${MPIRUN} -np ${NP} ${TRAIN} --trainer ddp ${ARGS}
                OUTPUT_VARIABLE out_mpi ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mpirun -np ${NP} ditto-train --trainer ddp failed (${rc}): ${err}\n${out_mpi}")
endif()
foreach(run dp mpi)
  string(REGEX MATCHALL "final: [^\n]*params_checksum=([0-9a-f]+)" finals "${out_${run}}")
  list(LENGTH finals n_finals)
  if(NOT n_finals EQUAL 1)
    message(FATAL_ERROR "${run}: expected one final line, got ${n_finals} in: ${out_${run}}")
  endif()
  string(REGEX MATCH "params_checksum=([0-9a-f]+)" found "${finals}")
  set(sum_${run} ${CMAKE_MATCH_1})
  message(STATUS "${run}: params_checksum=${CMAKE_MATCH_1}")
endforeach()
if(NOT sum_dp STREQUAL sum_mpi)
  message(FATAL_ERROR "mpirun -np ${NP} --trainer ddp gave params_checksum=${sum_mpi}, "
                      "--trainer dp --devices ${NP} ${sum_dp}")
endif()
