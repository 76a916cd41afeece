# Every program's command line: usage errors, --version, --help, and ditto-bench's,
# bench_bitwise's and safetensors-info's option checks.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# The command lines' rough edges (issue 16; examples/cli_common.h): a usage error the option
# parser finds ends in "PROG: error: ..." and exit status 2 (argparse's and torchrun's, not
# CLI11's 104-114), with a did-you-mean for an unknown option; --version; --help in every
# program; options that would be silently ignored or wrapped are refused.
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainCli.UnknownOptionDidYouMean RC 2
    REGEX "^ditto-train: error: unrecognized arguments: --epoch 1\nditto-train: --epoch: did you mean --epochs\\?\nRun ditto-train --help for the options"
    COMMAND $<TARGET_FILE:ditto-train> --epoch 1)
  ditto_expect_exit(DittoTrainCli.UnknownOptionPrefixDidYouMean RC 2
    REGEX "^ditto-train: error: unrecognized arguments: --grad-accum 2\nditto-train: --grad-accum: did you mean --grad-accum-steps\\?"
    COMMAND $<TARGET_FILE:ditto-train> --grad-accum 2)
  # nanoGPT's train.py settings as configurator.py takes them (--key=value): ditto's option with
  # what differs, or what to do where ditto has none (train::nanogpt_option_hint).
  ditto_expect_exit(DittoTrainCli.NanoGptNamesGetDittosOption RC 2
    REGEX "^ditto-train: error: unrecognized arguments: --out_dir=out --learning_rate=1e-3 --gradient_accumulation_steps=2\nditto-train: --out_dir=out: did you mean --checkpoint\\? \\(nanoGPT's out_dir: ditto writes DIR/step-N/ checkpoints there\\)\nditto-train: --learning_rate=1e-3: did you mean --lr\\? \\(nanoGPT's learning_rate\\)\nditto-train: --gradient_accumulation_steps=2: did you mean --grad-accum-steps\\? \\(micro-steps per optimizer step of each device: nanoGPT's count divided by --devices, as train.py divides it by the world size\\)\nRun ditto-train --help"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --out_dir=out --learning_rate=1e-3 --gradient_accumulation_steps=2)
  # tester4 (6): nanoGPT's batch_size is one rank's micro-batch, its gradient_accumulation_steps
  # the whole job's; ditto's --batch-size is global, --grad-accum-steps each device's.
  ditto_expect_exit(DittoTrainCli.NanoGptBatchSizeSaysWhatItMaps RC 2
    REGEX "ditto-train: --batch_size=12: did you mean --batch-size\\? \\(the global batch: nanoGPT's batch_size x gradient_accumulation_steps; nanoGPT's batch_size is one rank's micro-batch\\)"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --batch_size=12)
  ditto_expect_exit(DittoTrainCli.NanoGptNamesWithoutEquivalentSaySo RC 2
    REGEX "^ditto-train: error: unrecognized arguments: --compile=False --decay_lr=False\nditto-train: --compile=False: nanoGPT's compile has no ditto equivalent: ditto has no torch.compile: its kernels are compiled ahead of time; leave it out\nditto-train: --decay_lr=False: nanoGPT's decay_lr has no ditto equivalent: the GPT's learning rate always follows"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --compile=False --decay_lr=False)
  ditto_expect_exit(DittoTrainCli.UnconvertibleValueExit2 RC 2
    REGEX "^ditto-train: error: [^\n]*--epochs[^\n]*x"
    COMMAND $<TARGET_FILE:ditto-train> --epochs x)
  ditto_expect_exit(DittoTrainCli.Version RC 0 REGEX "^ditto-train ${PROJECT_VERSION}( \\(git [^)]+\\))?\n$"
    COMMAND $<TARGET_FILE:ditto-train> --version)
  # CLI11 reads an unsigned option with strtoull, for which -1 is 2^64 - 1.
  ditto_expect_exit(DittoTrainCli.NegativeSeed RC 2
    REGEX "^ditto-train: error: --seed: expected an integer >= 0, got -1\n"
    COMMAND $<TARGET_FILE:ditto-train> --seed -1 --epochs 0)
  # A flag's value (a tester's cases): an empty one was read as true (--zero-overlap-comm=), a bad
  # one named no type ("expected a value of type , got 'maybe'").
  ditto_expect_exit(DittoTrainCli.FlagWithAnEmptyValue RC 2
    REGEX "^ditto-train: error: --zero-overlap-comm: expected true or false \\(also 1 / 0, yes / no, on / off; the flag alone is true\\), got ''\n"
    COMMAND $<TARGET_FILE:ditto-train> --zero-overlap-comm= --epochs 0)
  ditto_expect_exit(DittoTrainCli.FlagWithABadValue RC 2
    REGEX "^ditto-train: error: --bias: expected true or false \\(also 1 / 0, yes / no, on / off; the flag alone is true\\), got 'maybe'\n"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --bias=maybe --max-iters 0)
  # An option left without its value (last, or --zero-stage=) said "1 required INT missing".
  ditto_expect_exit(DittoTrainCli.OptionWithoutItsValue RC 2
    REGEX "^ditto-train: error: --zero-stage: expected 0 or 1, got no value\n"
    COMMAND $<TARGET_FILE:ditto-train> --epochs 0 --zero-stage=)
  # --interconnect and --straggler change only the cost model's times: without --profile (or
  # --trace) nothing would show them.
  ditto_expect_exit(DittoTrainCli.InterconnectWithoutProfile RC 2
    REGEX "^ditto-train: error: --interconnect: changes only the cost model's predicted times: expected --profile \\(or --trace\\) with it, got neither"
    COMMAND $<TARGET_FILE:ditto-train> --interconnect pcie4 --epochs 0)
  ditto_expect_exit(DittoTrainCli.StragglerWithoutProfile RC 2
    REGEX "^ditto-train: error: --straggler: changes only the cost model's predicted times: expected --profile \\(or --trace\\) with it, got neither"
    COMMAND $<TARGET_FILE:ditto-train> --straggler 1:2 --epochs 0)
  # A JSON profile's misspelt field is refused, not left at its default. It and a profile file
  # that cannot be read or parsed are usage errors naming --profile, with the loader's reason
  # (they failed in the run, exit 1, naming "device_profile").
  ditto_expect_exit(DittoTrainCli.ProfileUnknownField RC 2
    REGEX "^ditto-train: error: --profile: expected a device profile's JSON file \\(docs/prediction.md\\), got '[^']*profile_unknown_field.json': [^\n]*profile_unknown_field.json: unknown field 'memory_effciency' \\(did you mean 'memory_efficiency'\\?\\): expected one of key, name, source, fp32_tflops, "
    COMMAND $<TARGET_FILE:ditto-train> --profile ${CMAKE_CURRENT_SOURCE_DIR}/data/profile_unknown_field.json --epochs 0)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/profile_dir.json)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/profile_malformed.json "{\"fp32_tflops\": 1,\n")
  foreach(case "missing|/no/such/profile.json|cannot open '/no/such/profile.json': No such file or directory"
               "directory|${CMAKE_CURRENT_BINARY_DIR}/profile_dir.json|'[^']*profile_dir.json' is a directory, expected a regular file"
               "malformed|${CMAKE_CURRENT_BINARY_DIR}/profile_malformed.json|[^\n]*profile_malformed.json: malformed JSON: \\[json.exception.parse_error.101\\]")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 file)
    list(GET parts 2 why)
    ditto_expect_exit(DittoTrainCli.ProfileFile_${name} RC 2
      REGEX "^ditto-train: error: --profile: expected a device profile's JSON file \\(docs/prediction.md\\), got '[^']*': ${why}"
      COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --dry-run --profile ${file})
  endforeach()
  # A stray label of 100000 would make a 100001-class model: refused past 65535 (--classes too,
  # past 65536); --classes N (CrossEntropyLoss's num_classes) must exceed every label and sizes the
  # output layer (digits: 64-128-16, 10384 parameters, not 64-128-10's 9610).
  ditto_expect_exit(DittoTrainCli.LabelPastTheInferredLimit RC 1
    REGEX "^ditto-train: error: --data: [^\n]*label_100000.csv: the largest label is 100000, which would make a model of 100001 classes: expected labels 0..65535 \\(the most classes ditto-train's model has\\)"
    COMMAND $<TARGET_FILE:ditto-train> --data ${CMAKE_CURRENT_SOURCE_DIR}/data/label_100000.csv --epochs 0)
  ditto_expect_exit(DittoTrainCli.ClassesBelowTheLargestLabel RC 2
    REGEX "^ditto-train: error: --classes: expected a number of classes greater than every label \\(the largest in [^\n]*digits.csv is 9\\), got 9"
    COMMAND $<TARGET_FILE:ditto-train> --classes 9 --epochs 0)
  ditto_expect_exit(DittoTrainCli.ClassesSizeTheOutput RC 0
    REGEX "model=64-128-16 params=10384 .*final: backend=sim devices=4 determinism=bitwise epochs=1 "
    COMMAND $<TARGET_FILE:ditto-train> --classes 16 --epochs 1)
  ditto_expect_exit(DittoTrainCli.ClassesIsAnMlpOption RC 2
    REGEX "^ditto-train: error: --classes: expected --model mlp"
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --classes 16 --max-iters 1)
  # --resume auto: a restart loop's every run, the first one included, has the same command line.
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/resume_auto)
  ditto_expect_exit(DittoTrainCli.ResumeAutoStartsFreshThenResumes RC 0
    REGEX "--resume auto: no checkpoint in [^\n]*resume_auto: starting fresh\n.*final: [^\n]* epochs=1 .*--resume auto: [^\n]*resume_auto holds a checkpoint: resuming\nditto-train: resumed from [^\n]*resume_auto at step [0-9]+ \\(epoch 2, batch 0\\).*final: [^\n]* epochs=2 "
    COMMAND bash -c "rm -rf \"$2\" && \"$1\" --epochs 1 --checkpoint \"$2\" --resume auto && \"$1\" --epochs 2 --checkpoint \"$2\" --resume auto"
            _ $<TARGET_FILE:ditto-train> ${dir})
  ditto_expect_exit(DittoTrainCli.ResumeAutoNeedsCheckpoint RC 2
    REGEX "^ditto-train: error: --resume auto: expected --checkpoint DIR \\(auto resumes from DIR when it holds a checkpoint, else starts fresh\\), got no --checkpoint"
    COMMAND $<TARGET_FILE:ditto-train> --resume auto --epochs 1)
  # The README's first command and what it prints: ctest Docs.README (cmake/ditto_checks.cmake).
endif()
if(TARGET ditto-bench)
  ditto_expect_exit(DittoBenchCli.UnknownOptionDidYouMean RC 2 TIMEOUT 30
    REGEX "^ditto-bench: error: unrecognized arguments: --rank 2\nditto-bench: --rank: did you mean --ranks\\?"
    COMMAND $<TARGET_FILE:ditto-bench> collectives --rank 2)
  ditto_expect_exit(DittoBenchCli.Version RC 0 TIMEOUT 30 REGEX "^ditto-bench ${PROJECT_VERSION}"
    COMMAND $<TARGET_FILE:ditto-bench> --version)
  # The README's order, the option after the subcommand, and DIR made when missing.
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/bench_csv_dir)
  ditto_expect_exit(DittoBenchCli.CsvDirAfterTheSubcommand RC 0 TIMEOUT 60
    REGEX "# ditto-bench: done in .*\nbackend,op,ranks,place,determinism,bytes,count,iters,time_us,algbw_GBps,busbw_GBps,mem_GBps,wrong,dtype\nsim,all_reduce,2,"
    COMMAND bash -c "rm -rf \"$2\" && \"$1\" collectives --csv-dir \"$2/new\" --ops all_reduce --ranks 2 --min-bytes 4K --max-bytes 4K --coll-seconds 0.001 --max-iters 1 && cat \"$2/new/collectives.csv\""
            _ $<TARGET_FILE:ditto-bench> ${dir})
endif()
# bench_bitwise and bench_ddp: --help prints the options instead of running minutes of benchmark.
foreach(bench bench_bitwise bench_ddp)
  if(TARGET ${bench})
    ditto_expect_exit(BenchCli.${bench}_Help RC 0 TIMEOUT 20 REGEX "--quick[^\n]*smoke run.*--version"
      COMMAND $<TARGET_FILE:${bench}> --help)
    ditto_expect_exit(BenchCli.${bench}_UnknownOption RC 2 TIMEOUT 20
      REGEX "^${bench}: error: unrecognized arguments: --quik\n${bench}: --quik: did you mean --quick\\?"
      COMMAND $<TARGET_FILE:${bench}> --quik)
  endif()
endforeach()
# bench_bitwise --gemm-only --csv (bench/compare.sh's GEMM rows, issue 15): the CSV has the header
# and one row per GEMM with both figures and their ratio, and no trainer rows; a path it cannot
# write is refused before anything runs.
if(TARGET bench_bitwise)
  set(csv ${CMAKE_CURRENT_BINARY_DIR}/bench_bitwise_gemm.csv)
  ditto_expect_exit(BenchCli.bench_bitwise_GemmOnlyCsv RC 0 TIMEOUT 120
    REGEX "^benchmark,bitwise,fast,unit,ratio\ngemm 64x64,[0-9.]+,[0-9.]+,GFLOP/s,[0-9.]+\ngemm 256x256,[0-9.]+,[0-9.]+,GFLOP/s,[0-9.]+\ngemm 512x512,[0-9.]+,[0-9.]+,GFLOP/s,[0-9.]+\ngemm 64x1024x784 NT \\(fc1 b64\\),[0-9.]+,[0-9.]+,GFLOP/s,[0-9.]+\n$"
    COMMAND bash -c "rm -f \"$2\" && \"$1\" --quick --gemm-only --csv \"$2\" > /dev/null && cat \"$2\""
            _ $<TARGET_FILE:bench_bitwise> ${csv})
  ditto_expect_exit(BenchCli.bench_bitwise_CsvPathItCannotWrite RC 1 TIMEOUT 20
    REGEX "^bench_bitwise: error: --csv: cannot open '/nonexistent-dir/g.csv' for writing: No such file or directory\n$"
    COMMAND $<TARGET_FILE:bench_bitwise> --gemm-only --csv /nonexistent-dir/g.csv)
endif()
if(TARGET safetensors-info)
  ditto_expect_exit(SafetensorsInfoCli.UnknownOptionDidYouMean RC 2
    REGEX "^safetensors-info: error: unknown option '--al'\nsafetensors-info: --al: did you mean --all\\?"
    COMMAND $<TARGET_FILE:safetensors-info> --al file.safetensors)
  ditto_expect_exit(SafetensorsInfoCli.NoFile RC 2
    REGEX "^safetensors-info: error: expected one FILE.safetensors, got 0\nusage: safetensors-info"
    COMMAND $<TARGET_FILE:safetensors-info> --all)
  ditto_expect_exit(SafetensorsInfoCli.Version RC 0 REGEX "^safetensors-info ${PROJECT_VERSION}"
    COMMAND $<TARGET_FILE:safetensors-info> --version)
endif()

# ditto-bench's option checks: a value that would time nothing, overflow the iteration count or
# exhaust the host's memory ends in "ditto-bench: error: <option>: expected ..., got ..." and
# exit status 1, before any sweep.
if(TARGET ditto-bench)
  foreach(case
      "max-iters-0|--max-iters;0|--max-iters: expected >= 1, got 0"
      "max-iters-neg|--max-iters;-1|--max-iters: expected >= 1, got -1"
      "coll-seconds-neg|--coll-seconds;-1|--coll-seconds: expected a value > 0 and <= 3600, got -1"
      "coll-seconds-nan|--coll-seconds;nan|--coll-seconds: expected a value > 0 and <= 3600, got nan"
      "coll-seconds-huge|--coll-seconds;1e300|--coll-seconds: expected a value > 0 and <= 3600, got 1e\\+300"
      "max-bytes-1e30|--max-bytes;1e30|--max-bytes: expected a size <= 4G"
      "max-bytes-64G|--max-bytes;64G|--max-bytes: expected a size <= 4G \\(one buffer per rank in host memory\\), got '64G'"
      "dtype-unknown|--dtype;float7|--dtype: expected float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, f8e4m3, f8e5m2 \\(nccl-tests' names\\), a ditto dtype name \\(f32, f16, bf16, ...\\) or all, got 'float7'"
      "ops-unknown|--ops;alltoallv|--ops: expected all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all \\(alltoall\\), sendrecv, gather or scatter, got 'alltoallv'")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 opt)
    list(GET parts 2 opt_value)
    list(GET parts 3 regex)
    ditto_expect_exit(DittoBenchCli.${name} RC 1 REGEX "ditto-bench: error: ${regex}" TIMEOUT 30
      COMMAND $<TARGET_FILE:ditto-bench> collectives ${opt} ${opt_value})
  endforeach()
  # Every collective in every dtype (nccl-tests' names and ditto's), one small size, both modes:
  # the checked call of each finds no wrong element.
  foreach(mode fast bitwise)
    ditto_expect_exit(DittoBenchCli.EveryCollectiveEveryDtype_${mode} RC 0
      REGEX "Out of bounds values : 0 OK" TIMEOUT 60
      COMMAND $<TARGET_FILE:ditto-bench> collectives --ops
              all_reduce,alltoall,sendrecv,gather,scatter,reduce_scatter,all_gather,broadcast,reduce
              -d all --ranks 1,3,4 --min-bytes 4K --max-bytes 4K --coll-seconds 0.001
              --max-iters 1 --determinism ${mode})
  endforeach()
  # int8 and uint8 sums over 32 ranks pass 127 and 255 and wrap, in the collective as in NCCL:
  # the reference wraps too (it saturated, and the bench counted 37376 correct elements wrong).
  ditto_expect_exit(DittoBenchCli.IntegerSumsWrapAt32Ranks RC 0
    REGEX "Out of bounds values : 0 OK" TIMEOUT 60
    COMMAND $<TARGET_FILE:ditto-bench> collectives --ops all_reduce,reduce_scatter,reduce
            -d int8,uint8 --ranks 32 --min-bytes 1K --max-bytes 1K --coll-seconds 0.001
            --max-iters 1)
  # nccl-tests' short options (-b -e -f -n -w -g: it refused -b though --help named it), redop
  # none / root -1 where the op has none (it printed sum and 0 for every op), and nccl-tests'
  # closing "Avg bus bandwidth" line.
  ditto_expect_exit(DittoBenchCli.NcclTestsOptionsAndSummary RC 0 TIMEOUT 60
    REGEX "# all_gather  backend=sim ranks=2 determinism=fast dtype=float redop=none root=-1
.*
 +1024 +256 [^
]*
 +4096 +1024 [^
]*
#
# reduce  backend=sim ranks=2 determinism=fast dtype=float redop=sum root=0
.*# Out of bounds values : 0 OK
# Avg bus bandwidth    : [0-9.]+(e[-+][0-9]+)?
#
"
    COMMAND $<TARGET_FILE:ditto-bench> collectives -b 1K -e 4K -f 4 -n 1 -w 0 -g 2
            --ops all_gather,reduce --coll-seconds 0.001)
  # Sizes as nccl-tests prints them: all_to_all of 64 int8 elements over 3 ranks moves 63 (the
  # size column says 63, not the 64 asked for), and 1 byte over 3 ranks is a "skipped" line.
  ditto_expect_exit(DittoBenchCli.PrintsTheSizeThatMoves RC 0
    REGEX "# +1 B: skipped \\(less than one i8 element per rank\\).* 63 +63 "
    TIMEOUT 30
    COMMAND $<TARGET_FILE:ditto-bench> collectives --ops all_to_all -d int8 --ranks 3
            --min-bytes 1 --max-bytes 64 --step-factor 64 --coll-seconds 0.001 --max-iters 1)
endif()
