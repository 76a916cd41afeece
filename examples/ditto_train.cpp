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

#include "backend_sim/sim_backend.h"
#include "core/backend.h"
#include "core/data/csv.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/micro_shards.h"
#include "core/optim/adam.h"
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
  std::string determinism = "bitwise";
  std::string loss = "cross-entropy";
  std::string optimizer = "sgd";
  bool lr_given = false;
  std::int64_t micro_shards = kDefaultMicroShards;
  double sim_memory_gib = 80.0;
  std::vector<std::string> faults;      // --fault SPEC (backend_sim/sim_faults.h)
  std::int64_t comm_timeout_ms = 0;     // 0: the communicators' own timeout
};

/// The loss's target for a batch: the labels themselves (cross-entropy) or their one-hot
/// encoding as f32 [N, C] (MSE), on `device`.
Tensor make_target(const Tensor& labels, std::int64_t classes, bool mse, const Device& device) {
  if (!mse) return labels.to(device);
  std::vector<std::int64_t> y = labels.to_vector<std::int64_t>();
  std::vector<float> onehot(y.size() * static_cast<std::size_t>(classes), 0.0f);
  for (std::size_t r = 0; r < y.size(); ++r) onehot[r * classes + y[r]] = 1.0f;
  return Tensor::from_vector(onehot, {static_cast<std::int64_t>(y.size()), classes}, device);
}

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

Eval evaluate(parallel::DataParallel& dp, nn::Loss& criterion, bool mse,
              const data::Dataset& ds, std::int64_t batch_size) {
  data::DataLoader loader(ds, batch_size, /*shuffle=*/false);
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  for (data::Batch b : loader) {
    Tensor logits = dp.forward(b.x);
    Tensor y = make_target(b.y, logits.size(1), mse, logits.device());
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
  DITTO_CHECK(std::isfinite(a.lr) && a.lr > 0, "--lr: expected a finite value > 0, got ", a.lr);
  DITTO_CHECK(a.batch_size >= 1, "--batch-size: expected >= 1, got ", a.batch_size);
  DITTO_CHECK(a.val_fraction > 0 && a.val_fraction < 1, "--val-fraction: expected a value in (0, 1), got ",
              a.val_fraction);
  // The byte count must fit in size_t: converting a larger (or infinite) double is undefined.
  constexpr double kMaxSimMemoryGib = double(std::uint64_t(1) << 34);  // 2^34 GiB = 2^64 bytes
  DITTO_CHECK(a.sim_memory_gib > 0 && a.sim_memory_gib < kMaxSimMemoryGib,
              "--sim-memory-gib: expected a size in GiB > 0 and < 17179869184 (16 EiB), got ",
              a.sim_memory_gib);
  std::vector<std::int64_t> hidden = parse_sizes(a.hidden);
  DITTO_CHECK(a.loss == "cross-entropy" || a.loss == "mse",
              "--loss: expected cross-entropy or mse, got '", a.loss, "'");
  DITTO_CHECK(a.optimizer == "sgd" || a.optimizer == "adam",
              "--optimizer: expected sgd or adam, got '", a.optimizer, "'");
  const bool mse = a.loss == "mse";
  const float lr = a.lr_given ? a.lr : (a.optimizer == "adam" ? 0.001f : a.lr);

  std::string why;
  std::string backend = resolve_backend_name(a.backend, &why);
  if (a.backend == "auto" && backend != "cuda")
    std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
  BackendOptions bopts;
  bopts.device_count = a.devices;
  bopts.memory_capacity = static_cast<std::size_t>(a.sim_memory_gib * double(1ull << 30));
  Backend& be = init_backend(backend, bopts);
  if (!a.faults.empty() || a.comm_timeout_ms != 0) {
    auto* sim_be = dynamic_cast<sim::SimBackend*>(&be);
    DITTO_CHECK(sim_be, "--fault/--comm-timeout-ms: expected --backend sim, got ", be.name());
    DITTO_CHECK(a.comm_timeout_ms >= 0, "--comm-timeout-ms: expected > 0, got ",
                a.comm_timeout_ms);
    sim::FaultConfig fc;
    for (const std::string& f : a.faults) fc.faults.push_back(sim::parse_fault(f, "--fault"));
    if (a.comm_timeout_ms > 0) fc.comm_timeout_ms = a.comm_timeout_ms;
    sim_be->set_faults(fc);
  }
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
  dpo.micro_shards = a.micro_shards;
  parallel::DataParallel dp(*model, devs, dpo);
  std::unique_ptr<nn::Loss> criterion;
  if (mse) criterion = std::make_unique<nn::MSELoss>();
  else criterion = std::make_unique<nn::CrossEntropyLoss>();
  criterion->set_determinism(mode);
  std::unique_ptr<optim::Optimizer> opt;
  if (a.optimizer == "adam") {
    optim::AdamOptions ao;
    ao.lr = lr;
    ao.weight_decay = a.weight_decay;
    opt = std::make_unique<optim::Adam>(model->parameters(), ao);
  } else {
    optim::SGDOptions so;
    so.lr = lr;
    so.momentum = a.momentum;
    so.weight_decay = a.weight_decay;
    opt = std::make_unique<optim::SGD>(model->parameters(), so);
  }

  std::string arch;
  for (std::size_t i = 0; i < sizes.size(); ++i) arch += (i ? "-" : "") + std::to_string(sizes[i]);
  std::printf("ditto-train: backend=%s devices=%d determinism=%s model=%s params=%" PRId64
              " data=%s rows=%" PRId64 " (train %" PRId64 ", val %" PRId64 ") batch=%" PRId64
              " epochs=%d loss=%s optimizer=%s lr=%g momentum=%g seed=%" PRIu64 "\n",
              be.name().c_str(), a.devices, determinism_name(mode), arch.c_str(),
              model->num_parameters(), a.data.c_str(), all.size(), train.size(), val.size(),
              a.batch_size, a.epochs, a.loss.c_str(), a.optimizer.c_str(), lr,
              a.optimizer == "sgd" ? a.momentum : 0.0f, a.seed);
  std::fflush(stdout);

  data::DataLoader loader(train, a.batch_size, /*shuffle=*/true, a.seed, /*drop_last=*/false);
  double train_time = 0, train_loss = 0;
  std::int64_t step = 0;
  Eval ev{};
  for (int epoch = 1; epoch <= a.epochs; ++epoch) {
    loader.set_epoch(epoch - 1);
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::int64_t seen = 0;
    for (data::Batch b : loader) {
      be.begin_step(step++);
      Tensor out = dp.forward(b.x);
      Tensor loss = criterion->forward(out, make_target(b.y, classes, mse, out.device()));
      opt->zero_grad(true);
      dp.backward(criterion->backward());
      opt->step();
      loss_sum += static_cast<double>(loss.item()) * b.x.size(0);
      seen += b.x.size(0);
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_time += dt;
    train_loss = seen ? loss_sum / seen : 0.0;
    ev = evaluate(dp, *criterion, mse, val, 512);
    std::printf("epoch %3d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  samples/s=%.0f\n", epoch,
                train_loss, ev.loss, ev.acc, dt > 0 ? seen / dt : 0.0);
    std::fflush(stdout);
  }
  if (a.epochs == 0) ev = evaluate(dp, *criterion, mse, val, 512);
  if (auto* sim_be = dynamic_cast<sim::SimBackend*>(&be))
    for (const std::string& f : sim_be->unfired_faults())
      std::printf("ditto-train: note: --fault %s never took effect (no such step, allocation or "
                  "communicator collective in this run; DataParallel issues no collectives)\n",
                  f.c_str());
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
  app.add_option("--lr", a.lr, "learning rate (default 0.05 for sgd, 0.001 for adam)");
  app.add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--loss", a.loss, "cross-entropy or mse (on one-hot targets)")
      ->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "sgd or adam")->capture_default_str();
  app.add_option("--micro-shards", a.micro_shards,
                 "micro-shards K of a batch in bitwise mode (power of two >= devices)")
      ->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--seed", a.seed, "seed for initialisation, split and shuffling")
      ->capture_default_str();
  app.add_option("--val-fraction", a.val_fraction, "fraction of rows held out for validation")
      ->capture_default_str();
  app.add_option("--determinism", a.determinism,
                 "bitwise (same bits for any power-of-two device count) or fast")
      ->capture_default_str();
  app.add_option("--sim-memory-gib", a.sim_memory_gib, "memory capacity of each simulated device")
      ->capture_default_str();
  app.add_option("--fault", a.faults,
                 "sim: inject a fault (repeatable): fail:device=D,step=S | "
                 "alloc:device=D,after=N | skip-collective:rank=R,index=K");
  app.add_option("--comm-timeout-ms", a.comm_timeout_ms,
                 "sim: timeout of every communicator in ms (0: their own)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  a.lr_given = app.count("--lr") > 0;
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
