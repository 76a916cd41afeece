# ctest helper: --trainer ddp where rank 0 fails on its own after a training collective (the
# checkpoint of step 1, --checkpoint-every 1, cannot publish DIR/latest: it is a non-empty
# directory) while the other ranks wait in the next step's collectives. Their errors, caused by
# rank 0's abort, may arrive first; the run must still report rank 0's own error, every time (RUNS
# runs). (The final checkpoint's failure no longer fails the run: Note [Checkpoint failures].)
#   cmake -DTRAIN=path/to/ditto-train -DDIR=scratch/dir -DRUNS=6 -P ditto_train_ddp_root_error.cmake
foreach(i RANGE 1 ${RUNS})
  file(REMOVE_RECURSE ${DIR})
  file(MAKE_DIRECTORY ${DIR}/latest/blocker)
  execute_process(COMMAND ${TRAIN} --trainer ddp --devices 4 --epochs 1 --checkpoint ${DIR}
                          --checkpoint-every 1
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc STREQUAL "1" OR NOT err MATCHES
     "ditto-train: error: --checkpoint: the checkpoint of step 1 was not written: io::write_file_replace: cannot write '[^']*latest': it is a directory")
    message(FATAL_ERROR "FAIL run ${i}: expected exit status 1 and rank 0's own error, got ${rc}:\n${out}${err}")
  endif()
endforeach()
file(REMOVE_RECURSE ${DIR})
message(STATUS "PASS: ${RUNS} runs reported rank 0's own error")
