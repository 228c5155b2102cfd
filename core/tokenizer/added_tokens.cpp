// added_tokens.cpp: the added-token cut (Hugging Face's AddedVocabulary::find_matches).
#include "core/tokenizer/added_tokens.h"

#include <fmt/format.h>

#include <algorithm>

namespace mt {

namespace {

// The byte offset where the character ending at `pos` starts (pos > 0, text valid UTF-8).
size_t previous_char(std::string_view text, size_t pos) {
  do --pos;
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

size_t next_char(std::string_view text, size_t pos) {
  do ++pos;
  while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  bool need_tests = false;
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    Pass& p = t.normalized ? normalized_ : raw_;
    p.by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(&t);
    p.empty = false;
    need_tests = need_tests || t.single_word || t.lstrip || t.rstrip;
  }
  for (Pass* p : {&raw_, &normalized_})
    for (auto& list : p->by_first_byte)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  if (need_tests) {
    word_ = std::make_unique<CharTest>(fmt::format("[{}]", kRustWordClass));
    space_ = std::make_unique<CharTest>(fmt::format("[{}]", kWhiteSpaceClass));
  }
}

void AddedTokenMatcher::cut_pass(const Pass& pass, std::vector<Segment>& segments, std::vector<Segment>& tmp,
                                 SplitScratch& scratch) const {
  if (pass.empty) return;
  tmp.clear();
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0)
      tmp.push_back(seg);
    else
      cut_one(pass, seg.text, tmp, scratch);
  }
  segments.swap(tmp);
}

// One ordinary segment. The search resumes after each match (a rejected single_word match included), as an
// Aho-Corasick leftmost-longest iteration does; after an rstrip it resumes past the swallowed whitespace.
void AddedTokenMatcher::cut_one(const Pass& pass, std::string_view s, std::vector<Segment>& out,
                                SplitScratch& scratch) const {
  size_t done = 0;  // the end of what has been emitted
  for (size_t i = 0; i < s.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : pass.by_first_byte[static_cast<unsigned char>(s[i])])
      if (s.compare(i, t->content.size(), t->content) == 0) {
        hit = t;  // longest first
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    i = stop;
    if (hit->single_word) {
      const bool word_before = start > 0 && word_->at(s, previous_char(s, start), scratch);
      const bool word_after = stop < s.size() && word_->at(s, stop, scratch);
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {
      size_t from = start;
      while (from > 0 && space_->at(s, previous_char(s, from), scratch)) from = previous_char(s, from);
      start = std::max(from, done);
    }
    if (hit->rstrip)
      while (stop < s.size() && space_->at(s, stop, scratch)) stop = next_char(s, stop);
    if (start > done) out.push_back({s.substr(done, start - done), -1});
    out.push_back({s.substr(start, stop - start), hit->id});
    done = i = stop;
  }
  if (done < s.size()) out.push_back({s.substr(done), -1});
}

}  // namespace mt
