// tokenizer_bpe.cpp: the byte-level BPE pipeline (added tokens, pre-tokenization, per-word BPE with a cache).
#include "core/data/tokenizer_bpe.h"

#include <algorithm>
#include <unordered_map>

#include "core/data/utf8.h"

namespace mt {

namespace {

// Words up to this many bytes are cached (HF caches words below 256 characters); the cache is dropped when
// it reaches kCacheEntries so memory stays bounded on corpora with endless distinct words.
constexpr size_t kCachedWordBytes = 256;
constexpr size_t kCacheEntries = 1 << 20;

struct BpeCache final : EncodeCache {
  SplitScratch split;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  std::string utf8_scratch, prefixed;
  std::vector<std::string_view> pieces, pieces_tmp;
  std::vector<int32_t> word_ids;
};

}  // namespace

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeSpec spec) : spec_(std::move(spec)) {
  for (const AddedToken& t : spec_.added) {
    if (t.content.empty()) continue;
    Matcher& m = t.normalized ? normalized_pass_ : raw_pass_;
    m.by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(&t);
    m.empty = false;
  }
  for (Matcher* m : {&raw_pass_, &normalized_pass_})
    for (auto& list : m->by_first_byte)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
}

std::unique_ptr<EncodeCache> ByteLevelBpeTokenizer::make_cache() const { return std::make_unique<BpeCache>(); }

// Splits every ordinary segment at the leftmost-longest occurrences of the matcher's tokens.
void ByteLevelBpeTokenizer::cut(const Matcher& m, std::vector<Segment>& segments, std::vector<Segment>& tmp) {
  if (m.empty) return;
  tmp.clear();
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0) {
      tmp.push_back(seg);
      continue;
    }
    std::string_view s = seg.text;
    size_t last = 0;
    for (size_t i = 0; i < s.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : m.by_first_byte[static_cast<unsigned char>(s[i])])
        if (s.compare(i, t->content.size(), t->content) == 0) {
          hit = t;  // longest first
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      if (i > last) tmp.push_back({s.substr(last, i - last), -1});
      tmp.push_back({s.substr(i, hit->content.size()), hit->id});
      i += hit->content.size();
      last = i;
    }
    if (last < s.size()) tmp.push_back({s.substr(last), -1});
  }
  segments.swap(tmp);
}

void ByteLevelBpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out, EncodeCache& base) const {
  auto& cache = static_cast<BpeCache&>(base);
  if (spec_.add_prefix_space && !text.empty() && text[0] != ' ') {
    cache.prefixed.resize(text.size() + 1);
    cache.prefixed[0] = ' ';
    text.copy(cache.prefixed.data() + 1, text.size());
    text = cache.prefixed;
  }
  spec_.pre_tokenizer.split(text, cache.pieces, cache.pieces_tmp, cache.split);
  if (spec_.pre_tokenizer.num_steps() == 0 && !text.empty()) cache.pieces.assign(1, text);
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
  std::vector<Segment> segments{{text, -1}}, tmp;
  cut(raw_pass_, segments, tmp);
  cut(normalized_pass_, segments, tmp);
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0)
      out.push_back(seg.added_id);
    else
      encode_text(seg.text, out, c);
  }
}

}  // namespace mt
