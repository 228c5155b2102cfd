// hf_tokenizer_export.cpp: tokenizer.yaml -> tokenizer.json and friends (see hf_tokenizer_export.h).
#include "core/hf/hf_tokenizer_export.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/hf/hf_spm_tokenizer.h"
#include "core/data/indexed_dataset.h"  // DataError
#include "core/tokenizer/post_processor.h"
#include "core/tokenizer/spm_model_proto.h"

namespace mt {
namespace {

using json = nlohmann::ordered_json;

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError(
        fmt::format("{}: cannot read the tokenizer's {} (named by the tokenizer sidecar)", path, what));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json parse_json(const std::string& path, const char* what) {
  try {
    return json::parse(read_file(path, what));
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: the tokenizer's {} is not valid JSON: {}", path, what, e.what()));
  }
}

// Written whole under a temporary name and renamed, as config.json is.
void write_out(const std::string& out_dir, const std::string& name, const std::string& text) {
  io::write_file_atomically(io::join_path(out_dir, name), text);
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others map to U+0100 onwards in order.
std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c)
      if (!printable(c)) ++cp;
  }
  std::string s;  // UTF-8 of cp (< 0x800)
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json special_token(int32_t id, const std::string& text) {
  return {{"id", id},        {"content", text},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// A byte-level BPE tokenizer.json: GPT-2's layout (no normalizer, ByteLevel pre-tokenizer and decoder).
json byte_level_bpe(json vocab, json merges, bool use_regex, int32_t eod, const std::string& eod_text) {
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  json decoder = byte_level(true);
  return {{"version", "1.0"},          {"truncation", nullptr},
          {"padding", nullptr},        {"added_tokens", json::array({special_token(eod, eod_text)})},
          {"normalizer", nullptr},     {"pre_tokenizer", byte_level(use_regex)},
          {"post_processor", nullptr}, {"decoder", decoder},
          {"model", std::move(model)}};
}

json byte_tokenizer_json(int32_t eod, const std::string& eod_text) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;  // megatrain's byte tokenizer: id i is byte i
  return byte_level_bpe(std::move(vocab), json::array(), /*use_regex=*/false, eod, eod_text);
}

json gpt2_tokenizer_json(const TokenizerOptions& o, int32_t eod, const std::string& eod_text) {
  json vocab = parse_json(o.vocab_file, "vocab.json");
  std::istringstream lines(read_file(o.merge_file, "merges.txt"));
  json merges = json::array();
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  return byte_level_bpe(std::move(vocab), std::move(merges), /*use_regex=*/true, eod, eod_text);
}

// The text of the eod id in an hf tokenizer.json: an added token, else a vocabulary entry.
std::optional<std::string> hf_token_text(const json& tok, int32_t id) {
  if (tok.contains("added_tokens"))
    for (const auto& t : tok["added_tokens"])
      if (t.value("id", -1) == id) return t.value("content", std::string());
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object())
    for (const auto& [text, v] : tok["model"]["vocab"].items())
      if (v.is_number_integer() && v.get<int64_t>() == id) return text;
  return std::nullopt;
}

std::string dump(const json& j) { return j.dump(2) + "\n"; }

SpmModelProto read_spm_model(const std::string& path, std::string& bytes) {
  bytes = read_file(path, "SentencePiece model");
  try {
    return parse_spm_model(bytes, path);
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
}

// The special tokens tokenizer.json's post-processor puts around each text (none when it has no post-processor).
SpecialTemplate post_processor_of(const json& tok, const std::string& path) {
  try {
    return load_post_processor(tok.value("post_processor", json()), path);
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
}

// hf: the data begins each document with the post-processor's leading special token (Llama-3's
// <|begin_of_text|>) when `data prepare` added them: that is the bos. Otherwise the eod token serves.
HfSpecialIds hf_ids(const SpecialTemplate& t, const TokenizerSidecar& sidecar) {
  const int32_t eod = sidecar.eod;
  const bool leading = sidecar.tokenizer.add_special_tokens && !t.before.empty();
  return {leading ? t.before.front() : eod, eod};
}

// SentencePiece: the model's bos (parse_spm_model has checked it names a piece), or the eod id without one.
HfSpecialIds spm_ids(const SpmModelProto& m, int32_t eod) {
  return {m.trainer.bos_id >= 0 ? m.trainer.bos_id : eod, eod};
}

}  // namespace

HfSpecialIds hf_special_ids(const TokenizerSidecar& sidecar) {
  const TokenizerOptions& o = sidecar.tokenizer;
  if (o.kind == TokenizerKind::hf)
    return hf_ids(post_processor_of(parse_json(o.tokenizer_file, "tokenizer.json"), o.tokenizer_file), sidecar);
  if (o.kind != TokenizerKind::sentencepiece) return {sidecar.eod, sidecar.eod};
  std::string bytes;
  return spm_ids(read_spm_model(o.tokenizer_model, bytes), sidecar.eod);
}

std::vector<std::string> export_hf_tokenizer(const TokenizerSidecar& sidecar, const std::string& out_dir,
                                             int64_t model_max_length) {
  const TokenizerOptions& o = sidecar.tokenizer;
  const int32_t eod = sidecar.eod;
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& text) {
    write_out(out_dir, name, text);
    written.push_back(name);
  };
  std::string eod_text = o.eod_token.empty() ? "<|endoftext|>" : o.eod_token;
  // byte, gpt2: every special role is the eod token; hf: the bos is the post-processor's leading token when the
  // data has it; a SentencePiece model names its own (as hf_special_ids, from the files read here once).
  HfSpecialIds ids{eod, eod};
  std::string bos_text, unk_text, pad_text;
  bool split_special = false;
  switch (o.kind) {
    case TokenizerKind::byte:
      write("tokenizer.json", dump(byte_tokenizer_json(eod, eod_text)));
      break;
    case TokenizerKind::gpt2: {
      const json tok = gpt2_tokenizer_json(o, eod, eod_text);
      write("vocab.json", read_file(o.vocab_file, "vocab.json"));
      write("merges.txt", read_file(o.merge_file, "merges.txt"));
      write("tokenizer.json", dump(tok));
      break;
    }
    case TokenizerKind::hf: {
      json tok = parse_json(o.tokenizer_file, "tokenizer.json");
      auto text_of = [&](int32_t id) {
        std::optional<std::string> t = hf_token_text(tok, id);
        if (!t) throw CheckpointError(fmt::format("{}: has no token with the id {}", o.tokenizer_file, id));
        return *t;
      };
      if (o.eod_token.empty()) eod_text = text_of(eod);
      const SpecialTemplate t = post_processor_of(tok, o.tokenizer_file);
      ids = hf_ids(t, sidecar);
      if (ids.bos != eod) {
        bos_text = text_of(ids.bos);
        unk_text = pad_text = eod_text;
      }
      if (!o.add_special_tokens && !(t.before.empty() && t.after.empty())) {
        // `data prepare --no-special-tokens`: the data has no post-processor tokens, so neither may the ids
        // AutoTokenizer gives from the export.
        tok["post_processor"] = nullptr;
        write("tokenizer.json", dump(tok));
      } else {
        write("tokenizer.json", read_file(o.tokenizer_file, "tokenizer.json"));
      }
      break;
    }
    case TokenizerKind::sentencepiece: {
      std::string bytes;
      const SpmModelProto m = read_spm_model(o.tokenizer_model, bytes);
      if (eod < 0 || eod >= static_cast<int32_t>(m.pieces.size()))
        throw CheckpointError(fmt::format("{}: the eod id {} is not a piece of the model ({} pieces)",
                                          o.tokenizer_model, eod, m.pieces.size()));
      eod_text = m.pieces[eod].piece;
      ids = spm_ids(m, eod);
      const SpmTrainerSpec& t = m.trainer;
      bos_text = m.pieces[ids.bos].piece;
      unk_text = m.pieces[t.unk_id].piece;
      pad_text = t.pad_id >= 0 ? m.pieces[t.pad_id].piece : eod_text;
      split_special = true;  // "<s>" in a text is text to SentencePiece
      write("tokenizer.json", dump(spm_tokenizer_json(m, o.tokenizer_model)));
      write("tokenizer.model", bytes);  // for tools that read the SentencePiece model itself
      break;
    }
  }
  if (bos_text.empty()) bos_text = unk_text = pad_text = eod_text;
  json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", bos_text},
              {"eos_token", eod_text},
              {"unk_token", unk_text},
              {"pad_token", pad_text},
              {"model_max_length", model_max_length},
              {"clean_up_tokenization_spaces", false}};
  if (split_special) cfg["split_special_tokens"] = true;
  write("tokenizer_config.json", dump(cfg));
  json map = {{"bos_token", bos_text}, {"eos_token", eod_text}, {"unk_token", unk_text}, {"pad_token", pad_text}};
  write("special_tokens_map.json", dump(map));
  write("generation_config.json", dump(json{{"bos_token_id", ids.bos}, {"eos_token_id", ids.eos}}));
  return written;
}

}  // namespace mt
