# Sourced by the ditto-train checkpoint scripts (ditto_train_checkpoint.sh,
# ditto_train_ddp_checkpoint.sh) with their arguments PATH/TO/ditto-train WORK_DIR: sets train
# and a fresh, empty work directory; fail MESSAGE prints FAIL and exits 1; checksum reads
# params_checksum from ditto-train's output on stdin.
set -u
train=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
checksum() { grep -o 'params_checksum=[0-9a-f]*' | cut -d= -f2; }
