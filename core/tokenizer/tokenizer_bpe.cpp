// tokenizer_bpe.cpp: the byte-level BPE pipeline (added tokens, pre-tokenization, per-word BPE with a cache).
#include "core/tokenizer/tokenizer_bpe.h"

#include <unordered_map>

#include "core/tokenizer/utf8.h"

namespace mt {

namespace {

// Words up to this many bytes are cached (HF caches words below 256 characters); the cache is dropped when
// it reaches kCacheEntries so memory stays bounded on corpora with endless distinct words.
constexpr size_t kCachedWordBytes = 256;
constexpr size_t kCacheEntries = 1 << 20;

struct BpeCache final : EncodeCache {
  SplitScratch split;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  std::string utf8_scratch, prefixed, norm_a, norm_b, meta;
  std::vector<std::string_view> pieces, pieces_tmp;
  std::vector<int32_t> word_ids;
  std::vector<Segment> segments, segments_tmp, parts, parts_tmp;
};

}  // namespace

namespace {

// The added tokens as the matcher sees them: those with normalized=true are matched on normalized text, so their
// content goes through the normalizer too (as tokenizers' AddedVocabulary builds its normalized trie), e.g. a
// "<MASK>" token under Lowercase matches "<mask>" and "<MASK>" alike.
std::vector<AddedToken> as_matched(const std::vector<AddedToken>& added, const Normalizer& normalizer) {
  std::vector<AddedToken> out = added;
  if (!normalizer.empty())
    for (AddedToken& t : out)
      if (t.normalized) t.content = normalizer.apply(t.content);
  return out;
}

}  // namespace

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeSpec spec)
    : spec_(std::move(spec)), matched_(as_matched(spec_.added, spec_.normalizer)), added_(matched_) {}

std::unique_ptr<EncodeCache> ByteLevelBpeTokenizer::make_cache() const { return std::make_unique<BpeCache>(); }

void ByteLevelBpeTokenizer::encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out,
                                        EncodeCache& base) const {
  auto& cache = static_cast<BpeCache&>(base);
  if (spec_.metaspace) {
    spec_.metaspace->apply(text, at_start, cache.meta, cache.pieces);
  } else if (spec_.add_prefix_space && !text.empty() && text[0] != ' ') {
    cache.prefixed.resize(text.size() + 1);
    cache.prefixed[0] = ' ';
    text.copy(cache.prefixed.data() + 1, text.size());
    text = cache.prefixed;
  }
  if (!spec_.metaspace) {
    spec_.pre_tokenizer.split(text, cache.pieces, cache.pieces_tmp, cache.split);
    if (spec_.pre_tokenizer.num_steps() == 0 && !text.empty()) cache.pieces.assign(1, text);
  }
  for (std::string_view word : cache.pieces) {
    if (word.size() > kCachedWordBytes) {
      spec_.model.encode_word(word, out);
      continue;
    }
    auto it = cache.words.find(word);
    if (it == cache.words.end()) {
      if (cache.words.size() >= kCacheEntries) cache.words.clear();
      cache.word_ids.clear();
      spec_.model.encode_word(word, cache.word_ids);
      it = cache.words.emplace(std::string(word), cache.word_ids).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

void ByteLevelBpeTokenizer::encode_with(std::string_view raw, std::vector<int32_t>& out, EncodeCache* cache) const {
  std::unique_ptr<EncodeCache> own;
  if (!cache) {
    own = make_cache();
    cache = own.get();
  }
  auto& c = static_cast<BpeCache&>(*cache);
  // Invalid UTF-8 becomes U+FFFD first, as Python's errors="replace" decoding would make it (utf8.h).
  std::string_view text = valid_utf8(raw, c.utf8_scratch);
  c.segments.assign(1, Segment{text, -1});
  added_.cut_raw(c.segments, c.segments_tmp, c.split);
  out.insert(out.end(), spec_.specials.before.begin(), spec_.specials.before.end());
  for (const Segment& seg : c.segments) {
    if (seg.added_id >= 0) {
      out.push_back(seg.added_id);
      continue;
    }
    // Normalized per piece between raw added tokens, then cut at the normalized=true added tokens.
    const std::string_view norm = spec_.normalizer.apply(seg.text, c.norm_a, c.norm_b, c.split);
    c.parts.assign(1, Segment{norm, -1});
    added_.cut_normalized(c.parts, c.parts_tmp, c.split);
    // Metaspace's "first": whether the piece begins the input (its original offset is 0).
    const bool seg_at_start = seg.text.data() == text.data();
    for (const Segment& part : c.parts) {
      if (part.added_id >= 0)
        out.push_back(part.added_id);
      else
        encode_text(part.text, seg_at_start && part.text.data() == norm.data(), out, c);
    }
  }
  out.insert(out.end(), spec_.specials.after.begin(), spec_.specials.after.end());
}

std::string ByteLevelBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t t : ids) {
    if (t == spec_.eod) continue;
    if (t >= 0 && static_cast<size_t>(t) < spec_.id_bytes.size() && !spec_.id_bytes[static_cast<size_t>(t)].empty())
      s += spec_.id_bytes[static_cast<size_t>(t)];
    else
      s += "\xEF\xBF\xBD";  // U+FFFD
  }
  if (spec_.decode_strips_space && !s.empty() && s[0] == ' ') s.erase(0, 1);
  return s;
}

uint32_t ByteLevelBpeTokenizer::vocabulary_hash() const {
  std::vector<int32_t> ids = spec_.model.merge_ids();
  for (const auto* specials : {&spec_.specials.before, &spec_.specials.after}) {
    ids.push_back(-1);  // a separator: the lists cannot trade ids
    ids.insert(ids.end(), specials->begin(), specials->end());
  }
  return hash_vocabulary(spec_.id_bytes, ids);
}

}  // namespace mt
