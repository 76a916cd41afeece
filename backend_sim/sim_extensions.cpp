// CostModelExtension and FaultExtension of the simulator (sim_extensions.h).
#include "backend_sim/sim_extensions.h"

#include "backend_sim/cost_model.h"
#include "backend_sim/profiles.h"
#include "backend_sim/sim_backend.h"

namespace ditto::sim {
namespace {

class SimCostModelExtension final : public CostModelExtension {
 public:
  explicit SimCostModelExtension(CostModel& cost) : cost_(cost) {}

  void configure(const CostClusterOptions& o) override {
    ClusterSpec c = cost_.cluster();
    if (!o.profile.empty()) c.device = device_profile(o.profile);
    const std::string ic =
        o.interconnect == "auto" ? default_interconnect(c.device.key) : o.interconnect;
    c.interconnect = interconnect_profile(ic);
    c.nodes = o.nodes;
    c.devices_per_node = o.devices_per_node;
    cost_.configure(c);
  }
  void set_slowdown(int device, double factor) override { cost_.set_slowdown(device, factor); }
  void set_tracing(bool on) override { cost_.set_tracing(on); }
  void write_trace(const std::string& path) const override { cost_.write_trace(path); }
  void set_trace_max_events(std::size_t max_events) override {
    cost_.set_trace_max_events(max_events);
  }
  TraceStats trace_stats() const override { return cost_.trace_stats(); }
  CostSnapshot totals() const override {
    CostTotals t = cost_.totals();
    return {t.now, t.gemm_flops, std::vector<std::int64_t>(t.comm.begin(), t.comm.end())};
  }
  std::string device_name() const override { return cost_.cluster().device.name; }
  std::string interconnect_name() const override { return cost_.cluster().interconnect.key; }
  int nodes() const override { return cost_.cluster().nodes; }
  double peak_flops() const override { return cost_.cluster().device.fp32_flops; }
  double bf16_peak_flops() const override { return cost_.cluster().device.bf16_flops; }
  std::pair<double, double> efficiencies() const override {
    return {cost_.cluster().device.gemm_efficiency, cost_.cluster().device.memory_efficiency};
  }
  CostRates rates() const override {
    const DeviceProfile& d = cost_.cluster().device;
    return {d.fp32_flops,        d.tf32_flops,
            d.bf16_flops,        d.f16_flops > 0 ? d.f16_flops : d.bf16_flops,
            d.memory_bandwidth,  d.gemm_efficiency,
            d.memory_efficiency, d.simt_efficiency,
            cost_.allow_tf32(),  d.mma_efficiency};
  }
  std::vector<CostLedgerRow> ledger(int device) const override {
    std::vector<CostLedgerRow> out;
    for (const CostModel::LedgerRow& r : cost_.ledger(device))
      out.push_back({r.name, unit_name(r.unit), r.count, r.flops, r.bytes, r.time});
    return out;
  }
  std::size_t profile_memory_bytes(const std::string& profile) const override {
    return static_cast<std::size_t>(device_profile(profile).memory_bytes);
  }

 private:
  CostModel& cost_;
};

class SimFaultExtension final : public FaultExtension {
 public:
  explicit SimFaultExtension(SimBackend& backend) : backend_(backend) {}

  void set_faults(const std::vector<std::string>& specs, const std::string& flag) override {
    FaultConfig fc;
    for (const std::string& s : specs) fc.faults.push_back(parse_fault(s, flag));
    fc.comm_timeout_ms = comm_timeout_ms_;
    backend_.set_faults(fc);
    specs_ = specs;
    flag_ = flag;
  }
  void set_comm_timeout(std::optional<std::int64_t> comm_timeout_ms) override {
    FaultConfig fc;
    for (const std::string& s : specs_) fc.faults.push_back(parse_fault(s, flag_));
    fc.comm_timeout_ms = comm_timeout_ms;
    backend_.set_faults(fc);
    comm_timeout_ms_ = comm_timeout_ms;
  }
  std::vector<std::string> unfired_faults() const override { return backend_.unfired_faults(); }

 private:
  SimBackend& backend_;
  std::vector<std::string> specs_;  // the faults and the timeout set, each kept by the other's call
  std::string flag_ = "--fault";
  std::optional<std::int64_t> comm_timeout_ms_;
};

}  // namespace

std::unique_ptr<CostModelExtension> make_cost_model_extension(CostModel& cost) {
  return std::make_unique<SimCostModelExtension>(cost);
}

std::unique_ptr<FaultExtension> make_fault_extension(SimBackend& backend) {
  return std::make_unique<SimFaultExtension>(backend);
}

}  // namespace ditto::sim
