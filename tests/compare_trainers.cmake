# ctest helper: runs ditto-train with --trainer dp and with --trainer ddp (other arguments the
# same, from ARGS, a ;-list) and fails unless both succeed and print the same params_checksum
# (bitwise mode: DistributedDataParallel computes what DataParallel computes).
#   cmake -DTRAIN=path/to/ditto-train "-DARGS=--epochs;2" -P compare_trainers.cmake
foreach(trainer dp ddp)
  execute_process(COMMAND ${TRAIN} --trainer ${trainer} ${ARGS}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ditto-train --trainer ${trainer} failed (${rc}): ${err}")
  endif()
  string(REGEX MATCH "params_checksum=([0-9a-f]+)" found "${out}")
  if(NOT found)
    message(FATAL_ERROR "ditto-train --trainer ${trainer}: no params_checksum in: ${out}")
  endif()
  set(sum_${trainer} ${CMAKE_MATCH_1})
  message(STATUS "--trainer ${trainer}: params_checksum=${CMAKE_MATCH_1}")
endforeach()
if(NOT sum_dp STREQUAL sum_ddp)
  message(FATAL_ERROR "--trainer ddp gave params_checksum=${sum_ddp}, --trainer dp ${sum_dp}")
endif()
