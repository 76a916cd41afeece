#!/usr/bin/env bash
# What a nanoGPT user meets (tester4's report), one section per ctest (registered in
# tests/cmake/train_gpt.cmake):
#   gelu       a Hugging Face folder whose config.json says "activation_function": "gelu"
#              (transformers' exact erf GELU) is refused by --init-from, naming the file, the
#              key, the value and the tanh GELU ditto computes; "gelu_pytorch_tanh" loads
#   torch_file nanoGPT's ckpt.pt (torch.save's zip, or the legacy pickle) given to --init-from
#              FILE, --init-from DIR and --resume DIR is named as a PyTorch file with the
#              converter to use, not read as a safetensors header or "latest is missing"
#   convert    tools/nanogpt_to_safetensors.py turns a nanoGPT-style ckpt.pt (torch.compile's
#              _orig_mod. names, the tied lm_head, a causal-mask buffer) into a file --init-from
#              reads to the same parameters (params_checksum) as the checkpoint it came from;
#              exit 77 (skipped) where /usr/bin/python3 has no torch
#   resume     resume mismatches name the flag (--lr, --weight-decay, --min-lr) with the values as
#              typed (0.002, not 0.0020000000949949026); a text checkpoint resumed on token files
#              says what changed and to use --init-from; --resume auto that resumes says its
#              --init-from is ignored instead of printing the file's init_from line
#   typed_defaults  --lr 1e-3 and --weight-decay 0.1, the GPT's defaults typed out, train to the
#              bits of leaving them out, and a run that typed them resumes one that did not
#              (tester5: the typed floats were widened, 0.0010000000474974513, another schedule)
# Usage: ditto_train_nanogpt.sh PATH/TO/ditto-train SOURCE_DIR WORK_DIR SECTION
set -u
train=$1 src=$2 work=$3 section=$4
fix=$src/tests/data/gpt2_tiny
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || fail "cannot make $work"
checksum() { grep -o 'params_checksum=[0-9a-f]*' | cut -d= -f2; }
tiny=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 --batch-size 8
      --max-iters 4 --eval-interval 4 --eval-iters 1 --warmup-iters 2 --lr-decay-iters 4
      --sample 0 --devices 1)
# expect_error STATUS TEXT ARGS...: exit status STATUS and TEXT (fixed string) on stderr
expect_error() {
  local rc_want=$1 text=$2; shift 2
  "$train" "$@" > out 2> err
  local rc=$?
  [ $rc = "$rc_want" ] || fail "$*: exit status $rc, expected $rc_want: $(cat err)"
  grep -qF -- "$text" err || fail "$*: expected '$text' on stderr, got: $(cat err)"
}

case $section in
typed_defaults)
  a=$("$train" "${tiny[@]}" 2>&1 | checksum)
  b=$("$train" "${tiny[@]}" --lr 1e-3 --weight-decay 0.1 2>&1 | checksum)
  c=$("$train" "${tiny[@]}" --lr 0.001 2>&1 | checksum)
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] ||
    fail "defaults typed out train to other bits: none $a, --lr 1e-3 --weight-decay 0.1 $b, --lr 0.001 $c"
  d=$("$train" "${tiny[@]}" --lr 2e-3 2>&1 | checksum)
  [ -n "$d" ] && [ "$d" != "$a" ] || fail "--lr 2e-3 trained to the default's bits ($d)"
  "$train" "${tiny[@]}" --max-iters 2 --checkpoint ck > out 2>&1 || fail "checkpoint: $(cat out)"
  e=$("$train" "${tiny[@]}" --resume ck --lr 1e-3 --weight-decay 0.1 2>&1 | tee out | checksum)
  [ "$e" = "$a" ] || fail "a default run resumed with the defaults typed out: $e (want $a): $(tail -n 3 out)"
  echo "PASS typed_defaults"
  ;;
gelu)
  mkdir hf && cp "$fix/hf/model.safetensors" hf/ || fail "no fixture"
  sed 's/"gelu_new"/"gelu"/' "$fix/hf/config.json" > hf/config.json
  grep -q '"activation_function": "gelu"' hf/config.json || fail "config.json: $(cat hf/config.json)"
  expect_error 2 "io::load_gpt_weights: '$work/hf/config.json' (the config.json beside '$work/hf/model.safetensors'): activation_function: expected \"gelu_new\", \"gelu_pytorch_tanh\" or \"gelu_fast\" (GPT-2's tanh GELU, the only activation ditto computes), got \"gelu\" (transformers' exact erf GELU, nn.GELU(): ditto would compute this model with the tanh GELU, another function" \
    --model gpt --init-from "$work/hf" --data "$fix/tiny_train_000001.bin" --eval-only --eval-iters 1 --batch-size 4
  sed 's/"gelu_new"/"gelu_pytorch_tanh"/' "$fix/hf/config.json" > hf/config.json
  "$train" --model gpt --init-from "$work/hf" --data "$fix/tiny_train_000001.bin" --eval-only \
    --eval-iters 1 --batch-size 4 > out 2>&1 || fail "gelu_pytorch_tanh: $(cat out)"
  grep -q '^final: ' out || fail "gelu_pytorch_tanh: $(cat out)"
  echo "PASS gelu"
  ;;
torch_file)
  mkdir out-zip out-legacy
  printf 'PK\003\004\000\000\010\010rest of a zip' > out-zip/ckpt.pt
  printf '\200\002\212\012l\374\234F\371 j\250' > out-legacy/ckpt.pt
  conv="convert its model with \`/usr/bin/python3 tools/nanogpt_to_safetensors.py"
  expect_error 1 "--init-from: io::load_gpt_weights: 'out-zip/ckpt.pt' is a PyTorch file (torch.save's zip archive, as nanoGPT's ckpt.pt), which ditto does not read: $conv out-zip/ckpt.pt model.safetensors\` (needs torch) and start from it with --init-from model.safetensors" \
    "${tiny[@]}" --init-from out-zip/ckpt.pt
  grep -q "header length" err && fail "read as safetensors: $(cat err)"
  expect_error 1 "'out-legacy/ckpt.pt' is a PyTorch file (torch.save's legacy pickle, torch < 1.6, as nanoGPT's ckpt.pt)" \
    "${tiny[@]}" --init-from out-legacy/ckpt.pt
  expect_error 1 "got a folder with neither (nanoGPT's out_dir): 'out-zip/ckpt.pt' is a PyTorch file" \
    "${tiny[@]}" --init-from out-zip
  expect_error 1 "resume: 'out-zip' holds no ditto checkpoint (no step-N directory) but nanoGPT's: 'out-zip/ckpt.pt' is a PyTorch file (torch.save's zip archive, as nanoGPT's ckpt.pt), which ditto does not read: $conv out-zip/ckpt.pt model.safetensors\`" \
    "${tiny[@]}" --resume out-zip
  grep -q "missing or damaged" err && fail "--resume out-zip: $(cat err)"
  expect_error 2 "--resume: expected a checkpoint directory (the --checkpoint DIR of an earlier run, or one of its DIR/step-N), got 'out-zip/ckpt.pt', a regular file; 'out-zip/ckpt.pt' is a PyTorch file" \
    "${tiny[@]}" --resume out-zip/ckpt.pt
  echo "PASS torch_file"
  ;;
convert)
  py=/usr/bin/python3
  if ! "$py" -c 'import torch' > /dev/null 2>&1; then
    echo "skipped: $py cannot import torch (Debian: apt-get install python3-torch)"
    exit 77
  fi
  "$train" "${tiny[@]}" --checkpoint ck > out 2>&1 || fail "training: $(cat out)"
  want=$("$train" "${tiny[@]}" --init-from ck --eval-only < /dev/null 2>&1 | checksum)
  [ -n "$want" ] || fail "no checksum from --init-from ck"
  # ckpt.pt as nanoGPT's train.py saves it, from the checkpoint's parameters.
  "$py" - ck/"$(cat ck/latest)"/model.safetensors nano-out/ckpt.pt <<'PY' || fail "making ckpt.pt"
import json, os, struct, sys
import numpy as np, torch
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
sd = {}
for k, v in head.items():
    if k == "__metadata__":
        continue
    a, b = v["data_offsets"]
    assert v["dtype"] == "F32", v
    sd[k] = torch.from_numpy(np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).copy()).reshape(v["shape"])
sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied, as nanoGPT's state_dict has both
sd["transformer.h.0.attn.bias"] = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)  # torch < 2's mask
sd = {"_orig_mod." + k: v for k, v in sd.items()}  # torch.compile's names (compile=True)
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
torch.save({"model": sd, "optimizer": {}, "iter_num": 4, "best_val_loss": 9.0, "config": {},
            "model_args": dict(n_layer=2, n_head=2, n_embd=16, block_size=16, bias=False,
                               vocab_size=sd["_orig_mod.transformer.wte.weight"].shape[0])},
           sys.argv[2])
PY
  "$py" "$src/tools/nanogpt_to_safetensors.py" nano-out/ckpt.pt nano.safetensors > conv 2>&1 ||
    fail "converter: $(cat conv)"
  grep -Eq "^wrote nano.safetensors: [0-9]+ tensors from 'nano-out/ckpt.pt' \(n_layer=2 n_head=2 n_embd=16" conv ||
    fail "converter: $(cat conv)"
  "$train" "${tiny[@]}" --init-from nano.safetensors --eval-only > out2 2>&1 || fail "$(cat out2)"
  grep -q "init_from=nano.safetensors (.*n_head=2 (from its __metadata__ ditto.n_head)" out2 ||
    fail "$(cat out2)"
  got=$(checksum < out2)
  [ "$got" = "$want" ] || fail "converted: params_checksum=$got, the checkpoint's $want"
  # Refused (tester5): the checkpoint itself as the destination (its optimizer state would go), a
  # directory, another model's state_dict; each exits 1 and leaves the file as it was.
  cp nano-out/ckpt.pt same.pt && sum_before=$(cksum < same.pt)
  "$py" "$src/tools/nanogpt_to_safetensors.py" same.pt same.pt > conv 2>&1 && fail "dst = src: $(cat conv)"
  grep -q "expected a file other than the checkpoint read" conv || fail "dst = src: $(cat conv)"
  [ "$(cksum < same.pt)" = "$sum_before" ] || fail "dst = src: the checkpoint was overwritten"
  mkdir dd && "$py" "$src/tools/nanogpt_to_safetensors.py" same.pt dd > conv 2>&1 && fail "dst dir: $(cat conv)"
  grep -q "expected the safetensors file to write, got a directory" conv || fail "dst dir: $(cat conv)"
  "$py" -c 'import torch, sys; torch.save({"model": {"conv1.weight": torch.zeros(3, 3)}}, sys.argv[1])' resnet.pt
  "$py" "$src/tools/nanogpt_to_safetensors.py" resnet.pt resnet.st > conv 2>&1 && fail "resnet: $(cat conv)"
  grep -q "expected nanoGPT's GPT state_dict" conv && [ ! -e resnet.st ] || fail "resnet: $(cat conv)"
  "$py" "$src/tools/nanogpt_to_safetensors.py" ck/latest x.st > conv 2>&1 && fail "not torch's: $(cat conv)"
  grep -q "cannot be read by torch.load" conv || fail "$(cat conv)"
  echo "PASS convert (params_checksum=$got)"
  ;;
resume)
  "$train" "${tiny[@]}" --checkpoint ck > out 2>&1 || fail "training: $(cat out)"
  expect_error 1 "resume: checkpoint 'ck/step-00000004' does not match this run's --lr: checkpoint 0.001, this run 0.002" \
    "${tiny[@]}" --resume ck --lr 2e-3
  expect_error 1 "does not match this run's --min-lr: checkpoint 0.0001, this run 0.0002" \
    "${tiny[@]}" --resume ck --min-lr 2e-4
  expect_error 1 "does not match this run's optimizer: --weight-decay: checkpoint 0.1, this run 0" \
    "${tiny[@]}" --resume ck --weight-decay 0
  expect_error 1 "does not match this run's optimizer: --beta2: checkpoint 0.99, this run 0.95" \
    "${tiny[@]}" --resume ck --beta2 0.95
  expect_error 1 "resume: checkpoint 'ck/step-00000004' was trained on a text file (--data, a token per byte, the vocabulary its sorted distinct bytes), this run reads token files (--data: llm.c shards or nanoGPT's .bin): a resume continues on the checkpoint's own data" \
    "${tiny[@]}" --resume ck --data "$fix/train.bin" --vocab-size 512
  grep -q "to train the checkpoint's model on this data, start a new run from its parameters with --init-from ck/step-00000004" err ||
    fail "$(cat err)"
  # --resume auto + --init-from: the first run starts from the file, the second resumes.
  "$train" "${tiny[@]}" --resume auto --checkpoint ckb --init-from ck > out 2>&1 || fail "$(cat out)"
  grep -q "^ditto-train: init_from=ck " out || fail "first run: $(cat out)"
  "$train" "${tiny[@]}" --max-iters 8 --resume auto --checkpoint ckb --init-from ck > out 2>&1 ||
    fail "$(cat out)"
  grep -q "init_from=" out && fail "a resume printed the --init-from line: $(cat out)"
  grep -q "^ditto-train: --init-from ck ignored: resuming from ckb (--resume wins once its directory holds a checkpoint)$" out ||
    fail "$(cat out)"
  grep -q "^ditto-train: resumed from ckb at step 4" out || fail "$(cat out)"
  echo "PASS resume"
  ;;
*) fail "unknown section '$section'" ;;
esac
