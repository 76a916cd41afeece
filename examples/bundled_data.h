// Where the example programs find the data sets bundled with ditto (examples/data/): next to the
// installed program, <prefix>/bin/../share/ditto/NAME as `cmake --install` lays it out
// (DITTO_INSTALLED_DATA_RELDIR, relative to the program's folder), else in the source tree the
// build was configured from (DITTO_BUNDLED_DATA_DIR), which is where a build-tree program finds it.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace ditto_examples {

/// Path of the bundled data file `name` (e.g. "digits.csv"); the source-tree path when no
/// installed copy is found (whether that exists is for the caller's reader to report).
inline std::string bundled_data_path(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);  // Linux; elsewhere: source tree
  if (!ec) {
    const fs::path installed = exe.parent_path() / DITTO_INSTALLED_DATA_RELDIR / name;
    if (fs::is_regular_file(installed, ec)) return installed.lexically_normal().string();
  }
  return (fs::path(DITTO_BUNDLED_DATA_DIR) / name).string();
}

}  // namespace ditto_examples
