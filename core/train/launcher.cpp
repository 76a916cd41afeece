// launch_ranks, RankBarrier and root_error (launcher.h).
#include "core/train/launcher.h"

#include <map>
#include <system_error>
#include <thread>

#include "core/base/error.h"
#include "core/distributed/distributed.h"

namespace ditto::train {
namespace {

// What the exception in flight says: what() of a std::exception, or a description of one that is
// not (a user's callback or data source may throw anything, e.g. `throw 42`).
std::string what_of_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

}  // namespace

void RankBarrier::throw_failure() const {
  throw PeerFailure(detail::cat("rank barrier: ", failure_), failed_rank_);
}

void RankBarrier::arrive(const std::function<void()>& last) {
  std::unique_lock lk(mu_);
  if (!failure_.empty()) throw_failure();
  const std::uint64_t gen = generation_;
  if (++arrived_ == ranks_) {
    try {
      if (last) last();
    } catch (...) {
      failure_ = detail::cat("the epoch's cost snapshot failed: ", what_of_current_exception());
      cv_.notify_all();
      throw;
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || !failure_.empty(); });
  if (generation_ == gen) throw_failure();
}

void RankBarrier::abort(int rank, const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (failure_.empty()) {
      failure_ = detail::cat("rank ", rank, " failed: ", why);
      failed_rank_ = rank;
    }
  }
  cv_.notify_all();
}

std::exception_ptr root_error(const std::vector<std::pair<int, std::exception_ptr>>& errors) {
  for (const auto& [r, e] : errors) {
    try {
      std::rethrow_exception(e);
    } catch (const PeerFailure& p) {
      if (p.failed_rank() == r) return e;  // this rank's own failure, echoed back to it
    } catch (...) {
      return e;
    }
  }
  return errors.front().second;
}

std::string settings_disagreement(const std::vector<RankSettings>& per_rank) {
  if (per_rank.empty()) return "";
  const RankSettings& first = per_rank.front();
  // The k-th value of `name` (0-based): a name given twice is compared occurrence by
  // occurrence (tester C, C2: the second --lr hid every setting after it behind the first's
  // equal values, "ranks disagree on --lr: rank 0 has 0.05, rank 1 has 0.05").
  auto find = [](const RankSettings& s, const std::string& name,
                 std::size_t k) -> const std::string* {
    for (const auto& [n, v] : s)
      if (n == name && k-- == 0) return &v;
    return nullptr;
  };
  // Unset: a name the rank lacks, or an empty value (an option not given, e.g. --checkpoint;
  // tester C, C8: it printed as nothing, "rank 1 has ").
  auto say = [](const std::string* v) { return v && !v->empty() ? *v : std::string("(not set)"); };
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    const RankSettings& other = per_rank[r];
    if (other == first) continue;
    auto report = [&](const std::string& name, std::size_t k) {
      return detail::cat("ranks disagree on ", name, ": rank 0 has ", say(find(first, name, k)),
                         ", rank ", r, " has ", say(find(other, name, k)));
    };
    std::map<std::string, std::size_t> seen;  // occurrences so far, by name
    for (const auto& [name, value] : first) {
      const std::size_t k = seen[name]++;
      if (const std::string* v = find(other, name, k); !v || *v != value) return report(name, k);
    }
    seen.clear();
    for (const auto& [name, value] : other) {
      const std::size_t k = seen[name]++;
      if (!find(first, name, k)) return report(name, k);
    }
    // The same pairs in another order: the first position that differs.
    for (std::size_t i = 0; i < first.size() && i < other.size(); ++i)
      if (first[i] != other[i])
        return detail::cat("ranks disagree on the order of their settings: rank 0 has ",
                           first[i].first, " at position ", i, ", rank ", r, " has ",
                           other[i].first);
    return detail::cat("ranks disagree on their settings: rank 0 has ", first.size(), ", rank ", r,
                       " has ", other.size());
  }
  return "";
}

namespace {

// RankSettings as one text: each name and value prefixed by its length (no escaping needed).
std::string encode(const RankSettings& s) {
  std::string out;
  for (const auto& [n, v] : s) out += detail::cat(n.size(), ':', n, v.size(), ':', v);
  return out;
}

RankSettings decode(const std::string& text) {
  RankSettings out;
  std::size_t at = 0;
  auto field = [&](std::string& f) {
    const std::size_t colon = text.find(':', at);
    DITTO_CHECK_T(InternalError, colon != std::string::npos,
                  "check_ranks_agree: a rank's "
                  "settings are not in the expected encoding");
    const std::size_t n = std::stoull(text.substr(at, colon - at));
    DITTO_CHECK_T(InternalError, colon + 1 + n <= text.size(),
                  "check_ranks_agree: a rank's "
                  "settings are cut short");
    f = text.substr(colon + 1, n);
    at = colon + 1 + n;
  };
  while (at < text.size()) {
    std::pair<std::string, std::string> p;
    field(p.first);
    field(p.second);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

void check_ranks_agree(const RankSettings& mine, std::int64_t timeout_ms) {
  check_ranks_agree(mine, timeout_ms, nullptr);
}

void refuse_run(const std::exception_ptr& refused, std::int64_t timeout_ms) {
  DITTO_ASSERT(refused);
  check_ranks_agree({}, timeout_ms, refused);  // rethrows `refused`
  std::rethrow_exception(refused);
}

void check_ranks_agree(const RankSettings& mine, std::int64_t timeout_ms,
                       const std::exception_ptr& refused) {
  if (!dist::is_initialized() || dist::world_size() == 1) {
    if (refused) std::rethrow_exception(refused);
    return;
  }
  // One text per rank: 'S' and its settings, or 'E' and its error (cut to a few KiB: the
  // exchange is bounded), never both: a rank that refused may not have settled its settings.
  std::string text = 'S' + encode(mine);
  if (refused) {
    text = "Ean exception that is not a std::exception";
    try {
      std::rethrow_exception(refused);
    } catch (const std::exception& e) {
      text = std::string("E") + e.what();
    } catch (...) {
    }
    constexpr std::size_t kMaxText = 4096;
    if (text.size() > kMaxText) text = text.substr(0, kMaxText) + " (cut)";
  }
  const std::vector<std::string> texts = dist::all_gather_text(text, timeout_ms);
  std::vector<RankSettings> all;
  int first_refused = -1, refusals = 0;
  for (std::size_t r = 0; r < texts.size(); ++r) {
    const std::string& t = texts[r];
    DITTO_CHECK_T(InternalError, !t.empty() && (t[0] == 'S' || t[0] == 'E'),
                  "check_ranks_agree: rank ", r, "'s record is not in the expected encoding");
    if (t[0] == 'S')
      all.push_back(decode(t.substr(1)));
    else if (refusals++ == 0)
      first_refused = static_cast<int>(r);
  }
  if (refused) std::rethrow_exception(refused);
  if (refusals > 0)
    throw PeerFailure(detail::cat("rank ", first_refused, " refused its arguments: ",
                                  texts[static_cast<std::size_t>(first_refused)].substr(1),
                                  refusals > 1 ? detail::cat(" (and ", refusals - 1, " more rank",
                                                             refusals > 2 ? "s" : "", ")")
                                               : std::string()),
                      first_refused);
  const std::string why = settings_disagreement(all);
  if (!why.empty()) throw InvalidArgument(why);
}

int& rank_thread_failure_for_testing() {
  static int rank = -1;
  return rank;
}

namespace {

// Start rank `rank`'s thread of `ranks`, or throw ditto::Error naming it, the system's reason and
// what to change (std::thread throws std::system_error when the system has no room for another
// thread: address space, stack, thread count).
void start_rank_thread(std::vector<std::thread>& threads, int rank, int ranks,
                       std::function<void()> body) {
  if (rank_thread_failure_for_testing() == rank) {
    throw Error(detail::cat("launch_ranks: cannot create the thread of rank ", rank, " of ", ranks,
                            ": Resource temporarily unavailable (a test's injected failure)"));
  }
  try {
    threads.emplace_back(std::move(body));
  } catch (const std::system_error& e) {
    throw Error(detail::cat(
        "launch_ranks: cannot create the thread of rank ", rank, " of ", ranks, ": ",
        e.code().message(), " (each rank is a thread with its own stack, ",
        "`ulimit -s`, within the address-space and thread limits `ulimit -v` and `ulimit -u`: "
        "run fewer devices, or raise those limits)"));
  }
}

}  // namespace

void launch_ranks(const std::vector<Device>& devices, const CommOptions& options,
                  RankBarrier* barrier, const std::function<void(Communicator&)>& body,
                  const std::function<void()>& after,
                  const std::function<RankSettings(int rank)>& settings) {
  if (dist::is_initialized()) {
    DITTO_CHECK(!devices.empty(), "launch_ranks: devices: expected this process's device");
    // Before the communicator: processes of different determinism must not meet in one.
    RankSettings mine{{"CommOptions::determinism", determinism_name(options.determinism)}};
    std::exception_ptr refused;  // this process's settings refused: the others learn it at once
    try {
      if (settings) {
        const RankSettings s = settings(dist::rank());
        mine.insert(mine.end(), s.begin(), s.end());
      }
    } catch (...) {
      refused = std::current_exception();
    }
    check_ranks_agree(mine, options.timeout_ms, refused);
    Communicator comm =
        Communicator::init_rank(devices[0], dist::world_size(), dist::rank(), options);
    try {
      body(comm);
    } catch (...) {  // anything: a user's callback may throw what it likes
      comm.abort(what_of_current_exception());  // the other processes fail now, naming this rank
      throw;
    }
    if (after) after();
    return;
  }
  if (settings) {  // threads: every rank's settings at hand, checked before any communicator
    std::vector<RankSettings> all;
    for (int r = 0; r < static_cast<int>(devices.size()); ++r) all.push_back(settings(r));
    const std::string why = settings_disagreement(all);
    if (!why.empty()) throw InvalidArgument(why);
  }
  std::vector<Communicator> comms = Communicator::init_all(devices, options);
  std::mutex errors_mu;
  std::vector<std::pair<int, std::exception_ptr>> errors;  // in the order the ranks failed
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  const int n = static_cast<int>(comms.size());
  for (int r = 0; r < n; ++r) {
    try {
      start_rank_thread(threads, r, n, [&, r] {
        try {
          body(comms[static_cast<std::size_t>(r)]);
        } catch (...) {  // anything (`throw 42` from a callback): an escape would std::terminate
          const std::string why = what_of_current_exception();
          {
            std::lock_guard lk(errors_mu);
            errors.emplace_back(r, std::current_exception());
          }
          comms[static_cast<std::size_t>(r)].abort(why);  // the others fail now, naming r
          if (barrier) barrier->abort(r, why);
        }
      });
    } catch (const Error& e) {
      // Rank r never started: the ranks already running wait for it in their first collective
      // or barrier. Fail them naming r, join them, and report the thread that could not start
      // (a vector of joinable threads going out of scope would call std::terminate).
      comms[static_cast<std::size_t>(r)].abort(e.what());
      if (barrier) barrier->abort(r, e.what());
      for (auto& t : threads) t.join();
      throw;
    }
  }
  for (auto& t : threads) t.join();
  if (!errors.empty()) std::rethrow_exception(root_error(errors));
  if (after) after();
}

}  // namespace ditto::train
