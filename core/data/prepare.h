// prepare.h: `megatrain data prepare` (text / JSONL -> .bin/.idx) and `megatrain data inspect`.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tokenizer/chat_template.h"
#include "core/data/indexed_dataset.h"
#include "core/tokenizer/tokenizer.h"

namespace mt {

struct PrepareStats;

struct PrepareOptions {
  std::vector<std::string> inputs;  // .jsonl / .json: JSON lines; anything else: plain text
  std::string output_prefix;        // writes PREFIX.bin and PREFIX.idx
  TokenizerOptions tokenizer;       // the name (see supported_tokenizers()) and its files
  std::string json_key = "text";    // the member of each JSON line that holds the document
  bool append_eod = true;           // end every document with the tokenizer's end-of-document id
  int workers = 1;                  // tokenizing threads; the output keeps the input's document order
  bool overwrite = false;           // replace an existing PREFIX.bin / PREFIX.idx (never one of the inputs)
  std::function<void(const PrepareStats&)> on_progress;  // after each document written (a progress line)
  // chat: each JSON line is a conversation (chat_template.h), rendered by `chat_template` into PREFIX (tokens) and
  // PREFIX_mask (the loss mask); json_key, append_eod and workers do not apply (one thread).
  DataFormat format = DataFormat::text;
  // chat: automatic reads `chat_template` from tokenizer_config.json beside the tokenizer's file.
  ChatTemplate chat_template = ChatTemplate::automatic;
};

struct PrepareStats {
  int64_t files = 0;
  int64_t documents = 0;      // written
  int64_t empty_skipped = 0;  // documents with no tokens (empty text and no EOD), not written
  int64_t tokens = 0;         // written, EOD tokens included
  int64_t bytes_read = 0;     // of the inputs, so far
  int64_t vocab_size = 0;
  TokenDType dtype = TokenDType::u16;
  int64_t loss_tokens = 0;                               // chat: tokens whose mask is 1
  ChatTemplate chat_template = ChatTemplate::automatic;  // chat: the template rendered (never automatic then)
};

// Tokenizes the inputs in order into one dataset. A plain-text file holds one document per paragraph
// (paragraphs are separated by blank lines; a paragraph's lines are joined with '\n', CRLF endings read as
// LF). A JSON-lines file holds one object per non-blank line whose `json_key` string is a document.
// Every input is checked before anything is written; a missing or unreadable input, a malformed line
// (reported as FILE:LINE) or no document at all is a DataError, and the output is then left as it was:
// the pair is written to temporary files and renamed into place only when complete. PREFIX.tokenizer.yaml
// records the tokenizer (tokenizer_sidecar.h). Before any work, an existing PREFIX.bin or PREFIX.idx is refused
// unless `overwrite`, and an output file that is one of the inputs always.
// With format chat the inputs must be JSON lines; each line is one document of PREFIX and the same-length document
// of PREFIX_mask (u8), both written and renamed into place together; a line that is not a conversation, or that the
// template cannot render, is a DataError naming FILE:LINE.
PrepareStats prepare_dataset(const PrepareOptions& options);

// A human-readable summary of PREFIX.bin/.idx: dtype, sequence / document / token counts, min / mean / max
// document length, and the first tokens of the first `sample_docs` documents (also as text when every
// shown token is a byte-tokenizer id, 0..256). With decode_docs > 0, then the first decode_docs documents whole,
// decoded by the tokenizer PREFIX.tokenizer.yaml records, as valid UTF-8 (invalid sequences as U+FFFD).
std::string inspect_dataset(const std::string& prefix, int64_t sample_docs = 1, int64_t decode_docs = 0);

}  // namespace mt
