# ctest helper: examples/train_minimal (the README's "Train from C++" program) must succeed and
# print the params_checksum ditto-train prints for the same settings (--epochs 5, its other
# defaults), and a final val_acc above 0.95 (0.9694 when measured).
#   cmake -DMINIMAL=path/to/train_minimal -DTRAIN=path/to/ditto-train -P compare_train_minimal.cmake
cmake_policy(SET CMP0054 NEW)
include(${CMAKE_CURRENT_LIST_DIR}/run_checksum.cmake)
ditto_run_checksum(minimal sum_minimal out_minimal ${MINIMAL})
ditto_run_checksum(ditto-train sum_ditto-train out_ditto-train ${TRAIN} --epochs 5)
string(REGEX MATCH "final: [^\n]*val_acc=([0-9.]+)" found "${out_minimal}")
if(NOT found OR CMAKE_MATCH_1 LESS 0.95)
  message(FATAL_ERROR "FAIL: train_minimal: expected val_acc > 0.95 on its final line, got: ${out_minimal}")
endif()
if(NOT sum_minimal STREQUAL sum_ditto-train)
  message(FATAL_ERROR "FAIL: train_minimal params_checksum=${sum_minimal}, ditto-train --epochs 5 ${sum_ditto-train}")
endif()
message(STATUS "PASS: params_checksum=${sum_minimal} from both, val_acc=${CMAKE_MATCH_1}")
