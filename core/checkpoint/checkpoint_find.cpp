// holds_checkpoint (core/checkpoint/checkpoint.h): whether a directory has a checkpoint to resume
// from.
#include <filesystem>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"

namespace ditto {

bool holds_checkpoint(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DITTO_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), what,
              ": expected a checkpoint "
              "directory (or one to create), got '",
              dir, "', which is not a directory");
  if (fs::exists(fs::path(dir) / "latest", ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) return true;
  }
  return false;
}

}  // namespace ditto
