// `ditto-bench gpt`: training tokens/s of nn::GPT in nanoGPT's CPU configuration (n_layer 4,
// n_head 4, n_embd 128, block_size 64, batch 12, vocab 65, bias off, dropout 0), on 1 and 4
// simulated devices, fast and bitwise, with DataParallel (dp) and DistributedDataParallel (ddp, a
// host thread per rank). One step is nanoGPT's train.py iteration: forward, cross-entropy over the
// B*T tokens, backward, clip_grad_norm_(1.0), AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1
// on 2-D parameters), the loss read (item()). Random tokens (Philox). tokens/s = B*T*steps/s, the
// median of 3 timed runs of >= --train-seconds. bench/torch_bench.py gpt runs the same model and
// batch in PyTorch (one process, all cores); bench/compare.sh reports the ratios.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ditto::bench {

/// What `ditto-bench gpt` runs (its options; defaults = nanoGPT's CPU configuration).
struct GptBenchConfig {
  std::int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, vocab_size = 65;
  std::int64_t batch_size = 12;
  std::vector<int> devices_list = {1, 4};
  std::vector<std::string> modes = {"fast", "bitwise"};
  std::vector<std::string> trainers = {"dp", "ddp"};
  double seconds = 1.0;  ///< per timed run
  int reps = 3;
};

/// Adds --n-layer, --n-head, --n-embd, --block-size, --batch-size, --devices, --modes, --trainers,
/// --train-seconds to the `gpt` subcommand.
void add_gpt_options(CLI::App* sc, GptBenchConfig& cfg);

/// Throws InvalidArgument naming the option for a value the run would refuse (before any work).
void check_gpt_config(const GptBenchConfig& cfg);

/// Runs every (devices, mode, trainer) case, prints a row each and appends it to `csv_path`
/// (model,batch,block_size,devices,determinism,trainer,tokens_per_s,steps_per_s; none if empty).
void run_gpt(const GptBenchConfig& cfg, const std::string& csv_path);

}  // namespace ditto::bench
