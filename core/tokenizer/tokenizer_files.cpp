// tokenizer_files.cpp: builds the BPE tokenizer from GPT-2's vocab.json + merges.txt (Megatron's
// GPT2BPETokenizer) or from a Hugging Face tokenizer.json: byte-level (a ByteLevel pre-tokenizer: GPT-2, Llama-3)
// or SentencePiece-style (symbols are characters, byte_fallback: Llama-2, Mistral). Anything in tokenizer.json that would change the
// ids and is not implemented here is refused, naming the component, rather than silently ignored.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/tokenizer/tokenizer_bpe.h"

namespace mt {

using nlohmann::json;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read the tokenizer file", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json parse_json(const std::string& path, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

// Fills the model's vocabulary from a {token: id} object; returns the largest id. Byte-level entries are written
// with GPT-2's byte-to-character map; SentencePiece-style entries are the text itself.
int64_t load_vocab(const json& vocab, const std::string& where, BpeModel& model,
                   std::unordered_map<std::string, int32_t>& by_text, bool byte_level = true) {
  if (!vocab.is_object()) throw DataError(fmt::format("{}: the vocabulary is not a JSON object", where));
  // Without ordinary tokens only the added ones could ever be produced: a data set of special tokens.
  if (vocab.empty()) throw DataError(fmt::format("{}: the vocabulary is empty (a BPE needs its tokens)", where));
  int64_t max_id = -1;
  std::unordered_map<int32_t, std::string> by_id;
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw DataError(fmt::format("{}: token '{}' has no valid id", where, text));
    const auto i = id.get<int32_t>();
    if (const auto [at, fresh] = by_id.emplace(i, text); !fresh)
      throw DataError(fmt::format("{}: tokens '{}' and '{}' both have id {} (an id stands for one token)", where,
                                  at->second, text, i));
    by_text[text] = i;
    max_id = std::max<int64_t>(max_id, i);
    // Entries that are not byte-level text (added tokens listed in the vocab) are never produced by merges.
    if (!byte_level)
      model.add_token(text, i);
    else if (auto bytes = byte_level_decode(text))
      model.add_token(std::move(*bytes), i);
  }
  return max_id;
}

// id -> bytes for decoding: vocabulary entries as byte-level text decodes them (others, e.g. added tokens listed
// in the vocabulary, as their text), then the added tokens' content.
// SentencePiece-style: "▁" is a space and <0xAB> (with byte_fallback) the byte, as the usual decoder
// (Replace, ByteFallback, Fuse) makes them.
std::string sentencepiece_piece_bytes(const std::string& text, bool byte_fallback) {
  unsigned byte = 0;
  char tail = 0;
  if (byte_fallback && text.size() == 6 && std::sscanf(text.c_str(), "<0x%2X%c", &byte, &tail) == 2 && tail == '>')
    return std::string(1, static_cast<char>(byte));
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

void fill_id_bytes(ByteLevelBpeSpec& spec, const std::unordered_map<std::string, int32_t>& by_text,
                   bool byte_level = true, bool byte_fallback = false) {
  spec.id_bytes.assign(static_cast<size_t>(spec.vocab_size), std::string());
  for (const auto& [text, id] : by_text) {
    auto bytes = byte_level ? byte_level_decode(text) : sentencepiece_piece_bytes(text, byte_fallback);
    spec.id_bytes[static_cast<size_t>(id)] = bytes ? std::move(*bytes) : text;
  }
  for (const AddedToken& t : spec.added) spec.id_bytes[static_cast<size_t>(t.id)] = t.content;
}

void add_merge(BpeModel& model, const std::string& left, const std::string& right, const std::string& where,
               bool byte_level = true) {
  auto l = byte_level ? byte_level_decode(left) : left, r = byte_level ? byte_level_decode(right) : right;
  if (!l || !r || !model.add_merge(*l, *r))
    throw DataError(fmt::format("{}: merge '{} {}' uses a token that is not in the vocabulary", where, left, right));
}

std::unique_ptr<Tokenizer> load_gpt2(const TokenizerOptions& o) {
  if (o.vocab_file.empty() || o.merge_file.empty())
    throw DataError("the gpt2 tokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  ByteLevelBpeSpec spec;
  spec.kind = TokenizerKind::gpt2;
  std::unordered_map<std::string, int32_t> by_text;
  spec.vocab_size =
      load_vocab(parse_json(o.vocab_file, read_file(o.vocab_file)), o.vocab_file, spec.model, by_text) + 1;
  std::istringstream merges(read_file(o.merge_file));
  std::string line;
  for (int64_t lineno = 1; std::getline(merges, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw DataError(fmt::format("{}:{}: a merge is two tokens separated by one space", o.merge_file, lineno));
    add_merge(spec.model, line.substr(0, space), line.substr(space + 1), fmt::format("{}:{}", o.merge_file, lineno));
  }
  spec.pre_tokenizer.add_step(std::make_unique<RegexSplit>(kGpt2SplitPattern, false, "gpt2"));
  auto eod = by_text.find("<|endoftext|>");
  if (eod == by_text.end()) throw DataError(fmt::format("{}: no <|endoftext|> token in the vocabulary", o.vocab_file));
  spec.eod = eod->second;
  fill_id_bytes(spec, by_text);
  return std::make_unique<ByteLevelBpeTokenizer>(std::move(spec));
}

bool flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }
std::string type_of(const json& j) {
  return j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

// ByteLevel as a pre-tokenizer step: its regex split when use_regex (the default), its prefix space.
void add_byte_level(const json& j, const std::string& where, bool sole, ByteLevelBpeSpec& spec) {
  if (flag(j, "add_prefix_space")) {
    if (!sole)
      throw DataError(
          fmt::format("{}: pre_tokenizer ByteLevel with add_prefix_space inside a Sequence is not "
                      "supported",
                      where));
    spec.add_prefix_space = true;
  }
  if (!j.contains("use_regex") || flag(j, "use_regex"))
    spec.pre_tokenizer.add_step(std::make_unique<RegexSplit>(kGpt2SplitPattern, false, where + ": ByteLevel"));
}

void add_split(const json& j, const std::string& where, ByteLevelBpeSpec& spec) {
  const std::string behavior = j.value("behavior", "?");
  if (behavior != "Isolated" || flag(j, "invert"))
    throw DataError(fmt::format("{}: pre_tokenizer Split with behavior '{}'{} is not supported (only Isolated)", where,
                                behavior, flag(j, "invert") ? " and invert" : ""));
  const json& p = j.value("pattern", json());
  if (p.contains("Regex") && p["Regex"].is_string())
    spec.pre_tokenizer.add_step(std::make_unique<RegexSplit>(p["Regex"].get<std::string>(), false, where + ": Split"));
  else if (p.contains("String") && p["String"].is_string())
    spec.pre_tokenizer.add_step(std::make_unique<RegexSplit>(p["String"].get<std::string>(), true, where + ": Split"));
  else
    throw DataError(fmt::format("{}: pre_tokenizer Split has no Regex or String pattern", where));
}

void load_pre_tokenizer(const json& j, const std::string& where, ByteLevelBpeSpec& spec) {
  const std::string t = type_of(j);
  if (t == "ByteLevel") return add_byte_level(j, where, true, spec);
  if (t != "Sequence")
    throw DataError(
        fmt::format("{}: pre_tokenizer '{}' is not supported (ByteLevel, or a Sequence of Split "
                    "steps ending in ByteLevel)",
                    where, j.is_null() ? "null" : t));
  const json& steps = j.value("pretokenizers", json::array());
  if (steps.empty() || type_of(steps.back()) != "ByteLevel")
    throw DataError(fmt::format("{}: a pre_tokenizer Sequence must end with ByteLevel (byte-level BPE)", where));
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    if (type_of(steps[i]) != "Split")
      throw DataError(
          fmt::format("{}: pre_tokenizer '{}' inside a Sequence is not supported (only Split and "
                      "ByteLevel)",
                      where, type_of(steps[i])));
    add_split(steps[i], where, spec);
  }
  add_byte_level(steps.back(), where, false, spec);
}

bool mentions_byte_level(const json& pre_tokenizer) {
  if (type_of(pre_tokenizer) == "ByteLevel") return true;
  for (const json& step : pre_tokenizer.is_object() ? pre_tokenizer.value("pretokenizers", json::array()) : json())
    if (type_of(step) == "ByteLevel") return true;
  return false;
}

// SentencePiece-style: no pre-tokenizer (the normalizer has put in the "▁"s), or Metaspace.
void load_sentencepiece_pre_tokenizer(const json& j, const std::string& where, ByteLevelBpeSpec& spec) {
  if (j.is_null()) return;
  if (type_of(j) != "Metaspace")
    throw DataError(
        fmt::format("{}: pre_tokenizer '{}' is not supported (ByteLevel, a Sequence of Split steps ending in "
                    "ByteLevel, or for a BPE without ByteLevel: Metaspace or none)",
                    where, type_of(j)));
  Metaspace m;
  m.replacement = j.value("replacement", m.replacement);
  if (m.replacement.empty() || m.replacement.find(' ') != std::string::npos)
    throw DataError(fmt::format("{}: pre_tokenizer Metaspace has an unusable replacement '{}'", where, m.replacement));
  m.split = !j.contains("split") || flag(j, "split");
  const std::string scheme = j.contains("prepend_scheme") ? j.value("prepend_scheme", "?")
                             : !j.contains("add_prefix_space") || flag(j, "add_prefix_space") ? "always"
                                                                                              : "never";
  if (scheme == "always")
    m.prepend = Metaspace::Prepend::always;
  else if (scheme == "first")
    m.prepend = Metaspace::Prepend::first;
  else if (scheme == "never")
    m.prepend = Metaspace::Prepend::never;
  else
    throw DataError(
        fmt::format("{}: pre_tokenizer Metaspace prepend_scheme '{}' is not always, first or never", where, scheme));
  spec.metaspace = std::move(m);
}

// Whether the decoder drops the leading space the normalizer or Metaspace put in (Strip with start >= 1, or a
// Metaspace decoder that prepends).
bool decoder_strips_space(const json& d) {
  const std::string t = type_of(d);
  if (t == "Sequence") {
    for (const json& step : d.value("decoders", json::array()))
      if (decoder_strips_space(step)) return true;
    return false;
  }
  if (t == "Strip") return d.value("start", 0) >= 1 && d.value("content", "") == " ";
  if (t == "Metaspace")
    return d.contains("prepend_scheme") ? d.value("prepend_scheme", "") != "never"
                                        : !d.contains("add_prefix_space") || flag(d, "add_prefix_space");
  return false;
}

int32_t find_eod(const TokenizerOptions& o, const ByteLevelBpeSpec& spec,
                 const std::unordered_map<std::string, int32_t>& by_text) {
  if (!o.eod_token.empty()) {
    for (const AddedToken& t : spec.added)
      if (t.content == o.eod_token) return t.id;
    auto it = by_text.find(o.eod_token);
    if (it != by_text.end()) return it->second;
    throw DataError(fmt::format("{}: --eod-token '{}' is neither an added token nor in the vocabulary",
                                o.tokenizer_file, o.eod_token));
  }
  // tokenizer.json does not say which token ends a document; these are the usual end-of-text tokens.
  std::vector<std::string> specials;
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    for (const AddedToken& t : spec.added)
      if (t.special && t.content == name) return t.id;
  for (const AddedToken& t : spec.added)
    if (t.special) specials.push_back(t.content);
  throw DataError(
      fmt::format("{}: no known end-of-text token among the special tokens ({}); name one with "
                  "--eod-token",
                  o.tokenizer_file, specials.empty() ? "none" : fmt::format("{}", fmt::join(specials, " "))));
}

AddedToken parse_added_token(const json& t, const std::string& where) {
  AddedToken a;
  a.content = t.value("content", "");
  a.id = t.value("id", -1);
  a.special = flag(t, "special");
  a.normalized = flag(t, "normalized");
  a.single_word = flag(t, "single_word");
  a.lstrip = flag(t, "lstrip");
  a.rstrip = flag(t, "rstrip");
  if (a.id < 0) throw DataError(fmt::format("{}: added token '{}' has no valid id", where, a.content));
  return a;
}

// The largest id of vocabulary and added tokens (by id: their content), checking that the added tokens past the
// vocabulary take the ids after it without a gap.
int64_t last_added_id(const std::unordered_map<int32_t, std::string>& added_by_id, int64_t vocab_max_id,
                      const std::string& where) {
  int64_t next = vocab_max_id + 1;  // the next id after the vocabulary, in id order of the added tokens
  for (const auto& [id, content] : std::map<int32_t, std::string>(added_by_id.begin(), added_by_id.end())) {
    if (id < next) continue;  // a vocabulary entry, or checked above
    if (id > next)
      throw DataError(
          fmt::format("{}: added token '{}' has id {}, beyond the vocabulary and the other added tokens (ids 0..{}): "
                      "an added token not in the vocabulary takes the next id, {}",
                      where, content, id, next - 1, next));
    ++next;
  }
  return next - 1;
}

// Appends tokenizer.json's added tokens to `added`; returns the largest id of vocabulary and added tokens. As
// Hugging Face's tokenizers assigns them, an added token that is a vocabulary entry has that entry's id, and the
// others take the ids after the vocabulary, one each, without a gap: anything else is refused, naming the token.
int64_t load_added_tokens(const json& list, const std::string& where,
                          const std::unordered_map<std::string, int32_t>& by_text, int64_t vocab_max_id,
                          std::vector<AddedToken>& added) {
  std::unordered_map<int32_t, std::string> vocab_by_id, added_by_id;
  for (const auto& [text, id] : by_text) vocab_by_id.emplace(id, text);
  for (const json& t : list) {
    AddedToken a = parse_added_token(t, where);
    const auto in_vocab = by_text.find(a.content);
    const auto vocab_entry = vocab_by_id.find(a.id);
    if (in_vocab != by_text.end() && in_vocab->second != a.id)
      throw DataError(fmt::format("{}: added token '{}' has id {}, but the vocabulary gives it id {}", where, a.content,
                                  a.id, in_vocab->second));
    if (vocab_entry != vocab_by_id.end() && vocab_entry->second != a.content)
      throw DataError(fmt::format("{}: added token '{}' has id {}, which the vocabulary gives to '{}'", where,
                                  a.content, a.id, vocab_entry->second));
    if (const auto [at, fresh] = added_by_id.emplace(a.id, a.content); !fresh)
      throw DataError(fmt::format("{}: added tokens '{}' and '{}' both have id {} (an id stands for one token)", where,
                                  at->second, a.content, a.id));
    added.push_back(std::move(a));
  }
  return last_added_id(added_by_id, vocab_max_id, where);
}

std::unique_ptr<Tokenizer> load_hf(const TokenizerOptions& o) {
  if (o.tokenizer_file.empty()) throw DataError("the hf tokenizer needs --tokenizer-file (tokenizer.json)");
  const std::string& where = o.tokenizer_file;
  const json root = parse_json(where, read_file(where));
  if (!root.is_object())
    throw DataError(fmt::format("{}: not a tokenizer.json: expected a JSON object with a model, found {}", where,
                                root.type_name()));
  const json& model = root.value("model", json());
  if (type_of(model) != "BPE" && !(model.is_object() && !model.contains("type") && model.contains("merges")))
    throw DataError(fmt::format("{}: model '{}' is not supported (only BPE)", where, type_of(model)));
  const bool byte_level = mentions_byte_level(root.value("pre_tokenizer", json()));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty()))
      throw DataError(fmt::format("{}: BPE option {} is not supported", where, key));
  if (byte_level && (flag(model, "byte_fallback") || flag(model, "fuse_unk")))
    throw DataError(fmt::format("{}: BPE option {} is not supported (a SentencePiece-style BPE, not byte-level)", where,
                                flag(model, "byte_fallback") ? "byte_fallback" : "fuse_unk"));

  ByteLevelBpeSpec spec;
  spec.kind = TokenizerKind::hf;
  spec.normalizer = load_normalizer(root.value("normalizer", json()), where);
  std::unordered_map<std::string, int32_t> by_text;
  const int64_t vocab_max_id = load_vocab(model.value("vocab", json()), where, spec.model, by_text, byte_level);
  int64_t index = 0;
  for (const json& m : model.value("merges", json::array())) {
    const std::string at = fmt::format("{}: merges[{}]", where, index++);
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) throw DataError(fmt::format("{}: '{}' is not two tokens", at, s));
      add_merge(spec.model, s.substr(0, space), s.substr(space + 1), at, byte_level);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      add_merge(spec.model, m[0].get<std::string>(), m[1].get<std::string>(), at, byte_level);
    } else {
      throw DataError(fmt::format("{}: a merge is \"a b\" or [\"a\", \"b\"]", at));
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = by_text.find(model["unk_token"].get<std::string>());
    if (it != by_text.end()) spec.model.set_unk(it->second);
  }
  spec.model.set_ignore_merges(flag(model, "ignore_merges"));
  if (byte_level) {
    load_pre_tokenizer(root.value("pre_tokenizer", json()), where, spec);
  } else {
    spec.model.set_char_symbols(flag(model, "byte_fallback"), flag(model, "fuse_unk"));
    load_sentencepiece_pre_tokenizer(root.value("pre_tokenizer", json()), where, spec);
    spec.decode_strips_space = decoder_strips_space(root.value("decoder", json()));
  }
  // Read (and so checked) even when left out: a file with an unsupported post-processor is refused either way.
  SpecialTemplate specials = load_post_processor(root.value("post_processor", json()), where);
  if (o.add_special_tokens) spec.specials = std::move(specials);

  const int64_t max_id =
      load_added_tokens(root.value("added_tokens", json::array()), where, by_text, vocab_max_id, spec.added);
  for (const auto* ids : {&spec.specials.before, &spec.specials.after})
    for (int32_t id : *ids)
      if (id > max_id)
        throw DataError(fmt::format("{}: post_processor special token id {} is not in the vocabulary", where, id));
  spec.vocab_size = max_id + 1;
  spec.eod = find_eod(o, spec, by_text);
  fill_id_bytes(spec, by_text, byte_level, flag(model, "byte_fallback"));
  return std::make_unique<ByteLevelBpeTokenizer>(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const TokenizerOptions& options) {
  const bool gpt2 = options.kind == TokenizerKind::gpt2;
  try {
    return gpt2 ? load_gpt2(options) : load_hf(options);
  } catch (const json::exception& e) {  // a member of an unexpected JSON type the checks above did not name
    throw DataError(
        fmt::format("{}: unexpected JSON structure: {}", gpt2 ? options.vocab_file : options.tokenizer_file, e.what()));
  }
}

}  // namespace mt
