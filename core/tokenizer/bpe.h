// bpe.h: byte-level byte-pair encoding of one pre-tokenized word, as GPT-2 and Hugging Face's BPE model do it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt {

// Lets maps keyed by std::string be searched with a string_view, without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// GPT-2's bytes_to_unicode: the printable character each byte is written as in vocab.json / merges.txt.
// Returns nullopt for a string with a character no byte maps to (such a token is reachable only as an
// added token).
std::optional<std::string> byte_level_decode(std::string_view token_text);

class BpeModel {
 public:
  // Registers a vocabulary entry given by its raw bytes (byte_level_decode of the vocab.json key).
  void add_token(std::string bytes, int32_t id);
  // Adds the merge of the tokens spelled `left` + `right` (raw bytes) with the next rank. Returns false when
  // left, right or left+right is not in the vocabulary.
  bool add_merge(const std::string& left, const std::string& right);
  void set_unk(std::optional<int32_t> id) { unk_ = id; }
  // SentencePiece-style BPE (Llama-2, Mistral): the first symbols are the word's UTF-8 characters, looked up as
  // vocabulary entries, not its bytes. A character that is none becomes its bytes as the <0xAB> tokens when
  // byte_fallback and all of them exist, else the unknown token (runs of them one token with fuse_unk). Call
  // after the vocabulary is complete.
  void set_char_symbols(bool byte_fallback, bool fuse_unk);
  void set_ignore_merges(bool on) { ignore_merges_ = on; }

  std::optional<int32_t> find(std::string_view bytes) const;
  // The merges in rank order, three ids each: left, right, and the merged token.
  std::vector<int32_t> merge_ids() const;
  // Appends the ids of one word (raw bytes; valid UTF-8 with char symbols). Symbols without a token become the
  // unknown id when there is one and are dropped otherwise, as Hugging Face's BPE does.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;  // raw bytes -> id
  int32_t byte_id_[256];                                                         // -1: the byte alone is not a token
  bool byte_id_init_ = false;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank and result
  bool char_symbols_ = false, fuse_unk_ = false;
  int32_t fallback_id_[256];  // char symbols with byte_fallback: the id of <0xAB> (-1: none, or no fallback)
  std::optional<int32_t> unk_;
  bool ignore_merges_ = false;
};

}  // namespace mt
