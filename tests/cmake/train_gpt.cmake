# ditto-train --model gpt.
# include()d by tests/CMakeLists.txt: its directory, ditto_expect_exit, CMAKE_CURRENT_SOURCE_DIR.

# ditto-train --model gpt (tests/ditto_train_gpt.sh says what each step checks), and its option
# checks: each bad value ends the run at startup with "ditto-train: error: <option>: expected ...".
if(TARGET ditto-train)
  ditto_expect_exit(DittoTrainGpt.OneChecksumForAnyDeviceCountResumeAndDropout RC 0 REGEX "PASS"
    TIMEOUT 120
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_gpt.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt)
  # Issue 32's weights (tests/ditto_train_weights.sh says what each step checks): --init-from an
  # llm.c / Hugging Face / checkpoint file, --eval-only, --export round trips.
  ditto_expect_exit(DittoTrainWeights.InitFromEvalOnlyExportRoundTrips RC 0 REGEX "PASS"
    TIMEOUT 300
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_weights.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_SOURCE_DIR}/data/gpt2_tiny
            ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_weights)
  # Session 56 (B1): --init-from a character model's checkpoint on another text encodes it, and
  # decodes the sample, with the checkpoint's vocabulary; a byte outside it is refused
  # (tests/ditto_train_init_from_vocab.sh).
  ditto_pass_fail_test(DittoTrainGpt.InitFromCheckpointKeepsItsVocabulary TIMEOUT 60
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_init_from_vocab.sh
            $<TARGET_FILE:ditto-train> ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_init_from_vocab)
  # What a nanoGPT user meets (tester4; tests/ditto_train_nanogpt.sh says what each section
  # checks): the erf GELU refused, nanoGPT's ckpt.pt named and converted, resume messages, the
  # defaults typed out (tester5).
  foreach(section gelu torch_file convert resume typed_defaults)
    ditto_pass_fail_test(DittoTrainNanoGpt.${section} TIMEOUT 120
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_nanogpt.sh
              $<TARGET_FILE:ditto-train> ${PROJECT_SOURCE_DIR}
              ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_nanogpt_${section} ${section})
  endforeach()
  # (exit 77: skipped where /usr/bin/python3 has no torch)
  set_tests_properties(DittoTrainNanoGpt.convert PROPERTIES SKIP_RETURN_CODE 77)
  # --dtype bf16 / f16 (tests/ditto_train_amp.sh): one checksum for 1, 2, 4, 8 devices x dp, ddp,
  # the GradScaler's line, a bf16 checkpoint resumed bit-exactly (f32 master weights).
  ditto_expect_exit(DittoTrainAmp.OneChecksumForAnyDeviceCountAndResume RC 0 REGEX "PASS"
    TIMEOUT 240
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_amp.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_amp)
  # Issue 32: llm.c shards and nanoGPT's train.bin (tests/ditto_train_gpt_tokens.sh): one checksum
  # for 1, 2, 4, 8 devices x dp, ddp and mpirun -np 2 (when MPI is built) on 3 shards made at test
  # time, the same from a comma list and from nanoGPT's raw tokens, and the CLI's refusals.
  set(ditto_tokens_mpirun)
  if(DITTO_MPI_ENABLED)
    set(ditto_tokens_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  endif()
  ditto_expect_exit(DittoTrainGpt.TokenShardsOneChecksumForAnyDeviceCount RC 0 REGEX "PASS"
    TIMEOUT 240 PROCESSORS 2
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_gpt_tokens.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_tokens
            ${ditto_tokens_mpirun})
  # Issue 32's hostile newcomer, the data side (tests/ditto_train_gpt_token_refusals.sh): a FIFO
  # refused at once, an unreadable shard "cannot open", validation files' errors naming
  # --val-data, a bracket glob finding the val shard, a vocabulary naming --init-from.
  ditto_expect_exit(DittoTrainGpt.TokenDataRefusalsNameTheirSource RC 0 REGEX "PASS"
    TIMEOUT 240
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ditto_train_gpt_token_refusals.sh
            $<TARGET_FILE:ditto-train> ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_token_refusals)
  # --profile predicts the GPT's step from the simulator's kernel costs.
  ditto_expect_exit(DittoTrainGpt.ProfilePredictsTheStep RC 0 TIMEOUT 60
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16
            --batch-size 8 --max-iters 4 --eval-interval 4 --eval-iters 1 --warmup-iters 1
            --lr-decay-iters 4 --sample 0 --profile h100-sxm --devices 2
    REGEX "final: backend=sim devices=2 determinism=bitwise iters=4 .*predicted: 2 x NVIDIA H100 SXM5 80GB \\(1 node, nvlink\\) step_time=[0-9.]+ ms samples/s=[0-9]+ tokens/s=[0-9]+ comm_share=")
  # Issue 31 item 1: a padded vocabulary (--preset gpt2's 50304, --vocab-size 128) trained, then
  # its sample drew a token past the text's and the run failed with no final line (exit 1).
  # 50 characters, not the default 500: each draws from 50,304 logits (16 s under CI's ASan with
  # 500), and the defect drew a padded token on almost every draw.
  ditto_expect_exit(DittoTrainGpt.PaddedVocabSamplesTheTextsTokens_preset RC 0 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --preset gpt2 --n-layer 1 --n-head 2 --n-embd 32
            --block-size 16 --batch-size 8 --max-iters 2 --eval-iters 1 --eval-interval 1
            --sample 50
    REGEX "sample \\(50 characters.*\nfinal: backend=sim devices=4 determinism=bitwise iters=2 ")
  ditto_expect_exit(DittoTrainGpt.PaddedVocabSamplesTheTextsTokens_vocab128 RC 0 TIMEOUT 120
    COMMAND $<TARGET_FILE:ditto-train> --model gpt --vocab-size 128 --n-layer 1 --n-head 2
            --n-embd 16 --block-size 16 --batch-size 8 --max-iters 2 --eval-iters 1
            --eval-interval 1 --devices 1
    REGEX "sample \\(500 characters.*\nfinal: backend=sim devices=1 determinism=bitwise iters=2 ")
  # Item 6: the sample is printed whole, NUL bytes too (it stopped at the first one).
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_nul.py
       "import sys\nopen(sys.argv[1], 'wb').write(b'ab\\0cd\\0ef' * 300)\n")
  add_test(NAME DittoTrainGpt.SampleKeepsNulBytes
           COMMAND bash -c "python3 '${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_nul.py' nul.txt && '$<TARGET_FILE:ditto-train>' --model gpt --data nul.txt --n-layer 1 --n-head 1 --n-embd 8 --block-size 8 --batch-size 4 --max-iters 1 --eval-iters 0 --sample 40 --devices 1 > out && n=$(sed -n '/^sample (40 characters/{n;p;}' out | wc -c) && tr '\\0' @ < out | grep -A1 '^sample' && [ \"$n\" = 41 ] && echo PASS-nul"
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(DittoTrainGpt.SampleKeepsNulBytes PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "PASS-nul")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_short.txt "too short for a block\n")
  foreach(case
      "model|--model;rnn|--model: expected mlp or gpt, got 'rnn'"
      "n_embd|--model;gpt;--n-embd;30|--n-embd: expected a multiple of --n-head = 4, got 30"
      "max_iters|--model;gpt;--max-iters;0|--max-iters: expected >= 1, got 0"
      "lr_decay|--model;gpt;--lr-decay-iters;50|--lr-decay-iters: expected > --warmup-iters = 100 \\(nanoGPT's cosine decay runs from the one to the other\\), got 50"
      "dropout|--model;gpt;--dropout;1|--dropout: expected a value in \\[0, 1\\), got 1"
      "min_lr|--model;gpt;--min-lr;0.01|--min-lr: expected a value in \\[0, 0.001\\], got 0.01"
      "temperature|--model;gpt;--temperature;0|--temperature: expected a value in \\(0, inf\\), got 0"
      "epochs|--model;gpt;--epochs;3|--epochs: expected --model mlp \\(the GPT's options are nanoGPT's: --max-iters, not --epochs, with AdamW and cross-entropy\\), got --model gpt"
      "gpt_option_on_mlp|--n-layer;2|--n-layer: expected --model gpt, got --model mlp"
      "missing_data|--model;gpt;--data;/no/such/text.txt|--data: TextDataSource: cannot open '/no/such/text.txt': No such file or directory"
      "short_data|--model;gpt;--data;${CMAKE_CURRENT_BINARY_DIR}/ditto_train_gpt_short.txt|--data: TextDataSource: '[^']*ditto_train_gpt_short.txt': expected a text whose training \\(first 90%\\) and validation \\(last 10%\\) splits are longer than block_size = 64 tokens, got 22 bytes"
      # Note [GPT sizes in 64 bits] (core/train/gpt_recipe.cpp): a step's tokens past 2^31 failed
      # in the first step naming the data source (ZeroTokenSource, TextDataSource; exit 1), and
      # at 2^63 - 1 UBSan stopped the run in comm::chunk_range; sizes whose parameter count
      # overflowed wrapped it (params=702561541902130944), or failed in Tensor::empty.
      "batch_tokens_dry|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--batch-size;2097153|--batch-size: expected at most 2097152 \\(a step's tokens, --batch-size x --block-size = 1024, are at most 2\\^31: the data's batches are built on the host\\), got 2097153\n"
      "batch_tokens_text|--model;gpt;--batch-size;33554433;--max-iters;1|--batch-size: expected at most 33554432 \\(a step's tokens, --batch-size x --block-size = 64, are at most 2\\^31: the data's batches are built on the host\\), got 33554433\n"
      "batch_int64_max|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--batch-size;9223372036854775807|--batch-size: expected at most 2097152 [^\n]*, got 9223372036854775807\n"
      "block_int64_max|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--block-size;9223372036854775807|--block-size: expected at most 2\\^31 = 2147483648 \\(a step's tokens, --batch-size x --block-size, are at most 2\\^31: the data's batches are built on the host\\), got 9223372036854775807\n"
      "n_layer_params|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--n-layer;70368744177663|--n-layer 70368744177663 --n-embd 768 --vocab-size 50304 --block-size 1024: expected a GPT whose f32 AdamW state, 16 bytes a parameter, fits in 64 bits \\(at most 576460752303423487 parameters\\), got 4.99e\\+20 parameters \\(12 L C\\^2 \\+ 13 L C \\+ V C \\+ T C \\+ 2 C with biases\\)\n"
      "n_embd_params|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--n-embd;4000000000;--n-head;1|--n-layer 12 --n-embd 4000000000 --vocab-size 50304 --block-size 1024: expected a GPT whose f32 AdamW state, 16 bytes a parameter, fits in 64 bits \\(at most 576460752303423487 parameters\\), got 2.3e\\+21 parameters"
      # The dry run's default --lr-decay-iters, --warmup-iters + 1, overflowed (UBSan), and the
      # refusal blamed --lr-decay-iters, never given; so did a --warmup-iters past the default.
      "warmup_int64_max|--model;gpt;--preset;gpt2;--dry-run;--profile;h100-sxm;--trainer;ddp;--dtype;bf16;--warmup-iters;9223372036854775807|--warmup-iters: expected < --lr-decay-iters = 9223372036854775807 \\(its default in a dry run: the larger of --max-iters and --warmup-iters \\+ 1, which must fit in 64 bits. nanoGPT's cosine decay runs from the one to the other: give --lr-decay-iters too\\), got 9223372036854775807\n"
      "warmup_past_default|--model;gpt;--warmup-iters;3000|--warmup-iters: expected < --lr-decay-iters = 2000 \\(its default. nanoGPT's cosine decay runs from the one to the other: give --lr-decay-iters too\\), got 3000\n")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts -1 regex)
    list(SUBLIST parts 1 -1 args)
    list(REMOVE_AT args -1)
    # A usage error ("--FLAG: expected ..., got ...") exits 2; the --data file's problems 1.
    set(rc 2)
    if(name MATCHES "_data$")
      set(rc 1)
    endif()
    ditto_expect_exit(DittoTrainGpt.Bad_${name} RC ${rc} REGEX "^ditto-train: error: ${regex}"
      TIMEOUT 30 COMMAND $<TARGET_FILE:ditto-train> ${args})
  endforeach()
endif()
