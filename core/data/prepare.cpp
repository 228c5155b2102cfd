// prepare.cpp: tokenizes plain-text and JSON-lines files into one Megatron indexed dataset.
#include "core/data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "core/data/json_line.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "core/io/file_io.h"

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

// Where a document starts: its file and line (a paragraph's first line).
struct DocumentPlace {
  const std::string* path;
  int64_t line;
};

// Tokenizes documents and hands them to the writer in input order, keeping the counts. A tokenizer's DataError
// (a document the tokenizer refuses) is rethrown naming the document's file and line. With several
// workers, documents are gathered into batches; each batch is tokenized by the workers in parallel (each
// with its own cache, which survives across batches) and written in order.
class DocumentSink {
 public:
  DocumentSink(IndexedDatasetWriter& writer, const Tokenizer& tokenizer, bool append_eod, int workers,
               PrepareStats& stats)
      : writer_(writer), tokenizer_(tokenizer), append_eod_(append_eod), stats_(stats) {
    caches_.resize(static_cast<size_t>(std::max(1, workers)));
    for (auto& c : caches_) c = tokenizer_.make_cache();
  }

  void add(std::string_view text, DocumentPlace place) {
    if (caches_.size() == 1) {
      tokens_.clear();
      tokenize(text, place, tokens_, caches_[0].get());
      write(tokens_);
      return;
    }
    batch_.emplace_back(text);
    places_.push_back(place);
    batch_bytes_ += text.size();
    if (batch_bytes_ >= kBatchBytes || batch_.size() >= kBatchDocs) flush();
  }

  void read(size_t bytes) { stats_.bytes_read += static_cast<int64_t>(bytes); }
  std::function<void(const PrepareStats&)> on_progress;  // after each document written

  void flush() {
    if (batch_.empty()) return;
    results_.resize(batch_.size());
    std::atomic<size_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto work = [&](size_t w) {
      try {
        for (size_t d; (d = next.fetch_add(1)) < batch_.size();) {
          results_[d].clear();
          tokenize(batch_[d], places_[d], results_[d], caches_[w].get());
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = batch_.size();
      }
    };
    {
      std::vector<std::jthread> threads;
      for (size_t w = 1; w < caches_.size(); ++w) threads.emplace_back(work, w);
      work(0);
    }
    if (error) std::rethrow_exception(error);
    for (size_t d = 0; d < batch_.size(); ++d) write(results_[d]);
    batch_.clear();
    places_.clear();
    batch_bytes_ = 0;
  }

 private:
  static constexpr size_t kBatchBytes = size_t{16} << 20;
  static constexpr size_t kBatchDocs = 1024;

  void tokenize(std::string_view text, DocumentPlace place, std::vector<int32_t>& out, EncodeCache* cache) const {
    try {
      tokenizer_.encode_with(text, out, cache);
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}:{}: {}", *place.path, place.line, e.what()));
    }
    if (append_eod_) out.push_back(tokenizer_.eod());
  }

  void write(const std::vector<int32_t>& tokens) {
    if (tokens.empty()) {
      ++stats_.empty_skipped;
      return;
    }
    writer_.add_document(std::span<const int32_t>(tokens));
    ++stats_.documents;
    stats_.tokens += static_cast<int64_t>(tokens.size());
    if (on_progress) on_progress(stats_);
  }

  IndexedDatasetWriter& writer_;
  const Tokenizer& tokenizer_;
  bool append_eod_;
  PrepareStats& stats_;
  std::vector<std::unique_ptr<EncodeCache>> caches_;  // one per worker
  std::vector<int32_t> tokens_;
  std::vector<std::string> batch_;
  std::vector<DocumentPlace> places_;  // of batch_
  size_t batch_bytes_ = 0;
  std::vector<std::vector<int32_t>> results_;
};

void read_text(const std::string& path, DocumentSink& sink) {
  std::ifstream in = open_input(path);
  std::string line, doc;
  bool in_doc = false;
  DocumentPlace place{&path, 0};
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    sink.read(line.size() + 1);
    normalize_line(line, lineno);
    if (is_blank(line)) {
      if (in_doc) sink.add(doc, place);
      doc.clear();
      in_doc = false;
      continue;
    }
    if (in_doc)
      doc += '\n';
    else
      place.line = lineno;
    doc += line;
    in_doc = true;
  }
  if (in.bad()) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
  if (in_doc) sink.add(doc, place);
}

// Calls read(bytes) for each line of a JSON-lines file and on_line(line, lineno) for each non-blank one (a trailing
// CR and a leading byte-order mark dropped).
template <class Read, class OnLine>
void for_each_json_line(const std::string& path, Read&& read, OnLine&& on_line) {
  std::ifstream in = open_input(path);
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    read(line.size() + 1);
    normalize_line(line, lineno);
    if (!is_blank(line)) on_line(line, lineno);
  }
  if (in.bad()) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
}

void read_json_lines(const std::string& path, const std::string& key, DocumentSink& sink) {
  for_each_json_line(
      path, [&](size_t bytes) { sink.read(bytes); },
      [&](const std::string& line, int64_t lineno) {
        std::optional<std::string> text;
        try {
          text = json_string_field(line, key);
        } catch (const JsonError& e) {
          throw DataError(fmt::format("{}:{}: invalid JSON line: {}", path, lineno, e.what()));
        }
        if (!text) throw DataError(fmt::format("{}:{}: the JSON object has no \"{}\" member", path, lineno, key));
        sink.add(*text, {&path, lineno});
      });
}

// The template --chat-template names, or for auto the one the tokenizer's directory holds (chat_template.jinja,
// chat_template.json or tokenizer_config.json, as transformers reads them).
ChatTemplate resolve_chat_template(const PrepareOptions& options) {
  if (options.chat_template != ChatTemplate::automatic) return options.chat_template;
  const TokenizerOptions& t = options.tokenizer;
  for (const std::string& file : {t.tokenizer_file, t.tokenizer_model, t.vocab_file}) {
    if (file.empty()) continue;
    return chat_template_from_dir(fs::path(file).parent_path().string());
  }
  throw DataError(fmt::format(
      "data prepare: --chat-template auto reads chat_template.jinja, chat_template.json or tokenizer_config.json "
      "beside the tokenizer's file, and the {} tokenizer has none; name the template with --chat-template "
      "chatml|llama3",
      name_of(t.kind)));
}

void read_chat_lines(const std::string& path, const ChatRenderer& renderer, IndexedDatasetWriter& tokens_out,
                     IndexedDatasetWriter& mask_out, PrepareStats& stats,
                     const std::function<void(const PrepareStats&)>& on_progress, EncodeCache* cache) {
  std::vector<int32_t> tokens, mask_ids;
  std::vector<uint8_t> mask;
  for_each_json_line(
      path, [&](size_t bytes) { stats.bytes_read += static_cast<int64_t>(bytes); },
      [&](const std::string& line, int64_t lineno) {
        tokens.clear();
        mask.clear();
        try {
          renderer.render(parse_chat_line(line), tokens, mask, cache);
        } catch (const DataError& e) {
          throw DataError(fmt::format("{}:{}: {}", path, lineno, e.what()));
        }
        mask_ids.assign(mask.begin(), mask.end());  // the writer takes int32 ids
        tokens_out.add_document(std::span<const int32_t>(tokens));
        mask_out.add_document(std::span<const int32_t>(mask_ids));
        ++stats.documents;
        stats.tokens += static_cast<int64_t>(tokens.size());
        stats.loss_tokens += std::count(mask.begin(), mask.end(), uint8_t{1});
        if (on_progress) on_progress(stats);
      });
}

// An output that exists is a dataset someone prepared (or one of the inputs): replacing it silently lost it
// (issue 30, item 3). The paths are compared as files (fs::equivalent), so a link or another spelling of an input
// is caught too.
void check_output_is_free(const PrepareOptions& options) {
  const std::string prefix = options.output_prefix;
  std::vector<std::string> outputs = {prefix + ".bin", prefix + ".idx", tokenizer_sidecar_path(prefix),
                                      dataset_checksums_path(prefix)};
  std::vector<std::string> datasets = {prefix + ".bin", prefix + ".idx"};
  if (options.format == DataFormat::chat) {
    const std::string mask = loss_mask_prefix(prefix);
    for (const std::string& out : {mask + ".bin", mask + ".idx"}) {
      outputs.push_back(out);
      datasets.push_back(out);
    }
    outputs.push_back(dataset_checksums_path(mask));
  }
  for (const std::string& out : outputs) {
    std::error_code ec;
    if (!fs::exists(out, ec)) continue;
    for (const std::string& in : options.inputs) {
      std::error_code eq;
      if (fs::equivalent(out, in, eq))
        throw DataError(
            fmt::format("data prepare: the output {} is the input {}; writing it would destroy the "
                        "input: choose another --output",
                        out, in));
    }
  }
  for (const std::string& out : datasets) {
    std::error_code ec;
    if (fs::exists(out, ec) && !options.overwrite)
      throw DataError(
          fmt::format("data prepare: {} already exists; pass --overwrite to replace it, or choose "
                      "another --output",
                      out));
  }
}

PrepareStats prepare_chat(const PrepareOptions& options, const TokenizerOptions& tokenizer_options,
                          const Tokenizer& tokenizer, const ChatRenderer& renderer, IndexedDatasetWriter& writer,
                          PrepareStats& stats) {
  IndexedDatasetWriter mask_writer(loss_mask_prefix(options.output_prefix), TokenDType::u8);
  stats.chat_template = renderer.chat_template();
  std::unique_ptr<EncodeCache> cache = tokenizer.make_cache();
  for (const std::string& path : options.inputs) {
    read_chat_lines(path, renderer, writer, mask_writer, stats, options.on_progress, cache.get());
    ++stats.files;
  }
  if (stats.documents == 0)
    throw DataError(
        fmt::format("data prepare: the inputs hold no conversations; {} was not written", options.output_prefix));
  // Everything written and synced aside before the first rename, so a failure leaves the old files as they were.
  io::AtomicFile sidecar(tokenizer_sidecar_path(options.output_prefix));
  sidecar.write(tokenizer_sidecar_yaml(tokenizer_options, tokenizer));
  sidecar.sync();
  mask_writer.stage();
  writer.stage();
  mask_writer.commit();
  writer.commit();
  sidecar.commit();
  return stats;
}

}  // namespace

PrepareStats prepare_dataset(const PrepareOptions& options) {
  if (options.inputs.empty()) throw DataError("data prepare: no input files given");
  if (options.output_prefix.empty()) throw DataError("data prepare: no output prefix given");
  if (options.workers < 1)
    throw DataError(fmt::format("data prepare: --workers must be at least 1, got {}", options.workers));
  check_output_is_free(options);
  const bool chat = options.format == DataFormat::chat;
  TokenizerOptions tokenizer_options = options.tokenizer;
  // apply_chat_template tokenizes with add_special_tokens=False: the template places the specials itself.
  if (chat) tokenizer_options.add_special_tokens = false;
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(tokenizer_options);
  std::optional<ChatRenderer> renderer;
  if (chat) {
    for (const std::string& path : options.inputs)
      if (!is_json_lines(path))
        throw DataError(
            fmt::format("{}: --format chat reads JSON lines (.jsonl / .json), one conversation a line", path));
    renderer.emplace(*tokenizer, resolve_chat_template(options));
  }
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
  if (chat) return prepare_chat(options, tokenizer_options, *tokenizer, *renderer, writer, stats);
  DocumentSink sink(writer, *tokenizer, options.append_eod, options.workers, stats);
  sink.on_progress = options.on_progress;
  for (const std::string& path : options.inputs) {
    if (is_json_lines(path))
      read_json_lines(path, options.json_key, sink);
    else
      read_text(path, sink);
    ++stats.files;
  }
  sink.flush();
  if (stats.documents == 0)
    throw DataError(
        fmt::format("data prepare: the inputs hold no documents; {} was not written", options.output_prefix));
  // The sidecar goes in with the pair: written and synced aside first, renamed once the pair is in place (its
  // temporary is removed if the pair fails).
  io::AtomicFile sidecar(tokenizer_sidecar_path(options.output_prefix));
  sidecar.write(tokenizer_sidecar_yaml(options.tokenizer, *tokenizer));
  sidecar.sync();
  writer.finish();
  sidecar.commit();
  return stats;
}

}  // namespace mt
