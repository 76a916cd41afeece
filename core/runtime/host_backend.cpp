// The "cpu" backend: host memory for tensors that live on the host (data sets, batches, results
// gathered to the host). Its stream runs work synchronously; it runs no kernels.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/base/error.h"
#include "core/runtime/backend.h"

namespace ditto {
namespace {

/// The refusal of a host allocation (tester 6, F11: a real simulator run of a model too big for
/// the machine ended with "cpu: out of memory allocating 321945600 bytes", naming neither why nor
/// what to do).
std::string host_oom(std::size_t bytes, std::size_t held) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double mib = 1048576.0, ram = pages > 0 && page > 0 ? double(pages) * double(page) : 0;
  char figures[160];
  std::snprintf(figures, sizeof figures,
                "(%.2f MiB): host tensors live in this machine's RAM (%.2f MiB held by them; this "
                "machine has %.2f MiB",
                double(bytes) / mib, double(held) / mib, ram / mib);
  return detail::cat("cpu: out of memory allocating ", bytes, " bytes ", figures,
                     ", less under a ulimit), as a simulator's devices' do: --dry-run predicts a "
                     "model larger than the machine without holding its tensors");
}

class HostStream final : public Stream {
 public:
  Device device() const override { return Device::cpu(); }
  void synchronize() override {}
  void record(Event&) override {}
  void wait(const Event&) override {}
};

class HostEvent final : public Event {
 public:
  void synchronize() override {}
  bool query() override { return true; }
};

class HostBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  int device_count() const override { return 1; }
  DeviceProperties properties(int) const override { return {"host memory", 0}; }
  MemoryStats memory_stats(int) const override {
    return {in_use_.load(), peak_.load(), static_cast<std::size_t>(-1)};
  }
  void reset_peak_memory(int) override { peak_.store(in_use_.load()); }

  void* allocate(int, std::size_t bytes) override {
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw OutOfMemory(host_oom(bytes, in_use_.load()), OutOfMemory::Kind::host);
    std::size_t now = in_use_.fetch_add(bytes) + bytes;
    std::size_t old = peak_.load();
    while (now > old && !peak_.compare_exchange_weak(old, now)) {
    }
    return p;
  }
  void deallocate(int, void* ptr, std::size_t bytes) noexcept override {
    std::free(ptr);
    in_use_.fetch_sub(bytes);
  }

  Stream& default_stream(int) override { return stream_; }
  std::unique_ptr<Stream> create_stream(int) override { return std::make_unique<HostStream>(); }
  std::unique_ptr<Event> create_event(int) override { return std::make_unique<HostEvent>(); }

  void copy_from_host(Stream&, void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void copy_to_host(Stream&, void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void copy_2d(Stream&, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows) override {
    for (std::size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dst_pitch,
                   static_cast<const char*>(src) + r * src_pitch, row_bytes);
  }

  Kernels& kernels() override {
    throw InvalidArgument(
        "backend cpu runs no kernels: move tensors to a 'sim' or 'cuda' device first");
  }
  std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>&,
                                                        const CommOptions&) override {
    throw InvalidArgument("Communicator: backend cpu has no communicators (use 'sim' or 'cuda')");
  }

 private:
  HostStream stream_;
  std::atomic<std::size_t> in_use_{0}, peak_{0};
};

}  // namespace

std::shared_ptr<Backend> make_host_backend(const BackendOptions&) {
  return std::make_shared<HostBackend>();
}

}  // namespace ditto
