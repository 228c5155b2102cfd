// tokenizer_spm.cpp: a SentencePiece model (.model, BPE or unigram) through Debian's libsentencepiece, the same
// C++ library the Python `sentencepiece` package wraps, so the ids are the package's encode(text, out_type=int).
// Built without the library (no pkg-config `sentencepiece` at configure time), the loader says so.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "core/data/tokenizer.h"
#include "core/data/utf8.h"

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

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, int32_t eod)
      : sp_(std::move(sp)), eod_(eod) {}
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
    c.ids.clear();
    const auto status = sp_->Encode(absl::string_view(text.data(), text.size()), &c.ids);
    if (!status.ok()) throw DataError(fmt::format("sentencepiece: cannot encode a document: {}", status.ToString()));
    out.insert(out.end(), c.ids.begin(), c.ids.end());
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
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t eod_;
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
  return std::make_unique<SentencePieceTokenizer>(std::move(sp), eod);
}

#else

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions&) {
  throw DataError(
      "--tokenizer sentencepiece: megatrain was built without SentencePiece (install libsentencepiece-dev "
      "and rebuild)");
}

#endif

}  // namespace mt
