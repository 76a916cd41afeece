// temp_leftovers: what io::write_file_atomic / write_file_replace left behind in a directory
// (Note [Atomic write] in core/io/file.h), for the tests of the files ditto writes. Its own header
// rather than test_util.h, which every test includes.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace ditto::test {

/// The names in `dir` that io::open_temp_beside's temporaries have (".<name>.tmp.XXXXXX",
/// Note [Atomic write]), sorted: what a write left behind there; only those of file `of` when
/// it is given.
inline std::vector<std::string> temp_leftovers(const std::string& dir, const std::string& of = "") {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    const std::size_t at = n.rfind(".tmp.");
    if (!n.empty() && n[0] == '.' && at != std::string::npos && n.size() == at + 11 &&
        (of.empty() || n.substr(1, at - 1) == of))
      found.push_back(n);
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace ditto::test
