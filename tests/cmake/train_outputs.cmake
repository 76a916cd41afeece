# What ditto-train and the small programs write: checkpoints, --metrics-jsonl,
# train_minimal and api_tour (the README's programs), safetensors-info, habits, output paths.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# Checkpoints end to end: stop and resume, SIGKILL while writing a checkpoint, a truncated
# checkpoint, mismatched settings (tests/ditto_train_checkpoint.sh says what each step checks).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.CheckpointResumeKillAndFallback RC 0 REGEX "PASS" TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_checkpoint.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_checkpoint)
  # tester4: a final checkpoint that does not fit keeps the result (final line, sample,
  # --export), a periodic one stops the run, --resume A --checkpoint B over B's run is refused,
  # --resume DIR/step-N, unusable output paths exit 2, Ctrl-C in the sample
  # (tests/ditto_train_checkpoint_flow.sh says what each step checks).
  ditto_expect_exit(DittoTrainCli.CheckpointFlowWhenSomethingFails RC 0 REGEX "PASS" TIMEOUT 180
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_checkpoint_flow.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_checkpoint_flow)
endif()

# --metrics-jsonl: the JSON lines hold the epoch lines' and the final line's values.
if(TARGET ditto-train)
  ditto_pass_fail_test(DittoTrainCli.MetricsJsonl TIMEOUT 60
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_metrics_jsonl.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_metrics_jsonl)
endif()

# examples/train_minimal (the README's "Train from C++"): the Trainer in 30 lines gives
# ditto-train's bits for the same settings.
if(TARGET ditto-train AND TARGET train_minimal)
  ditto_pass_fail_test(TrainMinimal.SameChecksumAsDittoTrain TIMEOUT 120
    COMMAND ${CMAKE_COMMAND} -DMINIMAL=$<TARGET_FILE:train_minimal>
            -DTRAIN=$<TARGET_FILE:ditto-train>
            -P ${CMAKE_CURRENT_SOURCE_DIR}/compare_train_minimal.cmake)
endif()
# A missing CSV ended train_minimal in std::terminate (no try/catch in the program the README
# tells users to copy): now the error and exit status 1.
if(TARGET train_minimal)
  ditto_expect_exit(TrainMinimal.AMissingCsvIsAnErrorNotACrash RC 1
    REGEX "train_minimal: error: read_csv: cannot open '/nonexistent/digits.csv'"
    COMMAND $<TARGET_FILE:train_minimal> /nonexistent/digits.csv)
endif()
ditto_pass_fail_test(TrainMinimal.ReadmeShowsTheProgram
  COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md
          -DSOURCE=${PROJECT_SOURCE_DIR}/examples/train_minimal.cpp
          -P ${CMAKE_CURRENT_SOURCE_DIR}/readme_train_minimal.cmake)
# docs/api.md's "The API in one page" is examples/api_tour.cpp, which runs and checks its values.
if(TARGET api_tour)
  ditto_expect_exit(ApiTour.Runs RC 0 REGEX "^api_tour: OK" COMMAND $<TARGET_FILE:api_tour>)
endif()
ditto_pass_fail_test(ApiTour.ReadmeShowsTheProgram
  COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/docs/api.md
          -DSOURCE=${PROJECT_SOURCE_DIR}/examples/api_tour.cpp
          "-DSECTION=The API in one page"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/readme_train_minimal.cmake)

# safetensors-info: --help, an intact checkpoint file, and one whose CRC-32 does not match
# (tests/safetensors_info.sh says what each step checks).
if(TARGET ditto-train AND TARGET safetensors-info)
  ditto_expect_exit(SafetensorsInfoCli.HelpAndCrcMismatchWarning RC 0 REGEX "PASS"
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_info.sh
            $<TARGET_FILE:safetensors-info> $<TARGET_FILE:ditto-train>
            ${CMAKE_CURRENT_BINARY_DIR}/safetensors_info
            ${CMAKE_CURRENT_SOURCE_DIR}/data/dtype_ref.safetensors)
endif()

# Habits users bring (issue 31; tests/ditto_train_habits.sh says what each section checks):
# progress lines, a dry run that prints only what ran, usage errors, settings that do nothing.
if(TARGET ditto-train)
  foreach(section "progress|ProgressLines" "dry_run|PrintsOnlyWhatRan"
                  "cli|UsageErrorsExit2LastValueWins" "settings|SettingsThatDoNothingWarn")
    string(REPLACE "|" ";" parts "${section}")
    list(GET parts 0 key)
    list(GET parts 1 name)
    ditto_pass_fail_test(DittoTrainCli.${name} TIMEOUT 120
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_habits.sh
              $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_habits_${key}
              ${key})
  endforeach()
endif()

# Output paths and bounded inputs (Notes [Atomic write] and [Bounded reads] in core/io/file.h):
# --trace through a symbolic link and into a FIFO, --data / safetensors-info refusing /dev/zero
# and a FIFO (tests/ditto_train_output_paths.sh says what each step checks).
if(TARGET ditto-train AND TARGET safetensors-info)
  ditto_pass_fail_test(DittoTrainCli.OutputPathsAndBoundedInputs TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_output_paths.sh
            $<TARGET_FILE:ditto-train> $<TARGET_FILE:safetensors-info>
            ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_output_paths)
endif()

# An output over the run's own input (the validation shard, a --data list's or glob's file, the
# --init-from file, by identity), over another output or into a checkpoint directory, and a
# read-only file given to any output, are refused at the start (exit 2) and left as they were
# (io::check_outputs_are_not_inputs; tests/ditto_train_output_clashes.sh says each case).
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.OutputsNeverOverwriteInputsOrReadOnlyFiles RC 0 REGEX "PASS"
    TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_output_clashes.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_SOURCE_DIR}/data/gpt2_tiny
            ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_output_clashes)
endif()

# Issue 31: outputs written in place (/dev/stdout piped and redirected, --trace and
# --metrics-jsonl) keep every line and never split one; /dev/full fails before training
# (tests/ditto_train_special_outputs.sh).
if(TARGET ditto-train)
  ditto_pass_fail_test(DittoTrainCli.SpecialOutputsInPlaceAndCheckedAtStart TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_special_outputs.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_special_outputs)
  # Note [Graceful stop]: SIGTERM / SIGINT with --checkpoint finish the step, write a checkpoint
  # and exit 143 / 130; resumed, the run ends with the checksum of one that never stopped.
  ditto_expect_exit(DittoTrainCli.SigtermWritesACheckpointAndResumes RC 0 REGEX "PASS"
    TIMEOUT 240 PROCESSORS 2
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_stop.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_stop)
  # --resume given a file: what it is, not "does not exist".
  ditto_expect_exit(DittoTrainCli.ResumeFromARegularFileSaysWhatItIs RC 2
    REGEX "ditto-train: error: --resume: expected a checkpoint directory \\(the --checkpoint DIR of an earlier run, or one of its DIR/step-N\\), got '[^']*digits.csv', a regular file"
    COMMAND $<TARGET_FILE:ditto-train> --resume ${PROJECT_SOURCE_DIR}/examples/data/digits.csv)
endif()
