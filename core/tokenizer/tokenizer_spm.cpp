// tokenizer_spm.cpp: a SentencePiece model (.model, BPE or unigram) through Debian's libsentencepiece, the same
// C++ library the Python `sentencepiece` package wraps, so the ids are the package's encode(text, out_type=int).
// Built without the library (no pkg-config `sentencepiece` at configure time), the loader says so.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tokenizer/spm_model_proto.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"

#ifdef MEGATRAIN_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mt {

bool have_sentencepiece() {
#ifdef MEGATRAIN_WITH_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

#ifdef MEGATRAIN_WITH_SENTENCEPIECE
namespace {

// Scratch for the UTF-8 repair, reused across documents by one worker.
struct SpmCache final : EncodeCache {
  std::string utf8_scratch;
  std::vector<int> ids;
};

// Whether a document may be encoded in pieces cut at a space, the ids staying those of the whole: empty when it
// may, else why not. The cut is one space between two printable ASCII characters, "x y": normalized, the text
// around it is "x▁y" and no piece of the model spans the cut (none holds a character other than ▁ followed by ▁:
// whitespace-only pieces such as Llama-2's "▁▁" need two ▁ in a row, which a single space is not), so the
// segmentation of the two sides is independent (unigram's best path, BPE's merges alike; but unigram sums float
// scores from the start of the text, so two paths that score alike within rounding can come out either way). The
// piece after the cut must then normalize to "▁y...": with add_dummy_prefix it starts at "y" (the dummy ▁ is the
// space), without it at " y", which only stays a ▁ when remove_extra_whitespaces does not strip it.
std::string why_not_cuttable(const SpmModelProto& m) {
  const std::string_view space = "\xE2\x96\x81";  // U+2581
  if (m.trainer.treat_whitespace_as_suffix) return "treat_whitespace_as_suffix";
  if (!m.normalizer.escape_whitespaces) return "escape_whitespaces is false";
  if (!m.normalizer.add_dummy_prefix && m.normalizer.remove_extra_whitespaces)
    return "remove_extra_whitespaces without add_dummy_prefix";
  // The library merges neighbouring unknown pieces into one: the space must be a known piece between them.
  if (std::none_of(m.pieces.begin(), m.pieces.end(),
                   [&](const SpmPiece& p) { return p.piece == space && p.type == SpmPieceType::normal; }))
    return "it has no piece '\u2581' of its own";
  for (const SpmPiece& p : m.pieces)
    for (size_t at = p.piece.find(space, 1); at != std::string::npos; at = p.piece.find(space, at + 1))
      if (at < space.size() || p.piece.compare(at - space.size(), space.size(), space) != 0)
        return fmt::format("its piece '{}' holds a character before a space", p.piece);
  return {};
}

bool printable(char c) { return c > ' ' && c < 0x7f; }

// The cut for the piece of `text` from `start`: the last "x y" space at most `chunk` bytes in, else the first one
// up to `limit` bytes in; npos when there is none.
size_t find_cut(std::string_view text, size_t start, size_t chunk, size_t limit) {
  auto cut_at = [&](size_t i) { return text[i] == ' ' && printable(text[i - 1]) && printable(text[i + 1]); };
  const size_t last = text.size() - 2;  // a cut needs a character after it; text is longer than start + chunk
  for (size_t i = std::min(start + chunk, last); i > start; --i)
    if (cut_at(i)) return i;
  const size_t end = limit >= last - start ? last : start + limit;
  for (size_t i = start + chunk + 1; i <= end; ++i)
    if (cut_at(i)) return i;
  return std::string_view::npos;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, int32_t eod,
                         const TokenizerOptions& o)
      : sp_(std::move(sp)), eod_(eod), model_(o.tokenizer_model), chunk_(static_cast<size_t>(o.spm_chunk_bytes)) {
    if (o.spm_chunk_bytes < 1)
      throw DataError(fmt::format("--spm-chunk-bytes must be at least 1, got {}", o.spm_chunk_bytes));
    limit_ = chunk_ > SIZE_MAX / kChunkLimitFactor ? SIZE_MAX : chunk_ * kChunkLimitFactor;
    try {
      const SpmModelProto m = read_spm_model(o.tokenizer_model);
      not_cuttable_ = why_not_cuttable(m);
      add_dummy_prefix_ = m.normalizer.add_dummy_prefix;
    } catch (const DataError& e) {  // the library reads what our parser does not: encode documents whole
      not_cuttable_ = fmt::format("its fields could not be read: {}", e.what());
    }
  }
  TokenizerKind kind() const override { return TokenizerKind::sentencepiece; }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t eod() const override { return eod_; }
  TokenDType storage_dtype() const override { return token_dtype_for_vocab(vocab_size()); }
  std::unique_ptr<EncodeCache> make_cache() const override { return std::make_unique<SpmCache>(); }

  // SentencePieceProcessor::Encode is const and keeps no state, so workers share one processor. Python hands
  // the library the UTF-8 of a str; invalid bytes here become U+FFFD first, as errors="replace" decoding makes
  // them (utf8.h), the same rule as the other tokenizers. No BOS/EOS inside a document: the model's
  // --add_bos/--add_eos extra options are not applied by Encode.
  void encode_with(std::string_view raw, std::vector<int32_t>& out, EncodeCache* cache) const override {
    SpmCache local;
    SpmCache& c = cache ? static_cast<SpmCache&>(*cache) : local;
    const std::string_view text = valid_utf8(raw, c.utf8_scratch);
    // Pieces of a long document (spm_chunk_bytes bounds the memory the library takes), each cut at a space.
    size_t start = 0;
    while (text.size() - start > chunk_) {
      const size_t cut = not_cuttable_.empty() ? find_cut(text, start, chunk_, limit_) : std::string_view::npos;
      if (cut == std::string_view::npos) {
        if (text.size() - start <= limit_) break;
        throw refused(text.size(), start);
      }
      encode_piece(text.substr(start, cut - start), out, c);
      start = add_dummy_prefix_ ? cut + 1 : cut;  // the dummy prefix stands for the space
    }
    encode_piece(text.substr(start), out, c);
  }

  // SentencePiece's own decoding (byte-fallback pieces joined into bytes, U+2581 back to spaces); the control
  // pieces (bos / eos) decode to nothing. Ids outside the model become U+FFFD.
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    std::vector<int> run;
    auto flush = [&] {
      std::string text;
      const auto status = sp_->Decode(run, &text);
      if (!status.ok()) throw DataError(fmt::format("sentencepiece: cannot decode: {}", status.ToString()));
      s += text;
      run.clear();
    };
    for (int32_t t : ids) {
      if (t == eod_) continue;
      if (t >= 0 && t < sp_->GetPieceSize()) {
        run.push_back(t);
      } else {
        flush();
        s += "\xEF\xBF\xBD";  // U+FFFD
      }
    }
    flush();
    return s;
  }

  uint32_t vocabulary_hash() const override {
    std::vector<std::string> pieces;
    for (int id = 0; id < sp_->GetPieceSize(); ++id) pieces.push_back(sp_->IdToPiece(id));
    return hash_vocabulary(pieces);
  }

 private:
  static constexpr size_t kChunkLimitFactor = 16;

  void encode_piece(std::string_view text, std::vector<int32_t>& out, SpmCache& c) const {
    c.ids.clear();
    const auto status = sp_->Encode(absl::string_view(text.data(), text.size()), &c.ids);
    if (!status.ok()) throw DataError(fmt::format("sentencepiece: cannot encode a document: {}", status.ToString()));
    out.insert(out.end(), c.ids.begin(), c.ids.end());
  }

  DataError refused(size_t bytes, size_t start) const {
    const std::string why =
        not_cuttable_.empty()
            ? fmt::format(
                  "it has no space between two printable ASCII characters to cut it at within {} bytes "
                  "from byte {}",
                  limit_, start)
            : fmt::format("the model {} cannot be encoded in pieces ({})", model_, not_cuttable_);
    return DataError(
        fmt::format("sentencepiece: a document of {} bytes is refused: {}, and encoding more than {} "
                    "bytes at once takes about 200 times as much memory (split the document, or raise "
                    "the limit, 16 x --spm-chunk-bytes={})",
                    bytes, why, limit_, chunk_));
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t eod_;
  std::string model_;         // the .model file
  std::string not_cuttable_;  // why a document may not be cut (why_not_cuttable); empty: it may
  bool add_dummy_prefix_ = true;
  size_t chunk_;      // TokenizerOptions::spm_chunk_bytes
  size_t limit_ = 0;  // the longest piece encoded at once, kChunkLimitFactor * chunk_
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions& o) {
  if (o.tokenizer_model.empty()) throw DataError("the sentencepiece tokenizer needs --tokenizer-model (a .model file)");
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(o.tokenizer_model);
  if (!status.ok())
    throw DataError(fmt::format("{}: cannot load the SentencePiece model: {}", o.tokenizer_model, status.ToString()));
  int32_t eod = -1;
  if (!o.eod_token.empty()) {
    const int id = sp->PieceToId(o.eod_token);
    // PieceToId answers unk_id for a piece it does not know; only "<unk>" itself may name it.
    if (id < 0 || (id == sp->unk_id() && sp->IdToPiece(id) != o.eod_token))
      throw DataError(fmt::format("{}: --eod-token '{}' is not a piece of the model", o.tokenizer_model, o.eod_token));
    eod = id;
  } else {
    eod = sp->eos_id();
    if (eod < 0)
      throw DataError(
          fmt::format("{}: the model has no end-of-sentence piece (eos_id is -1); name the "
                      "end-of-document piece with --eod-token",
                      o.tokenizer_model));
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(sp), eod, o);
}

#else

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions&) {
  throw DataError(
      "--tokenizer sentencepiece: megatrain was built without SentencePiece (install libsentencepiece-dev "
      "and rebuild)");
}

#endif

}  // namespace mt
