#include "backend_sim/sim_faults.h"

#include <cerrno>
#include <cstdlib>
#include <map>

#include "core/base/error.h"

namespace ditto::sim {

Fault parse_fault(const std::string& spec, const std::string& flag) {
  const std::string where = flag + " '" + spec + "'";
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  Fault f;
  f.spec = spec;
  std::vector<std::string> keys;
  if (kind == "fail") {
    f.kind = Fault::Kind::fail_device;
    keys = {"device", "step"};
  } else if (kind == "alloc") {
    f.kind = Fault::Kind::fail_alloc;
    keys = {"device", "after"};
  } else if (kind == "skip-collective") {
    f.kind = Fault::Kind::skip_collective;
    keys = {"rank", "index"};
  } else {
    throw InvalidArgument(detail::cat(where,
                                      ": expected a fault kind fail, alloc or "
                                      "skip-collective before ':', got '",
                                      kind, "'"));
  }
  DITTO_CHECK(colon != std::string::npos, where, ": expected ", kind, ":", keys[0], "=N,", keys[1],
              "=N, got no ':'");
  std::map<std::string, std::int64_t> values;
  std::string rest = spec.substr(colon + 1);
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    std::size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    const std::string item = rest.substr(pos, comma - pos);
    pos = comma + 1;
    const auto eq = item.find('=');
    DITTO_CHECK(eq != std::string::npos, where, ": expected key=value, got '", item, "'");
    const std::string key = item.substr(0, eq), text = item.substr(eq + 1);
    DITTO_CHECK(key == keys[0] || key == keys[1], where, ": unknown key '", key, "' (", kind,
                " takes ", keys[0], " and ", keys[1], ")");
    DITTO_CHECK(!values.count(key), where, ": ", key, " given twice");
    errno = 0;
    char* end = nullptr;
    const long long v = text.empty() ? -1 : std::strtoll(text.c_str(), &end, 10);
    const bool ok = !text.empty() && end && *end == '\0' && errno == 0 && v >= 0 &&
                    (key == "step" || key == "after" || key == "index" || v <= 65535);
    DITTO_CHECK(ok, where, ": ", key, ": expected an integer >= 0",
                (key == "device" || key == "rank") ? " and < 65536" : "", ", got '", text, "'");
    values[key] = v;
  }
  for (const std::string& k : keys)
    DITTO_CHECK(values.count(k), where, ": missing ", k, "= (expected ", kind, ":", keys[0], "=N,",
                keys[1], "=N)");
  switch (f.kind) {
    case Fault::Kind::fail_device:
      f.device = static_cast<int>(values["device"]);
      f.step = values["step"];
      break;
    case Fault::Kind::fail_alloc:
      f.device = static_cast<int>(values["device"]);
      f.after = values["after"];
      break;
    case Fault::Kind::skip_collective:
      f.rank = static_cast<int>(values["rank"]);
      f.index = values["index"];
      break;
  }
  return f;
}

}  // namespace ditto::sim
