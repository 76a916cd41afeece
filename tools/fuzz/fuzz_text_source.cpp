// libFuzzer target: train::TextDataSource (core/data/text_source.h) on text in memory (the
// path constructor only adds io::read_file). Input: byte 0 = block_size - 1 (1..256), byte 1 =
// batch_size - 1 (1..8 from its low 3 bits) and bit 3 = also fuzz the step (byte 2), then the
// text. Then batches, evaluation windows, checkpoint_config, encode and decode as a trainer and
// a sampler use them. Seeds: corpus/text_source/.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/data/text_source.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::int64_t block = std::int64_t(data[0]) + 1, batch = std::int64_t(data[1] & 7) + 1;
  const std::int64_t step = (data[1] & 8) ? data[2] : 0;
  std::string text(reinterpret_cast<const char*>(data) + 3, size - 3);
  try {
    ditto::train::TextDataSource src(text, block, /*seed=*/1337, "fuzz.txt");
    if (src.size() != static_cast<std::int64_t>(text.size())) std::abort();
    const std::int64_t vocab = src.vocab_size();
    auto check = [&](const ditto::data::Batch& b) {
      if (b.x.shape() != ditto::Shape{batch, block} || b.y.shape() != ditto::Shape{batch, block})
        std::abort();
      const std::int64_t* x = b.x.data<std::int64_t>();
      for (std::int64_t i = 0; i < batch * block; ++i)
        if (x[i] < 0 || x[i] >= vocab) std::abort();
    };
    check(src.step_batch(step, batch));
    check(src.batch(0, 0, batch));
    check(src.eval_batch(ditto::train::EvalSplit::train, step, batch));
    check(src.eval_batch(ditto::train::EvalSplit::val, 0, batch));
    (void)src.batches_per_epoch(batch);
    (void)src.checkpoint_config();
    const std::vector<std::int64_t> tokens = src.encode(text);
    if (src.decode(tokens) != text) std::abort();
    try {
      (void)src.decode({vocab});  // one past the vocabulary: refused
      std::abort();
    } catch (const ditto::InvalidArgument&) {
    }
  } catch (const ditto::Error&) {
  }
  return 0;
}
