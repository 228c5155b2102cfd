// prepare.cpp: tokenizes plain-text and JSON-lines files into one Megatron indexed dataset.
#include "core/data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/data/json_line.h"
#include "core/data/tokenizer.h"

namespace mt {

namespace {

namespace fs = std::filesystem;

bool is_json_lines(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jsonl" || ext == ".json";
}

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos; }

// Drops a trailing CR (CRLF files) and, on the first line, a UTF-8 byte-order mark.
void normalize_line(std::string& line, int64_t lineno) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
}

std::ifstream open_input(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw DataError(fmt::format("{}: input file not found", path));
  if (!fs::is_regular_file(st)) throw DataError(fmt::format("{}: input is not a regular file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read input: {}", path, std::strerror(errno)));
  return in;
}

// Tokenizes documents and hands them to the writer, keeping the counts.
class DocumentSink {
 public:
  DocumentSink(IndexedDatasetWriter& writer, const Tokenizer& tokenizer, bool append_eod, PrepareStats& stats)
      : writer_(writer), tokenizer_(tokenizer), append_eod_(append_eod), stats_(stats) {}

  void add(std::string_view text) {
    tokens_.clear();
    tokenizer_.encode(text, tokens_);
    if (append_eod_) tokens_.push_back(tokenizer_.eod());
    if (tokens_.empty()) {
      ++stats_.empty_skipped;
      return;
    }
    writer_.add_document(std::span<const int32_t>(tokens_));
    ++stats_.documents;
    stats_.tokens += static_cast<int64_t>(tokens_.size());
  }

 private:
  IndexedDatasetWriter& writer_;
  const Tokenizer& tokenizer_;
  bool append_eod_;
  PrepareStats& stats_;
  std::vector<int32_t> tokens_;
};

void read_text(const std::string& path, DocumentSink& sink) {
  std::ifstream in = open_input(path);
  std::string line, doc;
  bool in_doc = false;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    normalize_line(line, lineno);
    if (is_blank(line)) {
      if (in_doc) sink.add(doc);
      doc.clear();
      in_doc = false;
      continue;
    }
    if (in_doc) doc += '\n';
    doc += line;
    in_doc = true;
  }
  if (in.bad()) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
  if (in_doc) sink.add(doc);
}

void read_json_lines(const std::string& path, const std::string& key, DocumentSink& sink) {
  std::ifstream in = open_input(path);
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    normalize_line(line, lineno);
    if (is_blank(line)) continue;
    std::optional<std::string> text;
    try {
      text = json_string_field(line, key);
    } catch (const JsonError& e) {
      throw DataError(fmt::format("{}:{}: invalid JSON line: {}", path, lineno, e.what()));
    }
    if (!text) throw DataError(fmt::format("{}:{}: the JSON object has no \"{}\" member", path, lineno, key));
    sink.add(*text);
  }
  if (in.bad()) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
}

}  // namespace

PrepareStats prepare_dataset(const PrepareOptions& options) {
  if (options.inputs.empty()) throw DataError("data prepare: no input files given");
  if (options.output_prefix.empty()) throw DataError("data prepare: no output prefix given");
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  for (const std::string& path : options.inputs) open_input(path);  // fail before writing anything

  const fs::path parent = fs::path(options.output_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw DataError(fmt::format("{}: cannot create output directory: {}", parent.string(), ec.message()));
  }

  PrepareStats stats;
  stats.vocab_size = tokenizer->vocab_size();
  stats.dtype = tokenizer->storage_dtype();
  IndexedDatasetWriter writer(options.output_prefix, stats.dtype);  // removes its temporaries if we throw
  DocumentSink sink(writer, *tokenizer, options.append_eod, stats);
  for (const std::string& path : options.inputs) {
    if (is_json_lines(path))
      read_json_lines(path, options.json_key, sink);
    else
      read_text(path, sink);
    ++stats.files;
  }
  if (stats.documents == 0)
    throw DataError(
        fmt::format("data prepare: the inputs hold no documents; {} was not written", options.output_prefix));
  writer.finish();
  return stats;
}

}  // namespace mt
