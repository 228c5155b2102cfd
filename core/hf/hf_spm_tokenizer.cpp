// hf_spm_tokenizer.cpp: SentencePiece ModelProto -> tokenizer.json (see hf_spm_tokenizer.h for the mapping).
#include "core/hf/hf_spm_tokenizer.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "core/checkpoint/checkpoint.h"

namespace mt {
namespace {

using json = nlohmann::ordered_json;

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Python's len() of a UTF-8 string: the code points, as transformers' merge ranking counts them.
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

json replace_string(const std::string& from, const std::string& to) {
  return {{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}
json replace_regex(const std::string& from, const std::string& to) {
  return {{"type", "Replace"}, {"pattern", {{"Regex", from}}}, {"content", to}};
}

json normalizer(const SpmNormalizerSpec& n) {
  json steps = json::array();
  if (!n.precompiled_charsmap.empty())
    steps.push_back({{"type", "Precompiled"}, {"precompiled_charsmap", base64(n.precompiled_charsmap)}});
  if (n.remove_extra_whitespaces) {
    // \A and \z, not ^ and $: the regex engine (Oniguruma) anchors ^ and $ at every line.
    steps.push_back(replace_regex("\\A +", ""));
    steps.push_back(replace_regex(" +\\z", ""));
    steps.push_back(replace_regex(" {2,}", " "));
  }
  if (n.add_dummy_prefix) steps.push_back({{"type", "Prepend"}, {"prepend", n.escape_whitespaces ? kSpace : " "}});
  if (n.escape_whitespaces) steps.push_back(replace_string(" ", kSpace));
  return {{"type", "Sequence"}, {"normalizers", std::move(steps)}};
}

bool never_matched(SpmPieceType t) {
  return t == SpmPieceType::unknown || t == SpmPieceType::control || t == SpmPieceType::byte ||
         t == SpmPieceType::unused;
}

// SentencePiece's unigram lattice holds only normal and user-defined pieces; tokenizers' trie holds every
// piece. A never-matched piece P of c characters gets the score (L+1)*(min(m,0)-1)-10 (m the lowest normal
// score, L >= c): below c*m, the score of spelling P's characters as single-character pieces, so a path
// through P is never best when those exist. The lowest score also sets tokenizers' unk penalty
// (min score - 10 where SentencePiece takes the lowest normal score), which changes no best path: an
// uncovered character has no piece but <unk> in either library.
json unigram_model(const SpmModelProto& m) {
  float lowest_normal = 0.f;
  size_t longest_hidden = 0;
  for (const SpmPiece& p : m.pieces) {
    if (p.type == SpmPieceType::normal) lowest_normal = std::min(lowest_normal, p.score);
    if (never_matched(p.type)) longest_hidden = std::max(longest_hidden, code_points(p.piece));
  }
  const double hidden_score =
      static_cast<double>(longest_hidden + 1) * (static_cast<double>(lowest_normal) - 1.0) - 10.0;
  json vocab = json::array();
  for (const SpmPiece& p : m.pieces)
    vocab.push_back(json::array({p.piece, never_matched(p.type) ? hidden_score : static_cast<double>(p.score)}));
  return {{"type", "Unigram"},
          {"unk_id", m.trainer.unk_id},
          {"vocab", std::move(vocab)},
          {"byte_fallback", m.trainer.byte_fallback}};
}

// Merges as transformers' generate_merges makes them from the scores: for each piece (in id order) every split
// into two pieces (ordered by their ids), then all ranked by (merged score, left length, right length),
// highest first, stable. SentencePiece merges the adjacent pair whose union scores highest, so the rank order
// is its order; only normal and user-defined pieces take part (SentencePiece never merges into the others).
json bpe_model(const SpmModelProto& m, const std::string& name) {
  json vocab = json::object();
  std::unordered_map<std::string, int32_t> mergeable;  // piece -> id
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const SpmPiece& p = m.pieces[id];
    if (vocab.contains(p.piece))
      throw CheckpointError(fmt::format("{}: piece '{}' appears twice (ids {} and {})", name, p.piece,
                                        vocab[p.piece].get<int64_t>(), id));
    vocab[p.piece] = static_cast<int64_t>(id);
    if (p.type == SpmPieceType::normal || p.type == SpmPieceType::user_defined)
      mergeable.emplace(p.piece, static_cast<int32_t>(id));
  }
  struct Merge {
    std::string left, right;
    float score;
    size_t left_len, right_len;
  };
  std::vector<Merge> merges;
  for (const SpmPiece& p : m.pieces) {
    if (!mergeable.count(p.piece)) continue;
    std::vector<std::pair<std::pair<int32_t, int32_t>, size_t>> splits;  // ((left id, right id), byte cut)
    for (size_t cut = 1; cut < p.piece.size(); ++cut) {
      if ((static_cast<unsigned char>(p.piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      auto l = mergeable.find(p.piece.substr(0, cut)), r = mergeable.find(p.piece.substr(cut));
      if (l != mergeable.end() && r != mergeable.end()) splits.push_back({{l->second, r->second}, cut});
    }
    std::sort(splits.begin(), splits.end());
    for (const auto& [ids, cut] : splits) {
      std::string l = p.piece.substr(0, cut), r = p.piece.substr(cut);
      merges.push_back({l, r, p.score, code_points(l), code_points(r)});
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_len != b.left_len) return a.left_len > b.left_len;
    return a.right_len > b.right_len;
  });
  json merge_list = json::array();
  for (const Merge& mg : merges) merge_list.push_back(json::array({mg.left, mg.right}));
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", m.pieces[m.trainer.unk_id].piece},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", true},
          {"byte_fallback", m.trainer.byte_fallback},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merge_list)}};
}

json decoder(const SpmModelProto& m) {
  json steps = json::array();
  // Per piece, before Fuse, so that only the <unk> piece itself (not "<unk>" spelled by text) is replaced.
  steps.push_back(replace_string(m.pieces[m.trainer.unk_id].piece, m.trainer.unk_surface));
  if (m.trainer.byte_fallback) steps.push_back({{"type", "ByteFallback"}});
  // SentencePiece drops the U+2581 that starts the first piece when it adds a dummy prefix or strips spaces;
  // Metaspace with a prepend scheme does that for the first piece and turns the others' U+2581 into ' '.
  if (m.normalizer.add_dummy_prefix || m.normalizer.remove_extra_whitespaces)
    steps.push_back({{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "always"}, {"split", false}});
  else
    steps.push_back(replace_string(kSpace, " "));
  steps.push_back({{"type", "Fuse"}});
  return {{"type", "Sequence"}, {"decoders", std::move(steps)}};
}

json added_tokens(const SpmModelProto& m) {
  json out = json::array();
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const SpmPiece& p = m.pieces[id];
    const bool special = p.type == SpmPieceType::control || p.type == SpmPieceType::unknown;
    if (!special && p.type != SpmPieceType::user_defined) continue;
    out.push_back({{"id", id},
                   {"content", p.piece},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", special}});
  }
  return out;
}

}  // namespace

json spm_tokenizer_json(const SpmModelProto& m, const std::string& name) {
  if (m.trainer.treat_whitespace_as_suffix)
    throw CheckpointError(fmt::format(
        "{}: treat_whitespace_as_suffix has no Hugging Face tokenizers counterpart; cannot export it", name));
  json model;
  if (m.trainer.model_type == SpmModelType::unigram)
    model = unigram_model(m);
  else if (m.trainer.model_type == SpmModelType::bpe)
    model = bpe_model(m, name);
  else
    throw CheckpointError(
        fmt::format("{}: model_type {} (WORD or CHAR) has no Hugging Face tokenizer export; "
                    "only UNIGRAM and BPE do",
                    name, static_cast<int>(m.trainer.model_type)));
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_tokens(m)},
          {"normalizer", normalizer(m.normalizer)},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", decoder(m)},
          {"model", std::move(model)}};
}

}  // namespace mt
