#include "core/parallel/parallel_apply.h"

#include <exception>
#include <thread>

#include "core/error.h"

namespace ditto::parallel {

namespace {
std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}
}  // namespace

void parallel_apply(const std::vector<Device>& devices, const char* what,
                    const std::function<void(int)>& fn) {
  const int n = static_cast<int>(devices.size());
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  auto run = [&](int i) {
    try {
      fn(i);
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
    }
  };
  if (n == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    try {
      for (int i = 0; i < n; ++i) threads.emplace_back(run, i);
    } catch (...) {  // could not start a thread: finish the ones started, then report
      for (auto& t : threads) t.join();
      throw BackendError(detail::cat("parallel_apply: could not start ", n, " threads"));
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < n; ++i) {
    if (!errors[static_cast<std::size_t>(i)]) continue;
    std::string msg = detail::cat("DataParallel: replica ", i, " on ", devices[static_cast<std::size_t>(i)].str(),
                                  " failed in ", what, ": ",
                                  message_of(errors[static_cast<std::size_t>(i)]));
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(i)]);
    } catch (const OutOfMemory&) {
      throw OutOfMemory(msg);
    } catch (const Timeout&) {
      throw Timeout(msg);
    } catch (const InvalidArgument&) {
      throw InvalidArgument(msg);
    } catch (...) {
      throw Error(msg);
    }
  }
}

}  // namespace ditto::parallel
