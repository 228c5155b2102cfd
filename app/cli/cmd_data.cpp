// cmd_data.cpp: `megatrain data prepare` and `megatrain data inspect`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <memory>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "core/data/dataset_checksums.h"
#include "app/cli/progress_flags.h"
#include "core/data/prepare.h"
#include "core/tokenizer/tokenizer.h"

namespace mt::app {

namespace {

// The inputs' total size, for the progress line's ETA (a missing input counts 0: prepare_dataset names it).
int64_t input_bytes(const std::vector<std::string>& inputs) {
  int64_t total = 0;
  for (const std::string& path : inputs) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec) total += static_cast<int64_t>(size);
  }
  return total;
}

std::string prepared(const PrepareStats& s) { return fmt::format("{} documents, {} tokens", s.documents, s.tokens); }

// prepare_dataset with a progress line every few seconds on standard error, as preprocess_data.py prints.
PrepareStats prepare_with_progress(PrepareOptions options, ProgressMode mode) {
  const int64_t total = input_bytes(options.inputs);
  Progress progress({.what = "data prepare", .enabled = progress_wanted(mode)});
  options.on_progress = [&](const PrepareStats& s) {
    progress.update(s.bytes_read, total, [&] { return prepared(s); });
  };
  const PrepareStats s = prepare_dataset(options);
  progress.finish(s.bytes_read, prepared(s));
  return s;
}

}  // namespace

void add_data_commands(CLI::App& root) {
  CLI::App* data = root.add_subcommand("data", "Prepare and inspect Megatron indexed datasets (.bin + .idx)");
  data->require_subcommand(1);

  // Options live on the heap: the callbacks run after this function has returned.
  auto prep = std::make_shared<PrepareOptions>();
  auto tokenizer = std::make_shared<std::string>(name_of(prep->tokenizer.kind));
  CLI::App* prepare = data->add_subcommand("prepare", "Tokenize text or JSONL files into PREFIX.bin / PREFIX.idx");
  prepare
      ->add_option("-i,--input", prep->inputs,
                   "Input files: .jsonl/.json are JSON lines (one document per line), anything else is plain "
                   "text (one document per blank-line-separated paragraph)")
      ->required()
      ->expected(1, -1);
  prepare->add_option("-o,--output", prep->output_prefix, "Output prefix: writes PREFIX.bin and PREFIX.idx")
      ->required();
  prepare
      ->add_option(
          "--tokenizer", *tokenizer,
          fmt::format("Tokenizer ({}): gpt2 reads --vocab-file and --merge-file (GPT-2's byte-level BPE), "
                      "hf reads --tokenizer-file (a Hugging Face byte-level BPE tokenizer.json), sentencepiece reads "
                      "--tokenizer-model (a SentencePiece .model){}",
                      fmt::join(EnumNames<TokenizerKind>::names, ", "),
                      have_sentencepiece() ? "" : " (this build has no SentencePiece)"))
      ->capture_default_str();
  prepare->add_option("--vocab-file", prep->tokenizer.vocab_file, "gpt2: GPT-2's vocab.json");
  prepare->add_option("--merge-file", prep->tokenizer.merge_file, "gpt2: GPT-2's merges.txt");
  prepare->add_option("--tokenizer-file", prep->tokenizer.tokenizer_file, "hf: a Hugging Face tokenizer.json");
  prepare->add_option("--tokenizer-model", prep->tokenizer.tokenizer_model, "sentencepiece: a SentencePiece .model");
  prepare->add_option("--eod-token", prep->tokenizer.eod_token,
                      "hf: the end-of-document token's text (default: <|endoftext|>, <|end_of_text|>, </s> or "
                      "<eos>, whichever is a special token); sentencepiece: a piece (default: the model's eos)");
  prepare->add_flag(
      "--no-special-tokens", [prep](int64_t) { prep->tokenizer.add_special_tokens = false; },
      "hf: leave out the special tokens tokenizer.json's post-processor puts around each document (e.g. Llama-3's "
      "<|begin_of_text|>); by default they are added, as Megatron's HuggingFaceTokenizer and the tokenizers "
      "package's encode do. Recorded in PREFIX.tokenizer.yaml");
  prepare
      ->add_option("--spm-chunk-bytes", prep->tokenizer.spm_chunk_bytes,
                   "sentencepiece: encode a longer document in pieces of about this many bytes, cut at spaces (the "
                   "ids stay those of the whole document), so memory stays bounded; a document with no cut within "
                   "16 times this is refused")
      ->capture_default_str()
      ->check(at_least(1));
  prepare->add_option("--workers", prep->workers, "Tokenizing threads (documents keep their order)")
      ->capture_default_str()
      ->check(at_least(1));
  prepare->add_option("--json-key", prep->json_key, "The JSON member holding each document's text")
      ->capture_default_str();
  prepare->add_flag("--overwrite", prep->overwrite,
                    "Replace an existing PREFIX.bin / PREFIX.idx (without it they are refused; an output that is one "
                    "of the inputs always is)");
  prepare->add_flag(
      "--no-eod", [prep](int64_t) { prep->append_eod = false; },
      "Do not end each document with the end-of-document token");
  auto format = std::make_shared<std::string>("text");
  prepare
      ->add_option("--format", *format,
                   "text: documents (paragraphs, or the --json-key member of JSON lines). chat: JSON lines holding "
                   "\"messages\" [{role, content}] or \"prompt\"/\"response\", rendered by --chat-template into "
                   "PREFIX.bin/.idx and a loss mask PREFIX_mask.bin/.idx (1 on the assistant's tokens); no EOD added")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "chat"}));
  auto chat_template = std::make_shared<std::string>("auto");
  prepare
      ->add_option("--chat-template", *chat_template,
                   "chat: chatml, llama3, or auto (the chat_template of tokenizer_config.json beside the tokenizer's "
                   "file, when it is one of those)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chatml", "llama3", "auto"}));
  auto progress = std::make_shared<ProgressMode>(ProgressMode::automatic);
  add_progress_flags(prepare, *progress);
  prepare->callback([prep, tokenizer, progress, format, chat_template] {
    prep->tokenizer.kind = parse_tokenizer_kind(*tokenizer);
    prep->format = *format == "chat" ? DataFormat::chat : DataFormat::text;
    prep->chat_template = *chat_template == "chatml"   ? ChatTemplate::chatml
                          : *chat_template == "llama3" ? ChatTemplate::llama3
                                                       : ChatTemplate::automatic;
    const PrepareStats s = prepare_with_progress(*prep, *progress);
    fmt::print("wrote {}.bin / {}.idx: {} documents, {} tokens ({}, vocab_size {}) from {} file(s)",
               prep->output_prefix, prep->output_prefix, s.documents, s.tokens, token_dtype_name(s.dtype), s.vocab_size,
               s.files);
    if (prep->format == DataFormat::chat)
      fmt::print("; loss mask {}.bin / {}.idx: {} of the tokens learned ({} template)",
                 loss_mask_prefix(prep->output_prefix), loss_mask_prefix(prep->output_prefix), s.loss_tokens,
                 name_of(s.chat_template));
    if (s.empty_skipped > 0) fmt::print("; {} empty document(s) skipped", s.empty_skipped);
    fmt::print("\n");
  });

  auto prefix = std::make_shared<std::string>();
  auto docs = std::make_shared<int64_t>(1);
  CLI::App* inspect = data->add_subcommand("inspect", "Summarize PREFIX.bin / PREFIX.idx");
  inspect->add_option("prefix", *prefix, "Dataset prefix (without .bin / .idx)")->required();
  inspect->add_option("--docs", *docs, "How many leading documents to show")->capture_default_str()->check(at_least(0));
  auto decode = std::make_shared<int64_t>(0);
  inspect
      ->add_option("--decode", *decode,
                   "Also print the first N documents as text, decoded by the tokenizer PREFIX.tokenizer.yaml "
                   "names (invalid UTF-8 shown as U+FFFD)")
      ->check(at_least(0));
  auto verify = std::make_shared<bool>(false);
  inspect->add_flag("--verify", *verify,
                    "Check PREFIX.bin and PREFIX.idx against the checksums in PREFIX.crc32c (data prepare writes "
                    "them); a mismatch names the file and the chunk, and exits with an error");
  inspect->callback([prefix, docs, decode, verify] {
    // Verified first: a corrupt dataset fails before its summary is printed.
    const std::string checked = *verify ? verify_dataset_report(*prefix) : std::string();
    fmt::print("{}{}", inspect_dataset(*prefix, *docs, *decode), checked);
  });
}

}  // namespace mt::app
