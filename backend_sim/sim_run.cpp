// SimRun (sim_run.h): the simulator's options of a Trainer's run, set on its backend's extensions.
#include "backend_sim/sim_run.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "backend_sim/cost_model.h"
#include "backend_sim/profile_fields.h"
#include "backend_sim/profiles.h"
#include "backend_sim/sim_dry_arena.h"
#include "backend_sim/sim_faults.h"
#include "backend_sim/trace.h"
#include "core/base/error.h"
#include "core/distributed/distributed.h"
#include "core/io/file.h"
#include "core/runtime/extensions.h"
#include "core/train/metrics.h"
#include "core/train/trainer_config.h"

namespace ditto::sim {
namespace {

/// How errors name option `field`: TrainerConfig::field_names, else SimRunOptions::<field>.
std::string name_of(const train::TrainerConfig& c, const std::string& field) {
  auto it = c.field_names.find(field);
  return it != c.field_names.end() ? it->second : "SimRunOptions::" + field;
}

/// The trace file's directory must exist and be writable at startup, so that a long run is not
/// lost when it ends.
void check_trace_path(const train::TrainerConfig& c, const std::string& trace) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string t = name_of(c, "trace");
  // /dev/stdout, a device or a FIFO is written in place: checked by writing 0 bytes to it now
  // (--trace /dev/full fails here, not after the run).
  try {
    if (io::check_in_place_output(trace, t.c_str())) return;
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
  DITTO_CHECK(!fs::is_directory(trace, ec), t, ": expected a file name, got '", trace,
              "', a directory");
  // The directory write_file_atomic writes in: a symbolic link's final target's (Note [Atomic
  // write]), a dangling link's too, so that a link into a missing directory fails here.
  std::string target;
  try {
    target = io::resolve_links(trace, "io::resolve_links");
  } catch (const Error& e) {
    throw InvalidArgument(detail::cat(t, ": expected a file or a symbolic link to one, got '",
                                      trace, "' (", e.what(), ")"));
  }
  fs::path dir = fs::path(target).parent_path();
  if (dir.empty()) dir = ".";
  DITTO_CHECK(fs::is_directory(dir, ec), t, ": expected a file in an existing directory, got '",
              trace, "' (no directory '", dir.string(), "')");
  DITTO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, t,
              ": expected a file in a writable "
              "directory, got '",
              trace, "': '", dir.string(), "': ", std::strerror(errno));
}

static_assert(kDefaultTraceMaxEvents == TraceRecorder::kDefaultMaxEvents,
              "a SimRun's trace keeps what the recorder keeps by default");

/// The warning for a trace that lacks events past its cap (SimRunReport::trace_dropped), "" when
/// it holds them all: the file said so only in otherData.dropped_events (a 700-step run on 8
/// GPUs lost 898,000 events, its last 2 of 11 virtual seconds, with only "trace: wrote" said).
std::string dropped_events(const std::string& flag, const std::string& file, const TraceStats& t) {
  if (t.dropped == 0) return "";
  char from[64];
  std::snprintf(from, sizeof from, "%.4g s to %.4g s",
                static_cast<double>(t.first_dropped_ps) / 1e12,
                static_cast<double>(t.last_dropped_end_ps) / 1e12);
  return detail::cat(flag, ": ", file, " lacks ", t.dropped, " of the run's ", t.events + t.dropped,
                     " events: a trace keeps the first ", t.max_events,
                     " recorded, so it is incomplete from virtual time ", from,
                     " (its otherData.dropped_events says ", t.dropped,
                     "); trace a shorter run for all of them");
}

}  // namespace

void SimRun::validate(const train::TrainerConfig& c) const {
  DITTO_CHECK(o_.nodes >= 1 && o_.nodes <= 4096, name_of(c, "nodes"), ": expected 1..4096, got ",
              o_.nodes);
  DITTO_CHECK(static_cast<long long>(c.devices) * o_.nodes <= 65536, c.name_of("devices"), " x ",
              name_of(c, "nodes"), ": expected at most 65536 devices in all, got ", c.devices,
              " x ", o_.nodes);
  // Only the simulator prices work without running it (Note [Dry run], sim_backend.h); "auto"
  // is resolved (and a backend that cannot run dry refused) by fit().
  const bool processes = dist::is_initialized();
  const std::string profile = name_of(c, "profile"), trace = name_of(c, "trace");
  // They change only the cost model's virtual times, which the profile (the prediction) or the
  // trace shows; without either they would be silently ignored (under mpirun plan() refuses the
  // stragglers and nodes whatever comes with them).
  // The interconnect's name, from the cost model's table (warnings() and the cost model take it
  // as valid: --interconnect nvlink5 was priced "as asked" and then failed with exit status 1).
  if (o_.interconnect != "auto") {
    const std::vector<InterconnectProfile>& links = builtin_interconnects();
    std::string known = "auto";
    bool found = false;
    for (std::size_t i = 0; i < links.size(); ++i) {
      known += (i + 1 == links.size() ? " or " : ", ") + links[i].key;
      found = found || links[i].key == o_.interconnect;
    }
    DITTO_CHECK(found, name_of(c, "interconnect"), ": expected ", known, ", got '", o_.interconnect,
                "'");
  }
  const bool priced = !o_.profile.empty() || !o_.trace.empty();
  for (const auto& [field, set] : {std::pair{"interconnect", o_.interconnect != "auto"},
                                   std::pair{"stragglers", !o_.stragglers.empty() && !processes}})
    DITTO_CHECK(!set || priced, name_of(c, field),
                ": changes only the cost model's predicted times: expected ", profile, " (or ",
                trace, ") with it, got neither");
  // Without the cost model the nodes only multiply the devices (and, past a power of two,
  // change the checksum): the devices say that.
  const long long all = static_cast<long long>(o_.nodes) * c.devices;
  DITTO_CHECK(processes || o_.nodes == 1 || priced, name_of(c, "nodes"),
              ": the nodes are the cost model's cluster (InfiniBand between them): expected ",
              profile, " (or ", trace, ") with it, got neither (without them ", name_of(c, "nodes"),
              " ", o_.nodes, " would only train on ", o_.nodes, " x ", c.devices, " = ", all,
              " devices; ", c.name_of("devices"), " ", all, " does that)");
  // torch.nn.DataParallel is one process driving the GPUs of one machine: a plan of it across
  // nodes cannot be run, and its price (every collective through device 0) would mislead.
  DITTO_CHECK(o_.nodes == 1 || c.trainer == train::TrainerKind::ddp, name_of(c, "nodes"), " ",
              o_.nodes, ": DataParallel is one process on one node: expected ",
              name_of(c, "trainer"),
              " ddp (DistributedDataParallel, a rank a GPU, spans nodes), got ",
              name_of(c, "trainer"), " dp");
  const long long devices = processes ? dist::world_size() : all;
  // The micro-shards against the simulated cluster's devices (nodes x devices), here so that
  // too few is a usage error before anything starts, as it is for one node (the Trainer's own
  // validation knows only this process's devices; fit() checks the total again).
  if (!processes && o_.nodes > 1) train::check_devices(c, all);
  for (const auto& [device, factor] : o_.stragglers) {
    const std::string s = name_of(c, "stragglers");
    DITTO_CHECK(device >= 0 && device < devices, s, " ", device, ":", factor,
                ": expected a device in 0..", devices - 1, ", got ", device);
    DITTO_CHECK(std::isfinite(factor) && factor >= CostModel::kMinSlowdown &&
                    factor <= CostModel::kMaxSlowdown,
                s, " ", device, ":", factor, ": expected a factor in ", CostModel::kMinSlowdown,
                "..", CostModel::kMaxSlowdown, ", got ", factor);
  }
  for (const std::string& spec : o_.faults) {
    const Fault f = parse_fault(spec, name_of(c, "faults"));  // names the option and the spec
    const bool skip = f.kind == Fault::Kind::skip_collective;
    const int d = skip ? f.rank : f.device;
    DITTO_CHECK(d >= 0 && d < devices, name_of(c, "faults"), " '", spec, "': expected a ",
                skip ? "rank" : "device", " in 0..", devices - 1, ", got ", d);
  }
  // A profile's name, or a .json file's: read here, so that one it cannot read or parse (a
  // missing file, a directory, malformed JSON, an unknown field) is refused naming the option,
  // with device_profile's reason, before the run (it failed in fit(), exit 1, naming
  // "device_profile").
  const std::string& p = o_.profile;
  if (!p.empty()) try {
      device_profile(p);
    } catch (const InvalidArgument& e) {
      const bool json = p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0;
      if (!json)
        throw InvalidArgument(detail::cat(profile,
                                          ": expected one of h100-sxm, h200, a100-sxm-80gb, "
                                          "a100-sxm-40gb, rtx4070-laptop or a .json file, got '",
                                          p, "'"));
      std::string why = e.what();
      const std::string head = "device_profile: ";
      if (why.compare(0, head.size(), head) == 0) why.erase(0, head.size());
      throw InvalidArgument(detail::cat(
          profile, ": expected a device profile's JSON file (docs/prediction.md), got '", p,
          "': ", why));
    }
  // Tester 6, F12: a JSON profile without "bf16_tflops" priced a bf16 run's matrix products at
  // the FP32 rate (the loader's fallback, TF32's then FP32's), 7x slower than an H100's, without
  // a word. The rate the run's dtype prices its GEMMs at must be the profile's own. (f16 may take
  // bf16_tflops: every NVIDIA tensor core runs both at one rate.)
  if (!p.empty()) {
    const std::vector<std::string> missing = json_profile_missing_rates(p);
    const auto lacks = [&](const char* field) {
      return std::find(missing.begin(), missing.end(), field) != missing.end();
    };
    const char* need = c.dtype == DType::bf16                         ? "bf16_tflops"
                       : c.dtype == DType::f16 && lacks("f16_tflops") ? "bf16_tflops"
                       : c.dtype == DType::f32 && c.allow_tf32 && lacks("tf32_tflops")
                           ? "tf32_tflops"
                           : nullptr;
    const std::string by = c.dtype == DType::f32 ? c.name_of("allow_tf32")
                                                 : c.name_of("dtype") + " " + dtype_name(c.dtype);
    DITTO_CHECK(!need || !lacks(need), profile, " ", p, ": ", by,
                " prices its matrix products at the tensor cores' ",
                c.dtype == DType::f32 ? "TF32" : "BF16 / FP16", " rate: expected a \"", need,
                c.dtype == DType::f16 ? "\" (or \"f16_tflops\")" : "\"", " field in ", p,
                ", got none (without it the FP32 rate would be taken)");
  }
  DITTO_CHECK(!c.dry_run || !p.empty(), c.name_of("dry_run"), ": expected ", profile,
              " (the GPU to predict for, e.g. a100-sxm-80gb), got none");
  DITTO_CHECK(!c.dry_run || ((c.backend == "sim" || c.backend == "auto") && !processes),
              c.name_of("dry_run"), ": expected ", c.name_of("backend"),
              " sim in one process "
              "(only the simulator prices work without running it), got ",
              c.name_of("backend"), " ", c.backend, processes ? " under mpirun" : "");
  // The cost model's cluster and the faults are the simulator's: with another backend named
  // they are a usage error here, before any backend starts (configure() said so only once the
  // backend existed: `--backend cuda --profile h100-sxm` on a machine without a GPU failed to
  // start CUDA instead, exit status 1 in ditto-train). "auto" is checked once resolved
  // (configure()).
  if (c.backend != "sim" && c.backend != "auto")
    for (const auto& [field, set] :
         {std::pair{"profile", !o_.profile.empty()}, std::pair{"trace", !o_.trace.empty()},
          std::pair{"stragglers", !o_.stragglers.empty()}, std::pair{"nodes", o_.nodes != 1},
          std::pair{"faults", !o_.faults.empty()}})
      DITTO_CHECK(!set, name_of(c, field),
                  ": the simulator's (its cost model and faults): expected ", c.name_of("backend"),
                  " sim (or auto), got ", c.name_of("backend"), " ", c.backend);
}

std::vector<std::string> SimRun::warnings(const train::TrainerConfig& c) const {
  std::vector<std::string> out;
  // An NVLink generation the profile's GPU does not have (--interconnect nvlink, NVLink 4, with
  // an A100 profile, whose GPUs have NVLink 3): priced as asked, said once.
  if (!o_.profile.empty() && o_.interconnect.rfind("nvlink", 0) == 0) {
    const std::string key = device_profile(o_.profile).key;
    const std::string own = default_interconnect(key);
    if (own.rfind("nvlink", 0) == 0 && own != o_.interconnect)
      out.push_back(detail::cat(name_of(c, "interconnect"), " ", o_.interconnect, ": the ", key,
                                " profile's GPUs have ", own, " (", interconnect_profile(own).name,
                                "), not ", o_.interconnect,
                                "; priced as asked, a cluster that does not exist"));
  }
  // A JSON profile's GPUs, with no --interconnect, are linked by the fallback PCIe Gen4 (tester 6,
  // F12: nothing said so): priced as such, said once, when there are links to price. The links
  // go by the profile's "key" (default_interconnect): one that names a built-in profile
  // ("h100-sxm") gets that profile's links, no fallback, and nothing to say (it was said, as
  // "a JSON profile's default", of the built-in's NVLink).
  const auto names_builtin = [](const std::string& key) {
    for (const DeviceProfile& p : builtin_device_profiles())
      if (p.key == key) return true;
    return false;
  };
  std::optional<std::string> json_key;  // the profile file read once
  if (o_.interconnect == "auto" && o_.profile.size() > 5 &&
      o_.profile.compare(o_.profile.size() - 5, 5, ".json") == 0 &&
      static_cast<long long>(c.devices) * o_.nodes > 1)
    json_key = device_profile(o_.profile).key;
  if (json_key && !names_builtin(*json_key)) {
    const std::string ic = default_interconnect(*json_key);
    out.push_back(detail::cat(name_of(c, "profile"), " ", o_.profile, ": no ",
                              name_of(c, "interconnect"), ": its GPUs' links priced as ", ic, " (",
                              interconnect_profile(ic).name, "), a JSON profile's default; ",
                              name_of(c, "interconnect"),
                              " nvlink, nvlink3 or pcie5 prices another"));
  }
  const bool priced = !o_.profile.empty() || !o_.trace.empty();
  if (!priced || c.devices <= kGpusPerNode) return out;
  // The interconnect the cost model prices the node with (as SimCostModelExtension resolves it).
  std::string ic = o_.interconnect;
  if (ic == "auto")
    ic = o_.profile.empty() ? std::string() : default_interconnect(device_profile(o_.profile).key);
  const long long all = static_cast<long long>(c.devices) * o_.nodes;
  // The advice: the simulator's nodes hold equal counts (--nodes x --devices), so the fewest
  // nodes of at most 8 that hold all the GPUs equally, each at least half full as a real
  // cluster's are (24: 3 of 8; 12: 2 of 6). With none (a count that is no multiple of 4..8: 11,
  // 13, 22; it said 11 nodes of 1 GPU, every collective across the network), the fewest nodes
  // with the GPU counts either side.
  const long long fewest = (all + kGpusPerNode - 1) / kGpusPerNode;
  long long nodes = fewest;
  while (all % nodes != 0 && all / (nodes + 1) >= kGpusPerNode / 2) ++nodes;
  const std::string devices = c.name_of("devices"), nodes_flag = name_of(c, "nodes");
  const bool dp = c.trainer == train::TrainerKind::dp;
  const auto cluster = [&](long long n, long long d) {
    return detail::cat(nodes_flag, " ", n, " ", devices, " ", d, dp ? " --trainer ddp" : "");
  };
  std::string use = cluster(nodes, all / nodes) + (dp ? " (DataParallel is one node's)" : "");
  if (all % nodes != 0) {
    const long long more = (all + fewest - 1) / fewest, fewer = all / fewest;
    use = detail::cat(cluster(fewest, more), " (", fewest * more, " GPUs) or ",
                      cluster(fewest, fewer), " (", fewest * fewer,
                      " GPUs): the simulator's nodes hold equal counts, and ", all,
                      " is no multiple of ", kGpusPerNode / 2, " to ", kGpusPerNode,
                      dp ? " (DataParallel is one node's)" : "");
  }
  out.push_back(detail::cat(
      devices, " ", c.devices, ": ", c.devices,
      o_.nodes == 1 ? " GPUs on one node" : " GPUs a node", ", priced as ",
      o_.nodes == 1 ? std::string("one ") : detail::cat(o_.nodes, " "), ic.empty() ? ic : ic + " ",
      "node", o_.nodes == 1 ? "" : "s", " of ", c.devices,
      o_.nodes == 1 ? " (its collectives at one node's link bandwidth, none across a network)"
                    : detail::cat(" (each node's ", c.devices,
                                  " GPUs at one node's link bandwidth, the network only between "
                                  "the nodes)"),
      "; a node holds ", kGpusPerNode, " GPUs (an HGX board): for ", all,
      " GPUs in nodes of at most ", kGpusPerNode, " (InfiniBand between them) use ", use));
  return out;
}

std::vector<std::pair<std::string, std::string>> SimRun::settings(
    const train::TrainerConfig& c) const {
  std::string stragglers, faults;
  for (const auto& [d, f] : o_.stragglers) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%d:%.17g", stragglers.empty() ? "" : " ", d, f);
    stragglers += buf;
  }
  for (const std::string& f : o_.faults) faults += (faults.empty() ? "" : " ") + f;
  return {{name_of(c, "profile"), o_.profile},
          {name_of(c, "interconnect"), o_.interconnect},
          {name_of(c, "nodes"), std::to_string(o_.nodes)},
          {name_of(c, "stragglers"), stragglers},
          {name_of(c, "trace"), o_.trace},
          {name_of(c, "faults"), faults}};
}

void SimRun::plan(const train::TrainerConfig& c, const train::RunPlan& plan,
                  BackendOptions& options) const {
  DITTO_CHECK(!plan.processes || (o_.profile.empty() && o_.trace.empty() && o_.stragglers.empty() &&
                                  o_.nodes == 1),
              name_of(c, "profile"), ", ", name_of(c, "trace"), ", ", name_of(c, "stragglers"),
              " and ", name_of(c, "nodes"), ": expected a single-process run, got mpirun with ",
              plan.world_size, " processes (the cost model sees one process's devices)");
  DITTO_CHECK(!plan.processes || o_.faults.empty(), name_of(c, "faults"),
              ": expected a single-process run, got mpirun with ", plan.world_size,
              " processes (each process holds one device, so fault devices and ranks would not "
              "match the job's)");
  // The profile's memory per device (a simulated H100 has 80 GB), unless set.
  if (plan.backend == "sim" && !o_.profile.empty() && !c.memory_capacity)
    options.memory_capacity = static_cast<std::size_t>(device_profile(o_.profile).memory_bytes);
  // Note [Dry addresses] (sim_dry_arena.h): the one limit a dry run's size meets (SimBackend
  // checks it too, naming its own options), said here with the options that set it.
  const std::size_t n = static_cast<std::size_t>(options.device_count.value_or(1));
  if (plan.backend == "sim" && options.dry_run &&
      options.memory_capacity > DryArena::kAddressSpace / n) {
    const std::string memory = c.memory_capacity ? name_of(c, "memory_capacity")
                                                 : name_of(c, "profile") + " " + o_.profile;
    const std::size_t gib = std::size_t(1) << 30, most = DryArena::kAddressSpace / n;
    char got[32];
    std::snprintf(got, sizeof got, "%.10g", double(options.memory_capacity) / double(gib));
    throw InvalidArgument(detail::cat(
        c.name_of("devices"), o_.nodes > 1 ? " x " + name_of(c, "nodes") : std::string(), " x ",
        memory, ": a dry run's devices take their addresses (never host memory) from one span of ",
        DryArena::kAddressSpace / gib, " GiB, at least their capacity each: expected at most ",
        most / gib, " GiB per device for ", n, " devices, got ", got, " GiB"));
  }
}

void SimRun::configure(const train::TrainerConfig& c, const train::RunContext& run) {
  Backend& be = run.backend;
  report_ = {};
  auto* cm = be.extension<CostModelExtension>();
  const bool wanted =
      !o_.profile.empty() || !o_.trace.empty() || !o_.stragglers.empty() || o_.nodes != 1;
  if (!cm) {
    DITTO_CHECK(!wanted, name_of(c, "profile"), ", ", name_of(c, "trace"), ", ",
                name_of(c, "stragglers"), " and ", name_of(c, "nodes"),
                ": expected the sim backend, got ", be.name());
  } else {
    const int devices = static_cast<int>(run.devices.size());
    cm->configure({o_.profile, o_.interconnect, o_.nodes, devices / o_.nodes});
    for (const auto& [device, factor] : o_.stragglers) cm->set_slowdown(device, factor);
    if (!o_.trace.empty()) {
      cm->set_trace_max_events(o_.trace_max_events);
      cm->set_tracing(true);
    }
  }
  if (!o_.faults.empty()) {
    auto* fx = be.extension<FaultExtension>();
    DITTO_CHECK(fx, name_of(c, "faults"), ": expected the sim backend, got ", be.name());
    fx->set_faults(o_.faults, name_of(c, "faults"));
  }
  if (!o_.trace.empty()) check_trace_path(c, o_.trace);  // before training: it must not cost it
}

void SimRun::finish(const train::TrainerConfig& c, const train::RunContext& run,
                    train::FitResult& result) {
  Backend& be = run.backend;
  if (auto* fx = be.extension<FaultExtension>()) report_.unfired_faults = fx->unfired_faults();
  auto* cm = be.extension<CostModelExtension>();
  if (run.processes || !cm || o_.trace.empty()) return;
  try {  // after training: a failure here must not lose the run's result (FitResult)
    cm->write_trace(o_.trace);
    report_.trace = o_.trace;
    report_.trace_dropped = dropped_events(name_of(c, "trace"), o_.trace, cm->trace_stats());
  } catch (const Error& e) {
    result.output_errors.push_back(detail::cat(name_of(c, "trace"), ": ", e.what()));
  }
}

void SimRun::failed(const train::TrainerConfig& c, const train::RunContext& run) {
  auto* cm = run.backend.extension<CostModelExtension>();
  if (run.processes || !cm || o_.trace.empty()) return;
  try {  // the trace up to the failure (the streams are drained): what filled the device
    cm->write_trace(o_.trace);
    report_.trace = o_.trace;
    report_.failed_run = true;
    report_.trace_dropped = dropped_events(name_of(c, "trace"), o_.trace, cm->trace_stats());
  } catch (const std::exception& e) {
    report_.failed_trace_error = e.what();
  }
}

std::shared_ptr<SimRun> add_sim_run(train::TrainerConfig& config, SimRunOptions options) {
  auto run = std::make_shared<SimRun>(std::move(options));
  config.extensions.push_back(run);
  return run;
}

}  // namespace ditto::sim
