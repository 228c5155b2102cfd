// file_text.h: a whole file's bytes as a string, and back, for tests that write fixtures and read outputs.
#pragma once
#include <fstream>
#include <sstream>
#include <string>

namespace mt::testing_util {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace mt::testing_util
