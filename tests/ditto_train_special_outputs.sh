#!/usr/bin/env bash
# Outputs written in place and checked at the start (Note [Atomic write] in core/io/file.h;
# issue 31 items 3 and 4):
#   --trace /dev/stdout and --metrics-jsonl /dev/stdout, piped and redirected to a file: the run
#   ends 0, every text line is kept (a rename replaced the redirected file; piped, the trace went
#   to "/proc/self/fd/pipe:[...].tmp"), and every line is either text or one whole JSON object;
#   --trace /dev/full and --metrics-jsonl /dev/full fail before the first epoch, naming the file
#   and "No space left on device" (the trace's failed after the whole run, with no final line).
#   > /dev/full and >&- (stdout itself lost): exit 1 with "cannot write the results to stdout".
# Usage: ditto_train_special_outputs.sh PATH/TO/ditto-train WORK_DIR
source "$(dirname "$0")/ditto_train_common.sh"

# check_lines FILE WHAT: the start, epoch and final lines are there, and each line starting with
# '{' is one JSON object.
check_lines() {
  local f=$1 what=$2
  grep -q "^ditto-train: backend=sim devices=4" "$f" || fail "$what: no start line: $(head -c 400 "$f")"
  [ "$(grep -c '^epoch ' "$f")" = 2 ] || fail "$what: expected 2 epoch lines: $(head -c 400 "$f")"
  grep -q "^final: .*params_checksum=" "$f" || fail "$what: no final line: $(head -c 400 "$f")"
  /usr/bin/env python3 - "$f" <<'EOF' || fail "$what: a line mixes text and JSON"
import json, sys
for n, line in enumerate(open(sys.argv[1], encoding="utf-8", errors="replace"), 1):
    if "{" in line and not line.startswith("{"):
        sys.exit(f"line {n} has JSON after text: {line[:200]!r}")
    if line.startswith("{"):
        json.loads(line)
EOF
}

# --trace /dev/stdout, piped and redirected.
"$train" --epochs 2 --trace /dev/stdout 2> "$work/err" | cat > "$work/trace_pipe" ||
  fail "--trace /dev/stdout | cat: exit ${PIPESTATUS[0]}: $(cat "$work/err")"
check_lines "$work/trace_pipe" "--trace /dev/stdout | cat"
grep -q '^{.*"traceEvents"' "$work/trace_pipe" || fail "no trace in the pipe"
grep -q "^trace: wrote /dev/stdout" "$work/trace_pipe" || fail "no 'trace: wrote' line"
"$train" --epochs 2 --trace /dev/stdout > "$work/trace_file" 2> "$work/err" ||
  fail "--trace /dev/stdout > file: exit $?: $(cat "$work/err")"
[ -f "$work/trace_file" ] || fail "the redirected file is gone"
check_lines "$work/trace_file" "--trace /dev/stdout > file"
grep -q '^{.*"traceEvents"' "$work/trace_file" || fail "no trace in the redirected file"

# --metrics-jsonl /dev/stdout, piped and redirected: the 2 epoch records and the final one.
for how in pipe file; do
  if [ $how = pipe ]; then
    "$train" --epochs 2 --metrics-jsonl /dev/stdout 2> "$work/err" | cat > "$work/jsonl_$how"
  else
    "$train" --epochs 2 --metrics-jsonl /dev/stdout > "$work/jsonl_$how" 2> "$work/err"
  fi
  [ $? = 0 ] || fail "--metrics-jsonl /dev/stdout ($how): $(cat "$work/err")"
  check_lines "$work/jsonl_$how" "--metrics-jsonl /dev/stdout ($how)"
  [ "$(grep -c '^{.*"event":"epoch"' "$work/jsonl_$how")" = 2 ] || fail "$how: $(cat "$work/jsonl_$how")"
  [ "$(grep -c '^{.*"event":"final"' "$work/jsonl_$how")" = 1 ] || fail "$how: $(cat "$work/jsonl_$how")"
done

# /dev/full: refused at the start, before any epoch, naming the file and the reason: a usage
# error (exit 2), as --export's unusable files are.
for opt in --trace --metrics-jsonl; do
  "$train" --epochs 2 $opt /dev/full > "$work/out" 2>&1
  rc=$?
  [ $rc = 2 ] || fail "$opt /dev/full: expected exit status 2, got $rc: $(cat "$work/out")"
  grep -q "^ditto-train: error: $opt: .*'/dev/full'.*: No space left on device" "$work/out" ||
    fail "$opt /dev/full: $(cat "$work/out")"
  grep -q "^epoch " "$work/out" && fail "$opt /dev/full: trained before failing: $(cat "$work/out")"
done
# stdout itself lost (Note [Lost output] in core/io/file.h): > /dev/full and a closed
# stdout (>&-) exit 1 saying so on stderr (they exited 0 with every result line lost).
"$train" --epochs 1 > /dev/full 2> "$work/err"
rc=$?
[ $rc = 1 ] || fail "> /dev/full: expected exit status 1, got $rc: $(cat "$work/err")"
grep -qx "ditto-train: error: cannot write the results to stdout: No space left on device" \
  "$work/err" || fail "> /dev/full: $(cat "$work/err")"
"$train" --epochs 1 --checkpoint "$work/closed_ck" >&- 2> "$work/err"
rc=$?
[ $rc = 1 ] || fail ">&-: expected exit status 1, got $rc: $(cat "$work/err")"
grep -qx "ditto-train: error: cannot write the results to stdout: Bad file descriptor" \
  "$work/err" || fail ">&-: $(cat "$work/err")"
# No file ditto opened took descriptor 1 and the result lines: the checkpoint still loads.
"$train" --epochs 2 --resume "$work/closed_ck" > "$work/out" 2>&1 ||
  fail ">&-: the checkpoint written with stdout closed does not resume: $(cat "$work/out")"
echo PASS
