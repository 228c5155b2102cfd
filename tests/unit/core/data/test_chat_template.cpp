// test_chat_template.cpp: supervised fine-tuning data: chat lines, the ChatML and Llama 3 templates, the loss mask,
// `data prepare --format chat` and the check that a token dataset and its mask go together.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/tokenizer/chat_template.h"
#include "core/data/loss_mask.h"
#include "core/data/prepare.h"
#include "tests/unit/core/data/tokenizer_fixtures.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

using testing_util::fixture;
using testing_util::hf_file;
using testing_util::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The llama3 fixture (byte-level BPE) with its reserved specials 2 and 3 renamed: to <|im_start|> / <|im_end|>
// (chatml) or <|start_header_id|> / <|end_header_id|> (llama3; <|begin_of_text|> is 0, <|eot_id|> 4). Written to
// DIR/tokenizer.json; no post-processor, as apply_chat_template tokenizes without one.
std::string chat_tokenizer(const TempDir& dir, ChatTemplate t) {
  std::ifstream in(fixture("llama3-tokenizer.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  const bool chatml = t == ChatTemplate::chatml;
  const std::string names[2] = {chatml ? "<|im_start|>" : "<|start_header_id|>",
                                chatml ? "<|im_end|>" : "<|end_header_id|>"};
  for (int k = 0; k < 2; ++k) {
    nlohmann::json& added = j["added_tokens"][2 + k];
    j["model"]["vocab"].erase(added["content"].get<std::string>());
    added["content"] = names[k];
    j["model"]["vocab"][names[k]] = 2 + k;
  }
  const std::string path = dir / "tokenizer.json";
  write(path, j.dump());
  return path;
}

std::vector<int32_t> ids(const Tokenizer& t, const std::string& text) {
  std::vector<int32_t> out;
  t.encode(text, out);
  return out;
}

// Appends `add` to `tokens`, and `add.size()` copies of `m` to `mask`.
void put(std::vector<int32_t>& tokens, std::vector<uint8_t>& mask, const std::vector<int32_t>& add, uint8_t m) {
  tokens.insert(tokens.end(), add.begin(), add.end());
  mask.insert(mask.end(), add.size(), m);
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi there"}, {"assistant", "Hello, friend."}};

TEST(ChatLine, ReadsMessagesOrPromptAndResponse) {
  auto m = parse_chat_line(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "name": "x"}]})");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[1].content, "b");
  m = parse_chat_line(R"({"prompt": "q\n", "response": "r", "id": 7})");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[0].content, "q\n");
  EXPECT_EQ(m[1].role, "assistant");
  EXPECT_EQ(m[1].content, "r");
}

TEST(ChatLine, RefusesWhatIsNotAConversationSayingWhy) {
  const auto refused = [](const std::string& line) { return error_of([&] { parse_chat_line(line); }); };
  EXPECT_CONTAINS(refused(R"({"messages": [)"), "invalid JSON line");
  EXPECT_CONTAINS(refused(R"([1, 2])"), "expected a JSON object");
  EXPECT_CONTAINS(refused(R"({"text": "x"})"), "neither \"messages\" nor \"prompt\"");
  EXPECT_CONTAINS(refused(R"({"prompt": "x"})"), "has no \"response\"");
  EXPECT_CONTAINS(refused(R"({"prompt": "x", "response": 3})"), "\"response\" is not a string");
  EXPECT_CONTAINS(refused(R"({"messages": [], "prompt": "x", "response": "y"})"), "both");
  EXPECT_CONTAINS(refused(R"({"messages": {}})"), "\"messages\" is not a list");
  EXPECT_CONTAINS(refused(R"({"messages": []})"), "\"messages\" is empty");
  EXPECT_CONTAINS(refused(R"({"messages": ["hi"]})"), "messages[0] is not an object");
  EXPECT_CONTAINS(refused(R"({"messages": [{"role": "tool", "content": "x"}]})"), "unknown role \"tool\"");
  EXPECT_CONTAINS(refused(R"({"messages": [{"role": "assistant", "content": null}]})"),
                  "messages[0]'s \"content\" is not a string");
  EXPECT_CONTAINS(refused(R"({"messages": [{"content": "x"}]})"), "messages[0] has no \"role\"");
  EXPECT_CONTAINS(refused(R"({"messages": [{"role": "user", "content": "x"}]})"), "no assistant message");
}

TEST(ChatTemplate, ChatMLRendersAsHuggingFaceAndMasksTheAssistantsContentAndEnd) {
  TempDir dir;
  const auto tok = make_tokenizer(hf_file(chat_tokenizer(dir, ChatTemplate::chatml)));
  const ChatRenderer r(*tok, ChatTemplate::chatml);
  EXPECT_EQ(r.text(kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello, friend.<|im_end|>\n");
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  r.render(kConversation, tokens, mask, nullptr);
  EXPECT_EQ(tokens, ids(*tok, r.text(kConversation)));  // the whole text tokenized: apply_chat_template's ids

  std::vector<int32_t> want;
  std::vector<uint8_t> want_mask;
  const int32_t start = 2, end = 3;
  put(want, want_mask, {start}, 0);
  put(want, want_mask, ids(*tok, "system\nBe brief."), 0);
  put(want, want_mask, {end}, 0);
  put(want, want_mask, ids(*tok, "\n"), 0);
  put(want, want_mask, {start}, 0);
  put(want, want_mask, ids(*tok, "user\nHi there"), 0);
  put(want, want_mask, {end}, 0);
  put(want, want_mask, ids(*tok, "\n"), 0);
  put(want, want_mask, {start}, 0);
  put(want, want_mask, ids(*tok, "assistant\n"), 0);
  put(want, want_mask, ids(*tok, "Hello, friend."), 1);
  put(want, want_mask, {end}, 1);
  put(want, want_mask, ids(*tok, "\n"), 0);
  EXPECT_EQ(tokens, want);
  EXPECT_EQ(mask, want_mask);
}

TEST(ChatTemplate, Llama3RendersAsHuggingFaceTrimsContentAndMasksTheAssistantsContentAndEnd) {
  TempDir dir;
  const auto tok = make_tokenizer(hf_file(chat_tokenizer(dir, ChatTemplate::llama3)));
  const ChatRenderer r(*tok, ChatTemplate::llama3);
  const std::vector<ChatMessage> chat = {{"user", "  Hi there\n"}, {"assistant", "\tHello, friend. "}};
  EXPECT_EQ(r.text(chat),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello, friend.<|eot_id|>");
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  r.render(chat, tokens, mask, nullptr);
  EXPECT_EQ(tokens, ids(*tok, r.text(chat)));

  std::vector<int32_t> want;
  std::vector<uint8_t> want_mask;
  const int32_t bos = 0, sh = 2, eh = 3, eot = 4;
  put(want, want_mask, {bos, sh}, 0);
  put(want, want_mask, ids(*tok, "user"), 0);
  put(want, want_mask, {eh}, 0);
  put(want, want_mask, ids(*tok, "\n\nHi there"), 0);
  put(want, want_mask, {eot, sh}, 0);
  put(want, want_mask, ids(*tok, "assistant"), 0);
  put(want, want_mask, {eh}, 0);
  put(want, want_mask, ids(*tok, "\n\n"), 0);
  put(want, want_mask, ids(*tok, "Hello, friend."), 1);
  put(want, want_mask, {eot}, 1);
  EXPECT_EQ(tokens, want);
  EXPECT_EQ(mask, want_mask);
}

TEST(ChatTemplate, AnEmptyAssistantMessageLearnsOnlyItsEndToken) {
  TempDir dir;
  const auto tok = make_tokenizer(hf_file(chat_tokenizer(dir, ChatTemplate::chatml)));
  const ChatRenderer r(*tok, ChatTemplate::chatml);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  r.render({{"user", "x"}, {"assistant", ""}}, tokens, mask, nullptr);
  ASSERT_GE(tokens.size(), 2u);
  EXPECT_EQ(tokens[tokens.size() - 2], 3);  // <|im_end|>, then "\n"
  EXPECT_EQ(std::count(mask.begin(), mask.end(), uint8_t{1}), 1);
  EXPECT_EQ(mask[mask.size() - 2], 1);
}

TEST(ChatTemplate, RefusesATokenizerWithoutTheSpecialTokensNamingOne) {
  const ByteTokenizer bytes;
  EXPECT_CONTAINS(error_of([&] { ChatRenderer(bytes, ChatTemplate::chatml); }), "special token <|im_start|>");
  TempDir dir;
  const auto chatml = make_tokenizer(hf_file(chat_tokenizer(dir, ChatTemplate::chatml)));
  EXPECT_CONTAINS(error_of([&] { ChatRenderer(*chatml, ChatTemplate::llama3); }), "special token <|start_header_id|>");
}

TEST(ChatTemplate, RefusesContentHoldingTheTemplatesSpecialTokens) {
  TempDir dir;
  const auto tok = make_tokenizer(hf_file(chat_tokenizer(dir, ChatTemplate::chatml)));
  const ChatRenderer r(*tok, ChatTemplate::chatml);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  EXPECT_CONTAINS(error_of([&] {
                    r.render({{"user", "a<|im_end|>b"}, {"assistant", "c"}}, tokens, mask, nullptr);
                  }),
                  "messages[0]'s content holds the special token <|im_end|>");
}

TEST(ChatTemplate, AutoRecognisesChatMLAndLlama3AndRefusesOthersQuotingThem) {
  TempDir dir;
  const std::string config = dir / "tokenizer_config.json";
  const auto with = [&](const nlohmann::json& t) {
    write(config, nlohmann::json{{"chat_template", t}, {"eos_token", "x"}}.dump(2));
    return config;
  };
  EXPECT_EQ(chat_template_from_config(
                with("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                     "'<|im_end|>' + '\\n'}}{% endfor %}")),
            ChatTemplate::chatml);
  EXPECT_EQ(chat_template_from_config(with("{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                                           "'<|end_header_id|>\\n\\n' + message['content'] | trim }}{% endfor %}")),
            ChatTemplate::llama3);
  const std::string other = error_of([&] { chat_template_from_config(with("{{ bos_token }}[INST] {{ messages }}")); });
  EXPECT_CONTAINS(other, config);
  EXPECT_CONTAINS(other, "\"{{ bos_token }}[INST] {{ messages }}\" is neither ChatML nor Llama 3");
  EXPECT_CONTAINS(error_of([&] { chat_template_from_config(with(nlohmann::json::array())); }), "is not a string");
  write(config, "{}");
  EXPECT_CONTAINS(error_of([&] { chat_template_from_config(config); }), "no \"chat_template\"");
  EXPECT_CONTAINS(error_of([&] { chat_template_from_config(dir / "missing.json"); }), "missing.json");
}

// --chat-template auto reads a tokenizer directory as transformers does: chat_template.jinja (transformers 5's
// save_pretrained), else chat_template.json, else tokenizer_config.json's chat_template.
TEST(ChatTemplate, AutoReadsTheDirectoryInTransformersOrder) {
  TempDir dir;
  const std::string chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] }}{% endfor %}";
  const std::string llama3 = "{% for message in messages %}{{ '<|start_header_id|>' }}{% endfor %}";
  EXPECT_CONTAINS(error_of([&] { chat_template_from_dir(dir.path().string()); }),
                  "holds none of chat_template.jinja, chat_template.json and tokenizer_config.json");
  write(dir / "tokenizer_config.json", nlohmann::json{{"eos_token", "x"}}.dump());  // no template: save_pretrained 5
  EXPECT_CONTAINS(error_of([&] { chat_template_from_dir(dir.path().string()); }), "no \"chat_template\"");
  write(dir / "chat_template.json", nlohmann::json{{"chat_template", llama3}}.dump());
  EXPECT_EQ(chat_template_from_dir(dir.path().string()), ChatTemplate::llama3);
  write(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", chatml}}.dump());
  EXPECT_EQ(chat_template_from_dir(dir.path().string()), ChatTemplate::llama3);  // chat_template.json comes first
  write(dir / "chat_template.jinja", chatml);
  EXPECT_EQ(chat_template_from_dir(dir.path().string()), ChatTemplate::chatml);  // and chat_template.jinja before it
  write(dir / "chat_template.jinja", "{{ bos_token }}[INST]");
  const std::string other = error_of([&] { chat_template_from_dir(dir.path().string()); });
  EXPECT_CONTAINS(other, dir / "chat_template.jinja");
  EXPECT_CONTAINS(other, "is neither ChatML nor Llama 3");
  std::filesystem::remove(dir / "chat_template.jinja");
  write(dir / "chat_template.json", "{\"chat_template\": ");
  EXPECT_CONTAINS(error_of([&] { chat_template_from_dir(dir.path().string()); }), dir / "chat_template.json");
}

PrepareOptions chat_options(const TempDir& dir, ChatTemplate t, const std::string& jsonl) {
  PrepareOptions o;
  o.tokenizer = hf_file(chat_tokenizer(dir, t));
  o.format = DataFormat::chat;
  o.chat_template = ChatTemplate::automatic;
  write(dir / "tokenizer_config.json",
        nlohmann::json{{"chat_template", t == ChatTemplate::chatml ? "<|im_start|>..." : "<|start_header_id|>..."}}
            .dump());
  write(dir / "chat.jsonl", jsonl);
  o.inputs = {dir / "chat.jsonl"};
  o.output_prefix = dir / "out/sft";
  return o;
}

TEST(PrepareChat, WritesTokensAndAMatchingMaskOneDocumentPerLine) {
  TempDir dir;
  const std::string jsonl =
      "{\"prompt\": \"What is 2+2?\", \"response\": \"4\"}\n"
      "\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}, "
      "{\"role\": \"assistant\", \"content\": \"A1\"}, {\"role\": \"user\", \"content\": \"U2\"}, "
      "{\"role\": \"assistant\", \"content\": \"A2\"}]}\n";
  for (ChatTemplate t : {ChatTemplate::chatml, ChatTemplate::llama3}) {
    SCOPED_TRACE(std::string(name_of(t)));
    PrepareOptions o = chat_options(dir, t, jsonl);
    o.overwrite = true;
    const PrepareStats s = prepare_dataset(o);
    EXPECT_EQ(s.chat_template, t);
    EXPECT_EQ(s.documents, 2);
    const TokensWithLossMask d = open_tokens_with_loss_mask(o.output_prefix);
    EXPECT_EQ(d.mask->dtype(), TokenDType::u8);
    ASSERT_EQ(d.tokens->num_documents(), 2);
    EXPECT_EQ(d.tokens->num_tokens(), s.tokens);

    // Each document is what the renderer gives its line: no end-of-document token after it.
    const auto tok = make_tokenizer(o.tokenizer);
    const ChatRenderer r(*tok, t);
    std::vector<int32_t> want;
    std::vector<uint8_t> want_mask;
    r.render({{"user", "What is 2+2?"}, {"assistant", "4"}}, want, want_mask, nullptr);
    std::vector<int32_t> got(static_cast<size_t>(d.tokens->sequence_lengths()[0])), got_mask(got.size());
    d.tokens->read(0, 0, got);
    d.mask->read(0, 0, got_mask);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got_mask, std::vector<int32_t>(want_mask.begin(), want_mask.end()));
    EXPECT_NE(got.back(), tok->eod());
    int64_t learned = 0;
    for (int64_t q = 0; q < d.mask->num_sequences(); ++q) {
      std::vector<int32_t> m(static_cast<size_t>(d.mask->sequence_lengths()[q]));
      d.mask->read(q, 0, m);
      learned += std::count(m.begin(), m.end(), 1);
    }
    EXPECT_EQ(learned, s.loss_tokens);
  }
}

TEST(PrepareChat, ABadLineIsRefusedWithItsFileAndLineAndNothingIsWritten) {
  TempDir dir;
  const std::string good = "{\"prompt\": \"p\", \"response\": \"r\"}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"p\"", "invalid JSON line"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"p\"}]}", "no assistant message"},
      {"{\"messages\": [{\"role\": \"bot\", \"content\": \"p\"}]}", "unknown role \"bot\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "is not a string"},
      {"{\"text\": \"p\"}", "neither \"messages\" nor \"prompt\""},
      // A number beyond double's range is the JSON library's out_of_range, not a parse error: named the same way.
      {"{\"prompt\": \"p\", \"response\": \"r\", \"score\": 1e400}", "invalid JSON line"},
  };
  for (const auto& [line, why] : cases) {
    SCOPED_TRACE(line);
    const PrepareOptions o = chat_options(dir, ChatTemplate::chatml, good + "\n" + line + "\n");
    const std::string e = error_of([&] { prepare_dataset(o); });
    EXPECT_CONTAINS(e, o.inputs[0] + ":3: ");
    EXPECT_CONTAINS(e, why);
    EXPECT_FALSE(std::filesystem::exists(o.output_prefix + ".bin"));
    EXPECT_FALSE(std::filesystem::exists(loss_mask_prefix(o.output_prefix) + ".idx"));
  }
}

TEST(PrepareChat, RefusesTextInputsATemplateItCannotRenderAndAnExistingMask) {
  TempDir dir;
  PrepareOptions o = chat_options(dir, ChatTemplate::chatml, "{\"prompt\": \"p\", \"response\": \"r\"}\n");
  PrepareOptions text_input = o;
  write(dir / "chat.txt", "hello\n");
  text_input.inputs = {dir / "chat.txt"};
  EXPECT_CONTAINS(error_of([&] { prepare_dataset(text_input); }), "--format chat reads JSON lines");
  PrepareOptions bytes = o;
  bytes.tokenizer = TokenizerOptions{};
  EXPECT_CONTAINS(error_of([&] { prepare_dataset(bytes); }),
                  "--chat-template auto reads chat_template.jinja, chat_template.json or tokenizer_config.json");
  bytes.chat_template = ChatTemplate::llama3;
  EXPECT_CONTAINS(error_of([&] { prepare_dataset(bytes); }), "special token <|begin_of_text|>");
  write(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  EXPECT_CONTAINS(error_of([&] { prepare_dataset(o); }), "is neither ChatML nor Llama 3");
  o.chat_template = ChatTemplate::chatml;
  std::filesystem::create_directories(dir / "out");
  write(loss_mask_prefix(o.output_prefix) + ".bin", "");
  EXPECT_CONTAINS(error_of([&] { prepare_dataset(o); }), "sft_mask.bin already exists");
}

TEST(LossMask, RefusesAMaskThatDoesNotMatchTheTokensNamingBoth) {
  TempDir dir;
  const auto make = [&](const std::string& name, TokenDType dtype, const std::vector<std::vector<int32_t>>& docs) {
    IndexedDatasetWriter w(dir / name, dtype);
    for (const auto& d : docs) w.add_document(std::span<const int32_t>(d));
    w.finish();
    return dir / name;
  };
  const std::string tokens = make("t", TokenDType::u16, {{5, 6, 7}, {8, 9}});
  make("t_mask", TokenDType::u8, {{0, 1, 1}, {0, 1}});
  EXPECT_NO_THROW(open_tokens_with_loss_mask(tokens));

  const IndexedDataset t(tokens);
  const auto refused = [&](const std::string& mask_prefix) {
    const IndexedDataset m(mask_prefix);
    const std::string e = error_of([&] { check_loss_mask_matches(t, m); });
    EXPECT_CONTAINS(e, mask_prefix + ".bin/.idx");
    EXPECT_CONTAINS(e, tokens + ".bin/.idx");
    return e;
  };
  EXPECT_CONTAINS(refused(make("fewer", TokenDType::u8, {{0, 1, 1}})), "1 documents vs 2");
  EXPECT_CONTAINS(refused(make("shorter", TokenDType::u8, {{0, 1, 1}, {1}})),
                  "sequence 1 has 1 mask values for 2 tokens");
  EXPECT_CONTAINS(refused(make("two", TokenDType::u8, {{0, 1, 2}, {0, 1}})), "sequence 0, token 2 has mask value 2");
}

}  // namespace
}  // namespace mt
