// libFuzzer target: train::TokenDataSource and its files (core/data/token_source.h, Note [Token
// files]): llm.c shards and nanoGPT raw tokens, written to scratch files and mapped. Input: byte 0
// = flags (bit 0: nanogpt, else llmc; bit 1: the last file is the val split; bit 2: also fuzz
// the step, byte 3), byte 1 = block_size - 1 (1..64 from its low 6 bits), byte 2 = batch_size - 1
// (1..8 from its low 3 bits) and vocab_size = 2^(1 + its high 5 bits % 18) (2..2^18), byte 3 =
// step, then the files separated by "\n--8<--\n" (at most 4). Then detection, batches of every
// row range, evaluation windows and checkpoint_config as a trainer uses them; every token read
// must be < vocab_size. Seeds: corpus/token_source/.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/data/token_source.h"
#include "tools/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditto::train;
  if (size < 4) return 0;
  const DataFormat format = (data[0] & 1) ? DataFormat::nanogpt : DataFormat::llmc;
  const bool with_val = data[0] & 2;
  const std::int64_t step = (data[0] & 4) ? data[3] : 0;
  const std::int64_t block = std::int64_t(data[1] & 63) + 1, batch = std::int64_t(data[2] & 7) + 1;
  const std::int64_t vocab = std::int64_t(1) << (1 + (data[2] >> 3) % 18);
  std::vector<std::string_view> parts = ditto_fuzz::split(
      std::string_view(reinterpret_cast<const char*>(data) + 4, size - 4), "\n--8<--\n");
  if (parts.size() > 4) parts.resize(4);
  std::vector<std::string> train, val;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const std::string path =
        ditto_fuzz::scratch_dir() + "/tiny_train_" + std::to_string(k) + ".bin";
    ditto_fuzz::write_bytes(path, parts[k]);
    (void)detect_data_format(path);
    (with_val && k + 1 == parts.size() && k > 0 ? val : train).push_back(path);
  }
  try {
    TokenDataSource src(train, val, format, vocab, block, /*seed=*/1337);
    if (src.train_tokens() <= block || src.vocab_size() != vocab) std::abort();
    auto check = [&](const ditto::data::Batch& b) {
      if (b.x.shape() != ditto::Shape{batch, block} || b.y.shape() != ditto::Shape{batch, block})
        std::abort();
      const std::int64_t* x = b.x.data<std::int64_t>();
      const std::int64_t* y = b.y.data<std::int64_t>();
      for (std::int64_t i = 0; i < batch * block; ++i)
        if (x[i] < 0 || x[i] >= vocab || y[i] < 0 || y[i] >= vocab) std::abort();
    };
    check(src.step_batch(step, batch));
    check(src.step_batch_rows(step, batch, batch / 2, batch));
    check(src.batch(0, 0, batch));
    check(src.eval_batch(EvalSplit::train, step, batch));
    if (src.val() != nullptr) check(src.eval_batch(EvalSplit::val, 0, batch));
    (void)src.batches_per_epoch(batch);
    (void)src.checkpoint_config();
  } catch (const ditto::Error&) {
  }
  return 0;
}
