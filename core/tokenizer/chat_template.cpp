// chat_template.cpp: chat JSON lines, the ChatML and Llama 3 templates, and their tokens and loss mask.
#include "core/tokenizer/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <nlohmann/json.hpp>

#include "core/io/file_io.h"

namespace mt {

namespace {

using nlohmann::json;

std::string string_member(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw DataError(fmt::format("{} has no \"{}\"", where, key));
  if (!it->is_string())
    throw DataError(fmt::format("{}'s \"{}\" is not a string (it is {})", where, key, it->type_name()));
  return it->get<std::string>();
}

// Python's str.strip() on ASCII (Jinja's trim): the whitespace str.isspace() knows below 0x80.
std::string trim(const std::string& s) {
  constexpr std::string_view kSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// One piece of the rendered text: a special token, or ordinary text made of a header (mask 0) and a content.
struct Piece {
  int special = -1;  // index into the template's special tokens; -1: ordinary text
  std::string header;
  std::string content;
  uint8_t mask = 0;  // of the special token, or of the content's tokens
};

}  // namespace

std::vector<ChatMessage> parse_chat_line(std::string_view line) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e400)
    throw DataError(fmt::format("invalid JSON line: {}", e.what()));
  }
  if (!j.is_object()) throw DataError(fmt::format("expected a JSON object, got {}", j.type_name()));
  const bool has_messages = j.contains("messages");
  const bool has_prompt = j.contains("prompt") || j.contains("response");
  if (has_messages && has_prompt)
    throw DataError("the object has both \"messages\" and \"prompt\"/\"response\"; give one form");
  std::vector<ChatMessage> messages;
  if (has_messages) {
    const json& list = j["messages"];
    if (!list.is_array()) throw DataError(fmt::format("\"messages\" is not a list (it is {})", list.type_name()));
    if (list.empty()) throw DataError("\"messages\" is empty");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("messages[{}]", i);
      if (!list[i].is_object()) throw DataError(fmt::format("{} is not an object", where));
      ChatMessage m{string_member(list[i], "role", where), string_member(list[i], "content", where)};
      if (m.role != "system" && m.role != "user" && m.role != "assistant")
        throw DataError(fmt::format("{}: unknown role \"{}\" (expected system, user or assistant)", where, m.role));
      messages.push_back(std::move(m));
    }
  } else if (has_prompt) {
    messages.push_back({"user", string_member(j, "prompt", "the object")});
    messages.push_back({"assistant", string_member(j, "response", "the object")});
  } else {
    throw DataError("the object has neither \"messages\" nor \"prompt\" and \"response\"");
  }
  if (std::none_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "assistant"; }))
    throw DataError("the conversation has no assistant message: nothing to learn from it");
  return messages;
}

namespace fs = std::filesystem;

namespace {

// The template whose text `text` is (read from `path`, for the message).
ChatTemplate recognise_chat_template(const std::string& text, const std::string& path) {
  if (text.find("<|im_start|>") != std::string::npos) return ChatTemplate::chatml;
  if (text.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::llama3;
  std::string start = text.substr(0, 80);
  std::replace(start.begin(), start.end(), '\n', ' ');
  throw DataError(
      fmt::format("{}: the chat_template \"{}{}\" is neither ChatML nor Llama 3, the templates data "
                  "prepare renders; name one with --chat-template chatml|llama3 if the model uses it",
                  path, start, text.size() > 80 ? "..." : ""));
}

std::string read_template_file(const std::string& path) {
  try {
    return io::read_text_file(path);
  } catch (const DataError&) {
    throw;
  } catch (const FileError& e) {
    throw DataError(fmt::format("--chat-template auto: {}", e.what()));
  }
}

}  // namespace

ChatTemplate chat_template_from_config(const std::string& path) {
  json j;
  try {
    j = json::parse(read_template_file(path));
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: invalid JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("chat_template"))
    throw DataError(fmt::format("{}: no \"chat_template\"; name one with --chat-template chatml|llama3", path));
  const json& t = j["chat_template"];
  if (!t.is_string())
    throw DataError(
        fmt::format("{}: \"chat_template\" is not a string (a list of named templates?); name one with "
                    "--chat-template chatml|llama3",
                    path));
  return recognise_chat_template(t.get<std::string>(), path);
}

ChatTemplate chat_template_from_dir(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (const fs::path jinja = d / "chat_template.jinja"; fs::exists(jinja, ec))
    return recognise_chat_template(read_template_file(jinja.string()), jinja.string());
  for (const char* name : {"chat_template.json", "tokenizer_config.json"}) {
    const fs::path file = d / name;
    if (!fs::exists(file, ec)) continue;
    return chat_template_from_config(file.string());
  }
  throw DataError(fmt::format(
      "--chat-template auto: {} holds none of chat_template.jinja, chat_template.json and tokenizer_config.json "
      "(where transformers reads a tokenizer's chat template); name one with --chat-template chatml|llama3",
      dir.empty() ? "." : dir));
}

std::string loss_mask_prefix(const std::string& prefix) { return prefix + "_mask"; }

ChatRenderer::ChatRenderer(const Tokenizer& tokenizer, ChatTemplate chat_template)
    : tokenizer_(tokenizer), template_(chat_template) {
  if (chat_template == ChatTemplate::chatml)
    special_text_ = {"<|im_start|>", "<|im_end|>"};
  else if (chat_template == ChatTemplate::llama3)
    special_text_ = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  else
    throw DataError("ChatRenderer: resolve --chat-template auto first");
  for (const std::string& s : special_text_) {
    std::vector<int32_t> ids;
    tokenizer_.encode(s, ids);
    if (ids.size() != 1)
      throw DataError(
          fmt::format("the {} chat template needs the special token {}, which this {} tokenizer does not "
                      "have as one token (it gives {} ids)",
                      name_of(chat_template), s, name_of(tokenizer.kind()), ids.size()));
    special_id_.push_back(ids[0]);
  }
}

namespace {

std::vector<Piece> pieces_of(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::vector<Piece> p;
  if (t == ChatTemplate::chatml) {
    for (const ChatMessage& m : messages) {
      const uint8_t learn = m.role == "assistant";
      p.push_back({.special = 0});
      p.push_back({.header = m.role + "\n", .content = m.content, .mask = learn});
      p.push_back({.special = 1, .mask = learn});
      p.push_back({.header = "\n"});
    }
  } else {
    p.push_back({.special = 0});
    for (const ChatMessage& m : messages) {
      const uint8_t learn = m.role == "assistant";
      p.push_back({.special = 1});
      p.push_back({.header = m.role});
      p.push_back({.special = 2});
      p.push_back({.header = "\n\n", .content = trim(m.content), .mask = learn});
      p.push_back({.special = 3, .mask = learn});
    }
  }
  return p;
}

std::string joined(const std::vector<Piece>& pieces, const std::vector<std::string>& special_text) {
  std::string out;
  for (const Piece& piece : pieces)
    out += piece.special >= 0 ? special_text[piece.special] : piece.header + piece.content;
  return out;
}

}  // namespace

std::string ChatRenderer::text(const std::vector<ChatMessage>& messages) const {
  return joined(pieces_of(template_, messages), special_text_);
}

void ChatRenderer::render(const std::vector<ChatMessage>& messages, std::vector<int32_t>& tokens,
                          std::vector<uint8_t>& mask, EncodeCache* cache) const {
  for (size_t i = 0; i < messages.size(); ++i)
    for (const std::string& s : special_text_)
      if (messages[i].content.find(s) != std::string::npos)
        throw DataError(
            fmt::format("messages[{}]'s content holds the special token {}, which would open or close a "
                        "turn of the {} template",
                        i, s, name_of(template_)));
  const std::vector<Piece> pieces = pieces_of(template_, messages);
  const std::string rendered = joined(pieces, special_text_);
  // Tokenized whole (the ids apply_chat_template gives), then lined up with the pieces: each special token is its id,
  // and the ids between two of them are the ordinary text's.
  std::vector<int32_t> ids, header_ids;
  tokenizer_.encode_with(rendered, ids, cache);
  const auto misaligned = [&] {
    return DataError(
        fmt::format("the {} tokenizer does not give the {} template's special tokens where the rendered "
                    "text has them (is it adding its own special tokens?)",
                    name_of(tokenizer_.kind()), name_of(template_)));
  };
  size_t pos = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    if (piece.special >= 0) {
      if (pos >= ids.size() || ids[pos] != special_id_[piece.special]) throw misaligned();
      tokens.push_back(ids[pos++]);
      mask.push_back(piece.mask);
      continue;
    }
    size_t end = ids.size();
    if (k + 1 < pieces.size()) {
      const int32_t next = special_id_[pieces[k + 1].special];
      end = static_cast<size_t>(std::find(ids.begin() + static_cast<ptrdiff_t>(pos), ids.end(), next) - ids.begin());
    }
    // The header's tokens are those the segment shares with the header tokenized alone.
    header_ids.clear();
    tokenizer_.encode_with(piece.header, header_ids, cache);
    size_t shared = 0;
    while (shared < header_ids.size() && pos + shared < end && ids[pos + shared] == header_ids[shared]) ++shared;
    const uint8_t content_mask = piece.content.empty() ? 0 : piece.mask;
    for (size_t i = pos; i < end; ++i) {
      tokens.push_back(ids[i]);
      mask.push_back(i < pos + shared ? 0 : content_mask);
    }
    pos = end;
  }
  if (pos != ids.size()) throw misaligned();
}

}  // namespace mt
