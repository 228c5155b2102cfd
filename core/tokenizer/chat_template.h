// chat_template.h: supervised fine-tuning data: a chat JSON line -> its messages, rendered by a named chat template
// (ChatML, Llama 3) into token ids and a per-token loss mask, as Hugging Face's apply_chat_template renders them.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/enum_names.h"
#include "core/tokenizer/tokenizer.h"

namespace mt {

// `data prepare --format`: text (one document per paragraph or JSON `text`) or chat (messages -> tokens + mask).
enum class DataFormat { text, chat };
template <>
struct EnumNames<DataFormat> {
  static constexpr std::array names{"text", "chat"};
  static constexpr std::array<const char*, 0> planned{};
};

// `--chat-template`: a template by name, or auto (recognised from the tokenizer directory's tokenizer_config.json).
enum class ChatTemplate { chatml, llama3, automatic };
template <>
struct EnumNames<ChatTemplate> {
  static constexpr std::array names{"chatml", "llama3", "auto"};
  static constexpr std::array<const char*, 0> planned{};
};

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

// The messages of one JSON line: either {"messages": [{"role": R, "content": C}, ...]} (other members of a message
// are ignored) or {"prompt": P, "response": R} (a user turn, then an assistant turn). Throws DataError (without
// FILE:LINE: the caller adds it) for malformed JSON, neither or both forms, an empty list, a role other than
// system / user / assistant, a role or content that is not a string, or no assistant turn (nothing to learn).
std::vector<ChatMessage> parse_chat_line(std::string_view line);

// The template that the `chat_template` string of a JSON file (tokenizer_config.json, chat_template.json) is: ChatML
// when it holds "<|im_start|>", Llama 3 when it holds "<|start_header_id|>". DataError naming the file for a missing
// file or member, a template that is not a string (a list of named templates), or any other template (quoting its
// start).
ChatTemplate chat_template_from_config(const std::string& tokenizer_config_path);
// --chat-template auto: the template of a tokenizer directory, read where transformers reads it, in its order:
// chat_template.jinja (the template's text: what transformers 5's save_pretrained writes), else chat_template.json
// (an object with the `chat_template` string), else tokenizer_config.json's `chat_template`. Recognised as
// chat_template_from_config does; DataError naming the file, or the directory when it holds none of the three.
ChatTemplate chat_template_from_dir(const std::string& dir);

// The loss mask's dataset beside the token dataset PREFIX: PREFIX_mask (.bin / .idx, u8, 0 or 1 per token).
std::string loss_mask_prefix(const std::string& prefix);

// Renders conversations with one template (chatml or llama3). The text is the one apply_chat_template gives
// (add_generation_prompt=False):
//   ChatML:  per message "<|im_start|>" ROLE "\n" CONTENT "<|im_end|>" "\n"
//   Llama 3: "<|begin_of_text|>", then per message "<|start_header_id|>" ROLE "<|end_header_id|>" "\n\n"
//            trim(CONTENT) "<|eot_id|>" (Jinja's trim: leading and trailing whitespace removed)
// and it is tokenized whole, as apply_chat_template(tokenize=True) does: the tokenizer must be made without its
// post-processor's specials (add_special_tokens=false), and must map each of the template's special tokens to a
// single id (DataError naming the token otherwise). No end-of-document token is appended: the template's end tokens
// end the document. Loss mask: 1 on the tokens of an assistant message's content and on its end token
// (<|im_end|> / <|eot_id|>), 0 elsewhere (system and user messages, role headers, the "\n" after <|im_end|>, the
// <|begin_of_text|>). Where the tokenizer merges a header's last bytes with the content's first ones into one token,
// that token counts as content.
class ChatRenderer {
 public:
  ChatRenderer(const Tokenizer& tokenizer, ChatTemplate chat_template);
  // Appends the conversation's tokens and mask (same length). A content holding one of the template's special
  // tokens is refused (DataError naming it): it would open or close a turn.
  void render(const std::vector<ChatMessage>& messages, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask,
              EncodeCache* cache) const;
  ChatTemplate chat_template() const { return template_; }
  // The rendered text (what apply_chat_template(tokenize=False) returns).
  std::string text(const std::vector<ChatMessage>& messages) const;

 private:
  const Tokenizer& tokenizer_;
  ChatTemplate template_;
  std::vector<std::string> special_text_;  // chatml: im_start, im_end; llama3: begin, start_header, end_header, eot
  std::vector<int32_t> special_id_;
};

}  // namespace mt
