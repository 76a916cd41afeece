// holds_checkpoint and checkpoint_entries (core/checkpoint/checkpoint.h): whether a directory has
// a checkpoint to resume from, and which; checkpoint_run_dir: the directory a resume continues.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"

namespace ditto {

std::string checkpoint_run_dir(const std::string& resume_dir) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(resume_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string leaf = p.filename().string();
  std::error_code ec;
  if (leaf.rfind("step-", 0) == 0 && fs::exists(p / "trainer.json", ec))
    return p.has_parent_path() ? p.parent_path().string() : std::string(".");
  return resume_dir;
}

std::vector<std::string> checkpoint_entries(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DITTO_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), what,
              ": expected a checkpoint "
              "directory (or one to create), got '",
              dir, "', which is not a directory");
  std::vector<std::string> found;
  const fs::path latest = fs::path(dir) / "latest";
  if (fs::exists(latest, ec) && !fs::is_directory(latest, ec)) found.push_back("latest");
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) found.push_back(n);
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool holds_checkpoint(const std::string& dir, const std::string& what) {
  std::error_code ec;
  return !checkpoint_entries(dir, what).empty() ||
         std::filesystem::exists(std::filesystem::path(dir) / "latest", ec);
}

}  // namespace ditto
