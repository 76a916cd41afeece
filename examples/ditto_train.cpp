// ditto-train: the main job. Trains an MLP data-parallel over several (simulated or real) GPUs on a
// CSV data set (by default the bundled digits set: 8x8 images, 10 classes) and prints one line per
// epoch and a final line with a checksum of every parameter, so two runs compare with one string.
//
//   build/bin/ditto-train                          # 4 simulated GPUs, digits, MLP 64-128-10
//   build/bin/ditto-train --devices 1              # same model on one device
//   build/bin/ditto-train --help
#include <CLI/CLI.hpp>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/data/csv.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"

using namespace ditto;

namespace {

struct Args {
  std::string backend = "sim";
  int devices = 4;
  std::string data = DITTO_DEFAULT_DATA;
  std::int64_t label_column = -1;
  std::string header = "auto";
  std::string hidden = "128";
  int epochs = 20;
  std::int64_t batch_size = 64;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 0;
  double val_fraction = 0.2;
  std::string determinism = "fast";
  double sim_memory_gib = 80.0;
};

std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    DITTO_CHECK(used == item.size() && v > 0, "--hidden: expected comma-separated positive sizes "
                                              "such as 128 or 256,128, got '", text, "'");
    out.push_back(v);
  }
  return out;
}

/// FNV-1a over the bytes of every parameter, in order.
std::uint64_t params_checksum(nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (nn::Parameter* p : m.parameters()) {
    std::vector<float> v = p->data.to_vector<float>();
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  return h;
}

struct Eval {
  double loss = 0, acc = 0;
};

Eval evaluate(parallel::DataParallel& dp, nn::CrossEntropyLoss& criterion,
              const data::Dataset& ds, std::int64_t batch_size) {
  data::DataLoader loader(ds, batch_size, /*shuffle=*/false);
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  for (data::Batch b : loader) {
    Tensor logits = dp.forward(b.x);
    Tensor y = b.y.to(logits.device());
    loss_sum += static_cast<double>(criterion.forward(logits, y).item()) * b.x.size(0);
    std::vector<float> l = logits.to_vector<float>();
    std::vector<std::int64_t> t = b.y.to_vector<std::int64_t>();
    const std::int64_t classes = logits.size(1);
    for (std::size_t r = 0; r < t.size(); ++r) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < classes; ++c)
        if (l[r * classes + c] > l[r * classes + best]) best = c;
      correct += best == t[r];
    }
    seen += b.x.size(0);
  }
  return {seen ? loss_sum / seen : 0.0, seen ? static_cast<double>(correct) / seen : 0.0};
}

int run(const Args& a) {
  Determinism mode = parse_determinism(a.determinism);
  data::CsvOptions csv;
  csv.label_column = a.label_column;
  if (a.header == "yes") csv.header = data::CsvHeader::yes;
  else if (a.header == "no") csv.header = data::CsvHeader::no;
  else DITTO_CHECK(a.header == "auto", "--header: expected auto, yes or no, got '", a.header, "'");
  DITTO_CHECK(a.epochs >= 0, "--epochs: expected >= 0, got ", a.epochs);
  DITTO_CHECK(a.batch_size >= 1, "--batch-size: expected >= 1, got ", a.batch_size);
  DITTO_CHECK(a.val_fraction > 0 && a.val_fraction < 1, "--val-fraction: expected a value in (0, 1), got ",
              a.val_fraction);
  DITTO_CHECK(a.sim_memory_gib > 0, "--sim-memory-gib: expected > 0, got ", a.sim_memory_gib);
  std::vector<std::int64_t> hidden = parse_sizes(a.hidden);

  std::string why;
  std::string backend = resolve_backend_name(a.backend, &why);
  if (a.backend == "auto" && backend != "cuda")
    std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
  BackendOptions bopts;
  bopts.device_count = a.devices;
  bopts.memory_capacity = static_cast<std::size_t>(a.sim_memory_gib * double(1ull << 30));
  Backend& be = init_backend(backend, bopts);
  std::vector<Device> devs = ditto::devices(be.name(), a.devices);

  data::Dataset all = data::read_csv(a.data, csv);
  data::Split split = data::train_val_split(all, a.val_fraction, a.seed);
  data::Standardizer stdz = data::Standardizer::fit(split.train);
  data::Dataset train = stdz.apply(split.train), val = stdz.apply(split.val);
  const std::int64_t classes = data::num_classes(all);

  std::vector<std::int64_t> sizes{all.num_features()};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(classes);
  auto model = nn::mlp(sizes, devs[0], a.seed);
  model->set_input_requires_grad(false);
  parallel::DataParallelOptions dpo;
  dpo.determinism = mode;
  parallel::DataParallel dp(*model, devs, dpo);
  nn::CrossEntropyLoss criterion;
  criterion.set_determinism(mode);
  optim::SGDOptions so;
  so.lr = a.lr;
  so.momentum = a.momentum;
  so.weight_decay = a.weight_decay;
  optim::SGD opt(model->parameters(), so);

  std::string arch;
  for (std::size_t i = 0; i < sizes.size(); ++i) arch += (i ? "-" : "") + std::to_string(sizes[i]);
  std::printf("ditto-train: backend=%s devices=%d determinism=%s model=%s params=%" PRId64
              " data=%s rows=%" PRId64 " (train %" PRId64 ", val %" PRId64 ") batch=%" PRId64
              " epochs=%d lr=%g momentum=%g seed=%" PRIu64 "\n",
              be.name().c_str(), a.devices, determinism_name(mode), arch.c_str(),
              model->num_parameters(), a.data.c_str(), all.size(), train.size(), val.size(),
              a.batch_size, a.epochs, a.lr, a.momentum, a.seed);
  std::fflush(stdout);

  data::DataLoader loader(train, a.batch_size, /*shuffle=*/true, a.seed, /*drop_last=*/false);
  double train_time = 0, train_loss = 0;
  Eval ev{};
  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    loader.set_epoch(epoch - 1);
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::int64_t seen = 0;
    for (data::Batch b : loader) {
      Tensor out = dp.forward(b.x);
      Tensor loss = criterion.forward(out, b.y.to(out.device()));
      opt.zero_grad(true);
      dp.backward(criterion.backward());
      opt.step();
      loss_sum += static_cast<double>(loss.item()) * b.x.size(0);
      seen += b.x.size(0);
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_time += dt;
    train_loss = seen ? loss_sum / seen : 0.0;
    ev = evaluate(dp, criterion, val, 512);
    std::printf("epoch %3d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  samples/s=%.0f\n", epoch,
                train_loss, ev.loss, ev.acc, dt > 0 ? seen / dt : 0.0);
    std::fflush(stdout);
  }
  if (a.epochs == 0) ev = evaluate(dp, criterion, val, 512);
  std::printf("final: backend=%s devices=%d determinism=%s epochs=%d train_loss=%.6f "
              "val_loss=%.6f val_acc=%.4f train_time_s=%.3f params_checksum=%016" PRIx64 "\n",
              be.name().c_str(), a.devices, determinism_name(mode), a.epochs, train_loss, ev.loss,
              ev.acc, train_time, params_checksum(*model));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ditto-train: data-parallel MLP training on simulated or real GPUs"};
  app.add_option("--backend", a.backend, "sim, cuda or auto (cuda when a GPU is usable)")
      ->capture_default_str();
  app.add_option("--devices", a.devices, "number of devices (data-parallel replicas)")
      ->capture_default_str();
  app.add_option("--data", a.data, "CSV file: numeric features, integer class label")
      ->capture_default_str();
  app.add_option("--label-column", a.label_column, "label column (negative counts from the end)")
      ->capture_default_str();
  app.add_option("--header", a.header, "first row is a header: auto, yes or no")
      ->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden layer sizes, comma-separated (e.g. 256,128)")
      ->capture_default_str();
  app.add_option("--epochs", a.epochs, "training epochs")->capture_default_str();
  app.add_option("--batch-size", a.batch_size, "global batch size (split over the devices)")
      ->capture_default_str();
  app.add_option("--lr", a.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--seed", a.seed, "seed for initialisation, split and shuffling")
      ->capture_default_str();
  app.add_option("--val-fraction", a.val_fraction, "fraction of rows held out for validation")
      ->capture_default_str();
  app.add_option("--determinism", a.determinism, "bitwise or fast")->capture_default_str();
  app.add_option("--sim-memory-gib", a.sim_memory_gib, "memory capacity of each simulated device")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ditto-train: error: %s\n", e.what());
    return 1;
  }
}
