# ctest helper: runs ditto-train with --trainer dp and with --trainer ddp (other arguments the
# same, from ARGS, a ;-list) and fails unless both succeed and print the same params_checksum
# (bitwise mode: DistributedDataParallel computes what DataParallel computes).
#   cmake -DTRAIN=path/to/ditto-train "-DARGS=--epochs;2" -P compare_trainers.cmake
include(${CMAKE_CURRENT_LIST_DIR}/run_checksum.cmake)
foreach(trainer dp ddp)
  ditto_run_checksum("ditto-train --trainer ${trainer}" sum_${trainer} out ${TRAIN} --trainer ${trainer} ${ARGS})
  message(STATUS "--trainer ${trainer}: params_checksum=${sum_${trainer}}")
endforeach()
if(NOT sum_dp STREQUAL sum_ddp)
  message(FATAL_ERROR "--trainer ddp gave params_checksum=${sum_ddp}, --trainer dp ${sum_dp}")
endif()
