// source_root.h: where the tests' data is (configs/, tests/data/, tests/interop/), found at run time, so a test
// binary copied elsewhere (the GPU bundle: bin/test_* beside configs/) finds its own copy and never a path of
// the machine that built it.
//   1. MEGATRAIN_SOURCE_DIR in the environment (ctest sets it to the source tree), when set: it must hold
//      configs/gpt-tiny.yaml;
//   2. else the nearest folder at or above the executable's that holds configs/gpt-tiny.yaml (build/tests/ of a
//      checkout reaches the checkout, bin/ of a bundle reaches the bundle).
// Throws, naming what was tried, when neither gives one.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace mt::testing_util {

namespace source_root_detail {

inline bool holds_test_data(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "configs" / "gpt-tiny.yaml", ec);
}

inline std::filesystem::path find() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("MEGATRAIN_SOURCE_DIR"); env != nullptr && *env != '\0') {
    if (holds_test_data(env)) return fs::path(env);
    throw std::runtime_error(std::string("MEGATRAIN_SOURCE_DIR=") + env +
                             " holds no configs/gpt-tiny.yaml (it should name the megatrain checkout or bundle)");
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot read /proc/self/exe to find the test data: " + ec.message());
  for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (holds_test_data(dir)) return dir;
    if (dir == dir.root_path()) break;
  }
  throw std::runtime_error("no configs/gpt-tiny.yaml in any folder above " + exe.string() +
                           ": set MEGATRAIN_SOURCE_DIR to the megatrain checkout or bundle");
}

}  // namespace source_root_detail

// The folder that holds configs/ and tests/ (found once per process).
inline const std::filesystem::path& source_root() {
  static const std::filesystem::path root = source_root_detail::find();
  return root;
}

// A path under it: source_path("configs/gpt-tiny.yaml").
inline std::string source_path(const std::string& relative) { return (source_root() / relative).string(); }

}  // namespace mt::testing_util
