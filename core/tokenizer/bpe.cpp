// bpe.cpp: the BPE merge loop (lowest rank first, leftmost first among equal ranks, as Hugging Face's
// priority-queue implementation orders them) over a linked list of symbols: O(n log n) per word.
#include "core/tokenizer/bpe.h"

#include <array>
#include <cstdio>
#include <queue>

namespace mt {

namespace {

// Code point -> byte for GPT-2's bytes_to_unicode (-1: no byte).
const std::array<int, 324>& unicode_to_byte() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[printable ? b : 256 + n++] = b;
    }
    return t;
  }();
  return table;
}

}  // namespace

std::optional<std::string> byte_level_decode(std::string_view s) {
  std::string out;
  const auto& table = unicode_to_byte();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are above U+0143
    }
    if (cp >= table.size() || table[cp] < 0) return std::nullopt;
    out += static_cast<char>(table[cp]);
  }
  return out;
}

void BpeModel::add_token(std::string bytes, int32_t id) {
  if (!byte_id_init_) {
    std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
    byte_id_init_ = true;
  }
  if (bytes.size() == 1) byte_id_[static_cast<unsigned char>(bytes[0])] = id;
  vocab_[std::move(bytes)] = id;
}

bool BpeModel::add_merge(const std::string& left, const std::string& right) {
  const auto l = find(left), r = find(right), m = find(left + right);
  if (!l || !r || !m) return false;
  const int32_t rank = static_cast<int32_t>(merges_.size());
  merges_.try_emplace(key(*l, *r), Merge{rank, *m});  // a repeated merge keeps its first rank
  return true;
}

std::vector<int32_t> BpeModel::merge_ids() const {
  std::vector<int32_t> out(merges_.size() * 3);
  for (const auto& [pair, merge] : merges_) {
    int32_t* at = &out[static_cast<size_t>(merge.rank) * 3];
    at[0] = static_cast<int32_t>(pair >> 32);
    at[1] = static_cast<int32_t>(pair & 0xFFFFFFFFu);
    at[2] = merge.id;
  }
  return out;
}

void BpeModel::set_char_symbols(bool byte_fallback, bool fuse_unk) {
  char_symbols_ = true;
  fuse_unk_ = fuse_unk;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto id = byte_fallback ? find(name) : std::nullopt;
    fallback_id_[b] = id ? *id : -1;
  }
}

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  auto it = vocab_.find(bytes);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = find(word)) {
      out.push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  if (char_symbols_) {
    // Hugging Face's merge_word: a pending unknown is written only before the next vocabulary character or at the
    // end (byte-fallback tokens do not flush it).
    std::optional<int32_t> unk;
    for (size_t i = 0; i < word.size();) {
      const auto lead = static_cast<unsigned char>(word[i]);
      const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      const std::string_view ch = word.substr(i, len);
      i += len;
      if (auto id = find(ch)) {
        if (unk) sym.push_back({*unk, 0, 0, true});
        unk.reset();
        sym.push_back({*id, 0, 0, true});
        continue;
      }
      bool all = true;
      for (char b : ch) all = all && fallback_id_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : ch) sym.push_back({fallback_id_[static_cast<unsigned char>(b)], 0, 0, true});
        continue;
      }
      if (!unk_) continue;
      if (unk && !fuse_unk_) sym.push_back({*unk, 0, 0, true});
      unk = unk_;
    }
    if (unk) sym.push_back({*unk, 0, 0, true});
  }
  for (char ch : char_symbols_ ? std::string_view() : word) {
    const int32_t id = byte_id_init_ ? byte_id_[static_cast<unsigned char>(ch)] : -1;
    if (id < 0) {
      if (unk_) sym.push_back({*unk_, 0, 0, true});  // byte-level: fuse_unk is refused at load time
      continue;
    }
    sym.push_back({id, 0, 0, true});
  }
  const int32_t n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges_.find(key(sym[pos].id, sym[sym[pos].next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    auto it = merges_.find(key(s.id, sym[s.next].id));
    if (it == merges_.end() || it->second.rank != top.rank) continue;  // stale: a neighbour merged first
    Symbol& right = sym[s.next];
    s.id = it->second.id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    consider(s.prev);
    consider(top.pos);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace mt
