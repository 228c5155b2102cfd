#include "core/checkpoint/metadata.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

namespace mt::ckpt {

std::string rank_data_file(int rank) { return fmt::format("rank_{:05d}.bin", rank); }
std::string rank_index_file(int rank) { return fmt::format("rank_{:05d}.index.yaml", rank); }

namespace {

void emit_tensors(YAML::Emitter& e, const std::vector<TensorEntry>& tensors) {
  e << YAML::Key << "tensors" << YAML::Value << YAML::BeginSeq;
  for (const auto& t : tensors) {
    e << YAML::BeginMap;
    e << YAML::Key << "name" << YAML::Value << t.name;
    e << YAML::Key << "dtype" << YAML::Value << std::string(dtype_name(t.dtype));
    e << YAML::Key << "shape" << YAML::Value << YAML::Flow << t.shape;
    e << YAML::Key << "slices" << YAML::Value << YAML::BeginSeq;
    for (const auto& s : t.slices) {
      e << YAML::Flow << YAML::BeginMap;
      e << YAML::Key << "file" << YAML::Value << s.file;
      e << YAML::Key << "offset" << YAML::Value << s.offset;
      e << YAML::Key << "bytes" << YAML::Value << s.bytes;
      e << YAML::Key << "start" << YAML::Value << YAML::Flow << s.start;
      e << YAML::Key << "extent" << YAML::Value << YAML::Flow << s.extent;
      e << YAML::Key << "crc32" << YAML::Value << fmt::format("0x{:08x}", s.crc);
      e << YAML::EndMap;
    }
    e << YAML::EndSeq << YAML::EndMap;
  }
  e << YAML::EndSeq;
}

std::string emit_metadata_with(const CheckpointState& state, const std::vector<TensorEntry>& tensors,
                               YAML::EMITTER_MANIP config_style) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "format_version" << YAML::Value << kFormatVersion;
  e << YAML::Key << "iteration" << YAML::Value << state.iteration;
  e << YAML::Key << "state" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "values" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : state.values) e << YAML::Key << k << YAML::Value << YAML::DoubleQuoted << v;
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "config" << YAML::Value << config_style << state.config_yaml;
  emit_tensors(e, tensors);
  e << YAML::EndMap;
  if (!e.good()) throw CheckpointError("cannot emit checkpoint metadata: " + e.GetLastError());
  return std::string(e.c_str()) + "\n";
}

// Error context for one node: "PATH: tensors[3] (NAME): ".
struct Where {
  std::string path, ctx;
  [[noreturn]] void fail(const std::string& msg) const {
    throw CheckpointError(ctx.empty() ? fmt::format("{}: {}", path, msg) : fmt::format("{}: {}: {}", path, ctx, msg));
  }
};

YAML::Node field(const YAML::Node& n, const char* key, const Where& w) {
  if (!n.IsMap()) w.fail("expected a map");
  YAML::Node v = n[key];
  if (!v.IsDefined() || v.IsNull()) w.fail(fmt::format("missing field '{}'", key));
  return v;
}

template <class T>
T as(const YAML::Node& n, const char* key, const Where& w) {
  YAML::Node v = field(n, key, w);
  try {
    if (!v.IsScalar()) throw YAML::Exception(v.Mark(), "not a scalar");
    return v.as<T>();
  } catch (const YAML::Exception&) {
    w.fail(fmt::format("field '{}' has a bad value", key));
  }
}

std::vector<int64_t> as_ints(const YAML::Node& n, const char* key, const Where& w) {
  YAML::Node v = field(n, key, w);
  if (!v.IsSequence()) w.fail(fmt::format("field '{}' must be a list of integers", key));
  std::vector<int64_t> out;
  try {
    for (const auto& x : v) out.push_back(x.as<int64_t>());
  } catch (const YAML::Exception&) {
    w.fail(fmt::format("field '{}' must be a list of integers", key));
  }
  return out;
}

uint32_t parse_crc(const YAML::Node& n, const Where& w) {
  auto s = as<std::string>(n, "crc32", w);
  try {
    size_t used = 0;
    bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    unsigned long long v = std::stoull(hex ? s.substr(2) : s, &used, hex ? 16 : 10);
    if (used != s.size() - (hex ? 2 : 0) || v > 0xffffffffull) throw std::out_of_range("crc");
    return static_cast<uint32_t>(v);
  } catch (const std::exception&) {
    w.fail(fmt::format("field 'crc32' = '{}' is not a 32-bit checksum", s));
  }
}

std::vector<TensorEntry> parse_tensors(const std::string& path, const YAML::Node& root) {
  Where top{path, ""};
  YAML::Node list = field(root, "tensors", top);
  if (!list.IsSequence()) top.fail("field 'tensors' must be a list");
  std::vector<TensorEntry> out;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    Where w{path, fmt::format("tensors[{}]", i)};
    const YAML::Node& n = list[i];
    TensorEntry t;
    t.name = as<std::string>(n, "name", w);
    w.ctx = fmt::format("tensor {}", t.name);
    if (!seen.emplace(t.name, i).second) w.fail("listed twice");
    auto dtype = as<std::string>(n, "dtype", w);
    try {
      t.dtype = parse_dtype(dtype);
    } catch (const std::exception& e) {
      w.fail(e.what());
    }
    t.shape = as_ints(n, "shape", w);
    YAML::Node slices = field(n, "slices", w);
    if (!slices.IsSequence()) w.fail("field 'slices' must be a list");
    for (size_t k = 0; k < slices.size(); ++k) {
      Where ws{path, fmt::format("tensor {} slices[{}]", t.name, k)};
      const YAML::Node& sn = slices[k];
      SliceEntry s;
      s.file = as<std::string>(sn, "file", ws);
      s.offset = as<int64_t>(sn, "offset", ws);
      s.bytes = as<int64_t>(sn, "bytes", ws);
      s.start = as_ints(sn, "start", ws);
      s.extent = as_ints(sn, "extent", ws);
      s.crc = parse_crc(sn, ws);
      t.slices.push_back(std::move(s));
    }
    check_tensor_entry(path, t);
    out.push_back(std::move(t));
  }
  return out;
}

YAML::Node load_yaml(const std::string& path, const std::string& text) {
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) throw CheckpointError(fmt::format("{}: not a checkpoint index (expected a YAML map)", path));
    return root;
  } catch (const YAML::Exception& e) {
    throw CheckpointError(fmt::format("{}: invalid YAML: {}", path, e.what()));
  }
}

void check_format_version(const std::string& path, const YAML::Node& root) {
  Where w{path, ""};
  auto v = as<int64_t>(root, "format_version", w);
  if (v != kFormatVersion)
    w.fail(fmt::format("format_version {} is not supported (this build reads version {})", v, kFormatVersion));
}

}  // namespace

namespace {

// The last line of metadata.yaml: "metadata_crc32: 0x1234abcd\n", the CRC-32 of every byte before it. A YAML
// key like any other, so readers that ignore it still parse the file.
constexpr const char* kCrcKey = "metadata_crc32: ";

std::string seal(std::string text) {
  return text + fmt::format("{}0x{:08x}\n", kCrcKey, crc32(text.data(), text.size()));
}

// Checks and strips the checksum line. Checkpoints written before it existed have none: they load, with a
// warning, since their values can no longer be told from edits.
std::string unseal(const std::string& path, const std::string& text) {
  std::string body = text;
  while (!body.empty() && body.back() == '\n') body.pop_back();
  const size_t line = body.rfind('\n');
  const size_t at = line == std::string::npos ? 0 : line + 1;
  if (body.compare(at, std::strlen(kCrcKey), kCrcKey) != 0) {
    if (text.find(kCrcKey) != std::string::npos)
      throw CheckpointError(fmt::format("{}: the {} line is not the last line — the file was edited", path,
                                        std::string(kCrcKey, std::strlen(kCrcKey) - 2)));
    spdlog::warn("{}: has no metadata_crc32 line (written by an older megatrain): its values are not checksummed",
                 path);
    return text;
  }
  const std::string value = body.substr(at + std::strlen(kCrcKey));
  const std::string covered = text.substr(0, at);
  uint32_t want = 0;
  bool ok = value.size() == 10 && value.compare(0, 2, "0x") == 0;
  for (size_t i = 2; ok && i < value.size(); ++i) {
    const char c = value[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    ok = digit >= 0;
    want = want * 16 + static_cast<uint32_t>(digit);
  }
  if (!ok) throw CheckpointError(fmt::format("{}: metadata_crc32 '{}' is not a 32-bit hex checksum", path, value));
  const uint32_t got = crc32(covered.data(), covered.size());
  if (got != want)
    throw CheckpointError(
        fmt::format("{}: checksum mismatch (metadata_crc32 0x{:08x}, content 0x{:08x}) — the file was "
                    "edited or is corrupted; restore it or use another checkpoint",
                    path, want, got));
  return covered;
}

}  // namespace

std::string emit_metadata(const CheckpointState& state, const std::vector<TensorEntry>& tensors) {
  // A literal block keeps the config readable; fall back to a quoted string whenever the literal form
  // would not give the text back exactly (leading spaces, trailing blank lines, odd characters).
  std::string text = emit_metadata_with(state, tensors, YAML::Literal);
  try {
    if (YAML::Load(text)["config"].as<std::string>() == state.config_yaml) return seal(text);
  } catch (const YAML::Exception&) {
  }
  return seal(emit_metadata_with(state, tensors, YAML::DoubleQuoted));
}

std::string emit_index_fragment(int rank, const std::vector<TensorEntry>& tensors) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "format_version" << YAML::Value << kFormatVersion;
  e << YAML::Key << "rank" << YAML::Value << rank;
  emit_tensors(e, tensors);
  e << YAML::EndMap;
  if (!e.good()) throw CheckpointError("cannot emit checkpoint index: " + e.GetLastError());
  return std::string(e.c_str()) + "\n";
}

Metadata parse_metadata(const std::string& path, const std::string& sealed) {
  const std::string text = unseal(path, sealed);
  YAML::Node root = load_yaml(path, text);
  check_format_version(path, root);
  Where w{path, ""};
  Metadata m;
  m.state.iteration = as<int64_t>(root, "iteration", w);
  if (m.state.iteration < 0) w.fail("iteration is negative");
  YAML::Node values = field(field(root, "state", w), "values", Where{path, "state"});
  if (!values.IsMap()) w.fail("state.values must be a map");
  for (const auto& kv : values) {
    try {
      m.state.values[kv.first.as<std::string>()] = kv.second.as<std::string>();
    } catch (const YAML::Exception&) {
      w.fail("state.values must map names to scalar values");
    }
  }
  YAML::Node config = root["config"];
  if (!config.IsDefined()) w.fail("missing field 'config'");
  if (!config.IsNull()) {
    if (!config.IsScalar()) w.fail("field 'config' must be the config text");
    m.state.config_yaml = config.as<std::string>();
  }
  m.tensors = parse_tensors(path, root);
  return m;
}

std::vector<TensorEntry> parse_index_fragment(const std::string& path, const std::string& text) {
  YAML::Node root = load_yaml(path, text);
  check_format_version(path, root);
  return parse_tensors(path, root);
}

void merge_tensor_entries(std::vector<TensorEntry>& into, std::vector<TensorEntry> more, const std::string& where) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < into.size(); ++i) index[into[i].name] = i;
  for (auto& t : more) {
    auto it = index.find(t.name);
    if (it == index.end()) {
      index[t.name] = into.size();
      into.push_back(std::move(t));
      continue;
    }
    TensorEntry& have = into[it->second];
    if (have.dtype != t.dtype || have.shape != t.shape)
      throw CheckpointError(fmt::format("{}: tensor {} is {}{} here but {}{} elsewhere", where, t.name,
                                        dtype_name(t.dtype), shape_str(t.shape), dtype_name(have.dtype),
                                        shape_str(have.shape)));
    for (auto& s : t.slices) have.slices.push_back(std::move(s));
  }
}

void check_tensor_entry(const std::string& where, const TensorEntry& t) {
  auto fail = [&](const std::string& msg) {
    throw CheckpointError(fmt::format("{}: tensor {}: {}", where, t.name, msg));
  };
  if (t.name.empty()) fail("empty name");
  for (auto d : t.shape)
    if (d < 0) fail(fmt::format("negative dimension in shape {}", shape_str(t.shape)));
  // Sizes come from a file: every product and sum is overflow-checked, and no tensor may exceed
  // kMaxTensorBytes, so later arithmetic on them (offset + bytes, element offsets) cannot wrap.
  int64_t numel_total = 1, bytes_total = 0;
  bool too_big = false;
  for (auto d : t.shape)
    too_big = too_big || d > kMaxTensorBytes || __builtin_mul_overflow(numel_total, d, &numel_total);
  too_big = too_big || __builtin_mul_overflow(numel_total, static_cast<int64_t>(dtype_size(t.dtype)), &bytes_total) ||
            bytes_total > kMaxTensorBytes;
  if (too_big)
    fail(fmt::format("shape {} of {} needs more than {} bytes", shape_str(t.shape), dtype_name(t.dtype),
                     kMaxTensorBytes));
  const size_t nd = t.shape.size();
  for (const auto& s : t.slices) {
    std::string at = fmt::format("slice start [{}]", fmt::join(s.start, ", "));
    if (s.start.size() != nd || s.extent.size() != nd)
      fail(fmt::format("{} extent [{}] does not have the {} dimensions of shape {}", at, fmt::join(s.extent, ", "), nd,
                       shape_str(t.shape)));
    int64_t numel = 1;
    for (size_t d = 0; d < nd; ++d) {
      if (s.start[d] < 0 || s.extent[d] < 0 || s.start[d] > t.shape[d] || s.extent[d] > t.shape[d] - s.start[d])
        fail(fmt::format("{} extent [{}] lies outside the global shape {}", at, fmt::join(s.extent, ", "),
                         shape_str(t.shape)));
      numel *= s.extent[d];  // cannot overflow: extent <= shape, whose product was checked above
    }
    if (s.offset < 0 || s.offset > std::numeric_limits<int64_t>::max() - kMaxTensorBytes)
      fail(fmt::format("{}: offset {} is not a plausible file offset", at, s.offset));
    if (s.bytes != numel * static_cast<int64_t>(dtype_size(t.dtype)))
      fail(fmt::format("{}: {} bytes at offset {} do not hold {} {} values", at, s.bytes, s.offset, numel,
                       dtype_name(t.dtype)));
    if (s.file.empty() || s.file.find('/') != std::string::npos || s.file == "." || s.file == "..")
      fail(fmt::format("{}: bad data file name '{}'", at, s.file));
  }
  // Disjoint slices make coverage a sum of intersection volumes (see CheckpointReader::read).
  for (size_t a = 0; a < t.slices.size(); ++a) {
    for (size_t b = a + 1; b < t.slices.size(); ++b) {
      const auto &x = t.slices[a], &y = t.slices[b];
      bool overlap = true;
      for (size_t d = 0; d < nd && overlap; ++d)
        overlap = std::max(x.start[d], y.start[d]) < std::min(x.start[d] + x.extent[d], y.start[d] + y.extent[d]);
      bool empty = false;
      for (size_t d = 0; d < nd; ++d) empty = empty || x.extent[d] == 0 || y.extent[d] == 0;
      if (overlap && !empty)
        fail(fmt::format("slices starting at [{}] and [{}] overlap", fmt::join(x.start, ", "),
                         fmt::join(y.start, ", ")));
    }
  }
}

}  // namespace mt::ckpt
