# ctest script helper (include() it): ditto_run_checksum(LABEL SUM_VAR OUT_VAR COMMAND...) runs
# COMMAND and fails (FATAL_ERROR "FAIL: LABEL ...") unless it exits 0 and prints
# params_checksum=<hex>; sets SUM_VAR to the hex digits and OUT_VAR to its stdout.
function(ditto_run_checksum label sum_var out_var)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "FAIL: ${label} exited with ${rc}: ${out}${err}")
  endif()
  string(REGEX MATCH "params_checksum=([0-9a-f]+)" found "${out}")
  if(NOT found)
    message(FATAL_ERROR "FAIL: ${label}: no params_checksum in: ${out}")
  endif()
  set(${sum_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
