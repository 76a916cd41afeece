# The installed package as a user's project sees it, tools/gpu-check.sh's
# rehearsal and bench/torch_gpu_bench.py's smoke run.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# Install into an empty prefix, then use it as a user would: the installed ditto-train, the
# consumer project examples/consumer (find_package(ditto)), every installed header compiled alone
# (tests/install_consumer.cmake says what each step checks). Needs the whole build done (it
# installs ditto-train, ditto-bench and safetensors-info too).
# Not in a sanitizer build: the installed static libraries need the consumer to link the sanitizer
# runtimes too (undefined __asan_* / __ubsan_*); tools/test-all.sh runs it in the normal build.
if(TARGET ditto-train AND TARGET ditto-bench AND TARGET safetensors-info AND NOT DITTO_SANITIZE)
  add_test(NAME Install.ConsumerBuildsAndRuns
           COMMAND ${CMAKE_COMMAND} -DBUILD=${CMAKE_BINARY_DIR} -DSOURCE=${PROJECT_SOURCE_DIR}
                   -DWORK=${CMAKE_CURRENT_BINARY_DIR}/install_consumer
                   "-DGENERATOR=${CMAKE_GENERATOR}" -DCXX=${CMAKE_CXX_COMPILER}
                   "-DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}"
                   -DHEADERS=${CMAKE_BINARY_DIR}/public_headers.txt
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/install_consumer.cmake)
  # Passes on exit status 0: every failed step ends the script with FATAL_ERROR (status 1).
  set_tests_properties(Install.ConsumerBuildsAndRuns PROPERTIES TIMEOUT 600 PROCESSORS 2)
endif()

# Issue 28: tools/gpu-check.sh rehearsed on this machine (--rehearsal: a stand-in nvidia-smi, tiny
# sizes, this build's programs): it must run to its end, write results.md with its tables, and see
# every CUDA step fail with the backend's clean "no CUDA device" error and every other step pass.
# Only where the CUDA backend is built (without it there is no CUDA step to rehearse); not under
# TSan (its speed section dry-runs the GPT-2 124M, see the TSan note below).
if(DITTO_CUDA_ENABLED AND TARGET ditto-train AND NOT DITTO_SANITIZE MATCHES "thread")
  ditto_expect_exit(GpuCheck.Rehearsal RC 0 TIMEOUT 300
    REGEX "gpu-check: rehearsal: PASS: [0-9]+ CUDA steps failed with the clean 'no CUDA device' error"
    COMMAND bash ${PROJECT_SOURCE_DIR}/tools/gpu-check.sh --rehearsal --build ${CMAKE_BINARY_DIR}
            --out ${CMAKE_CURRENT_BINARY_DIR}/gpu-check-rehearsal --budget 240 --jobs 2)
endif()
# gpu-check's gtest_step on a stand-in test binary: a listed CUDA test that hangs or crashes is left
# out and the rest of the list rerun (a first GPU run's hang lost the rest of the list).
add_test(NAME GpuCheck.HungOrCrashedTestIsLeftOutAndTheRestRerun
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check_gtest_step.sh
                 ${PROJECT_SOURCE_DIR}/tools/gpu-check.sh ${CMAKE_CURRENT_BINARY_DIR}/gpu_check_gtest_step)
set_tests_properties(GpuCheck.HungOrCrashedTestIsLeftOutAndTheRestRerun PROPERTIES
                     TIMEOUT 60 PASS_REGULAR_EXPRESSION "PASS")
# gpu-check's speed section prices the GPU nvidia-smi names (--profile h100-sxm on an H100).
add_test(NAME GpuCheck.DryRunProfileIsTheCardsOwn
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check_profile.sh
                 ${PROJECT_SOURCE_DIR}/tools/gpu-check.sh)
set_tests_properties(GpuCheck.DryRunProfileIsTheCardsOwn PROPERTIES
                     TIMEOUT 30 PASS_REGULAR_EXPRESSION "^PASS")
# gpu-check --rehearsal over a stand-in build that finds a GPU unless CUDA_VISIBLE_DEVICES hides it:
# the rehearsal hides it (on the GPU machine, the check's ctest step runs GpuCheck.Rehearsal),
# --results gets results.md and logs.tar.gz only (the device brings back at most 8 files), and
# every sanitizer row keeps its status (review 2 of issue 29).
add_test(NAME GpuCheck.RehearsalHidesTheGpuAndResultsComeBackAsTwoFiles
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check_rehearsal_stand_in.sh
                 ${PROJECT_SOURCE_DIR}/tools/gpu-check.sh
                 ${CMAKE_CURRENT_BINARY_DIR}/gpu_check_rehearsal_stand_in)
set_tests_properties(GpuCheck.RehearsalHidesTheGpuAndResultsComeBackAsTwoFiles PROPERTIES
                     TIMEOUT 120 PASS_REGULAR_EXPRESSION "PASS: gpu-check: rehearsal: PASS")
# gpu-check's speed section on a stand-in ditto-train: ditto's tokens/s is B x T / the median of
# the timed steps' times (PyTorch's column's rule), not the last evaluation line's, which covered
# one step of ten (review 2 of issue 29).
add_test(NAME GpuCheck.SpeedIsTheMedianOfTheTimedSteps
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check_speed.sh
                 ${PROJECT_SOURCE_DIR}/tools/gpu-check/speed.sh
                 ${CMAKE_CURRENT_BINARY_DIR}/gpu_check_speed)
set_tests_properties(GpuCheck.SpeedIsTheMedianOfTheTimedSteps PROPERTIES
                     TIMEOUT 60 PASS_REGULAR_EXPRESSION "PASS: char-f32 163840")
# bench/torch_gpu_bench.py (the PyTorch side of gpu-check's speed table) on the CPU, tiny models:
# the script runs and writes its four rows. Skipped (status 77) where /usr/bin/python3 has no torch.
add_test(NAME TorchGpuBench.CpuSmoke
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/torch_gpu_bench_smoke.sh
                 ${PROJECT_SOURCE_DIR}/bench/torch_gpu_bench.py
                 ${CMAKE_CURRENT_BINARY_DIR}/torch_gpu_bench_smoke)
set_tests_properties(TorchGpuBench.CpuSmoke PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
