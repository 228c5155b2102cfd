#include "core/hf/safetensors.h"

#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/io/mapped_file.h"

namespace mt {
namespace {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    default:
      throw CheckpointError(fmt::format("safetensors export: dtype {} is not supported", dtype_name(t)));
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

std::string safetensors_header(const std::vector<SafetensorsSpec>& specs,
                               const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) h += ",";
      first = false;
      h += json_string(k) + ":" + json_string(v);
    }
    h += "}";
  }
  int64_t offset = 0;
  std::set<std::string> names;
  for (const auto& s : specs) {
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second)
      throw CheckpointError(fmt::format("safetensors: bad or repeated tensor name '{}'", s.name));
    int64_t bytes = shape_numel(s.shape) * static_cast<int64_t>(dtype_size(s.dtype));
    if (!h.empty() && h.back() != '{') h += ",";
    h += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json_string(s.name),
                     safetensors_dtype(s.dtype), fmt::join(s.shape, ","), offset, offset + bytes);
    offset += bytes;
  }
  return h + "}";
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), specs_(std::move(specs)) {
  std::string header = safetensors_header(specs_, metadata);
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts at 8 + header size, 8-byte aligned
  file_ = std::make_unique<io::AtomicFile>(path_);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  file_->write(len, 8);
  file_->write(header);
}

SafetensorsWriter::~SafetensorsWriter() = default;  // an uncommitted AtomicFile removes its temporary

void SafetensorsWriter::write(const Tensor& t) {
  if (!file_ || next_ >= specs_.size()) throw CheckpointError(fmt::format("{}: more tensors than announced", path_));
  const SafetensorsSpec& s = specs_[next_];
  if (t.shape() != s.shape)
    throw CheckpointError(
        fmt::format("{}: tensor {} announced as {} but given {}", path_, s.name, shape_str(s.shape), t.describe()));
  if (t.dtype() == s.dtype) {
    file_->write(t.raw(), t.nbytes());
  } else {
    Tensor c = Tensor::empty(s.shape, s.dtype);
    c.copy_from(t);
    file_->write(c.raw(), c.nbytes());
  }
  ++next_;
}

void SafetensorsWriter::finish() {
  if (!file_) throw CheckpointError(fmt::format("{}: already finished", path_));
  if (next_ != specs_.size())
    throw CheckpointError(fmt::format("{}: {} of {} tensors written", path_, next_, specs_.size()));
  file_->commit();
  file_.reset();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, dtype, t.shape()});
  SafetensorsWriter w(path, std::move(specs), metadata);
  for (const auto& [name, t] : tensors) w.write(t);
  w.finish();
}

// ---- reading ---------------------------------------------------------------------------------------------

namespace {

std::optional<DType> parse_safetensors_dtype(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  return std::nullopt;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  try {
    file_ = std::make_unique<MappedFile>(MappedFile::open(path, {.require_regular_file = true}));
  } catch (const MapFileError& e) {
    throw CheckpointError(fmt::format("{}: cannot read safetensors file: {}", path, e.what()));
  }
  const uint8_t* p = file_->data();
  const size_t size = file_->size();
  auto bad = [&](const std::string& why) {
    return CheckpointError(fmt::format("{}: not a safetensors file: {}", path, why));
  };
  if (size < 8) throw bad(fmt::format("{} bytes, shorter than the 8-byte header length", size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  if (n > size - 8) throw bad(fmt::format("header length {} is past the end of the file ({} bytes)", n, size));
  const int64_t data_bytes = static_cast<int64_t>(size - 8 - n);
  data_ = p + 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(p + 8, p + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    throw bad(fmt::format("header is not JSON: {}", e.what()));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, s] : v.items())
        if (s.is_string()) metadata_[k] = s.get<std::string>();
      continue;
    }
    auto where = [&](const std::string& why) {
      return CheckpointError(fmt::format("{}: tensor {}: {}", path, name, why));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw where("needs dtype, shape and data_offsets");
    const auto& dt = v["dtype"];
    const std::string dts = dt.is_string() ? dt.get<std::string>() : dt.dump();
    const std::optional<DType> dtype = parse_safetensors_dtype(dts);
    if (!dtype) throw where(fmt::format("dtype {} is not supported (F32, BF16 and F16 are)", dts));
    Entry e{.dtype = *dtype};
    int64_t numel = 1;
    if (!v["shape"].is_array()) throw where("shape is not a list");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        throw where(fmt::format("bad shape {}", v["shape"].dump()));
      e.shape.push_back(d.get<int64_t>());
      numel *= e.shape.back();
      if (numel > (int64_t{1} << 48)) throw where(fmt::format("shape {} is too large", v["shape"].dump()));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw where("data_offsets is not [begin, end]");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > static_cast<uint64_t>(data_bytes))
      throw where(fmt::format("data_offsets [{}, {}] outside the {} data bytes", b, en, data_bytes));
    e.begin = static_cast<int64_t>(b);
    e.end = static_cast<int64_t>(en);
    if (e.end - e.begin != numel * static_cast<int64_t>(dtype_size(e.dtype)))
      throw where(fmt::format("{} bytes do not hold shape {} of {}", e.end - e.begin, shape_str(e.shape), dts));
    entries_.emplace(name, std::move(e));
  }
}

SafetensorsReader::~SafetensorsReader() = default;

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw CheckpointError(fmt::format("{}: has no tensor {}", path_, name));
  return it->second;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const Entry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.raw(), data_ + e.begin, static_cast<size_t>(e.end - e.begin));
  return t;
}

}  // namespace mt
