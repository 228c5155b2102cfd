// post_processor.cpp: reads tokenizer.json's post_processor into the ids it adds (see post_processor.h).
#include "core/tokenizer/post_processor.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/io/file_error.h"  // DataError

namespace mt {

using nlohmann::json;

namespace {

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

// One TemplateProcessing: its `single` template is a list of {"SpecialToken": {"id": name}} and
// {"Sequence": {"id": "A"}} pieces; a special token's ids come from the processor's special_tokens map.
void add_template(const json& j, const std::string& where, SpecialTemplate& out) {
  const std::string at = where + ": post_processor TemplateProcessing";
  const json& single = j.value("single", json());
  const json& specials = j.value("special_tokens", json::object());
  if (!single.is_array()) throw DataError(fmt::format("{}: 'single' is not a list of pieces", at));
  SpecialTemplate t;
  int sequences = 0;
  for (const json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id = piece["Sequence"].value("id", "?");
      if (id != "A") throw DataError(fmt::format("{}: the single template names sequence '{}' (only A)", at, id));
      ++sequences;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id"))
      throw DataError(fmt::format("{}: a template piece is neither SpecialToken nor Sequence: {}", at, piece.dump()));
    const std::string name = piece["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
      throw DataError(fmt::format("{}: special token '{}' is not in special_tokens", at, name));
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        throw DataError(fmt::format("{}: special token '{}' has an invalid id {}", at, name, id.dump()));
      (sequences == 0 ? t.before : t.after).push_back(id.get<int32_t>());
    }
  }
  if (sequences != 1)
    throw DataError(fmt::format("{}: the single template holds $A {} times (expected once)", at, sequences));
  // A later processor wraps what the earlier ones made.
  out.before.insert(out.before.begin(), t.before.begin(), t.before.end());
  out.after.insert(out.after.end(), t.after.begin(), t.after.end());
}

void add_processor(const json& j, const std::string& where, SpecialTemplate& out) {
  const std::string t = type_of(j);
  if (t == "ByteLevel") return;  // trims offsets only
  if (t == "TemplateProcessing") return add_template(j, where, out);
  if (t == "Sequence") {
    for (const json& p : j.value("processors", json::array())) add_processor(p, where, out);
    return;
  }
  throw DataError(fmt::format(
      "{}: post_processor '{}' is not supported (TemplateProcessing, ByteLevel, or a Sequence of them)", where, t));
}

}  // namespace

SpecialTemplate load_post_processor(const json& j, const std::string& where) {
  SpecialTemplate out;
  if (!j.is_null()) add_processor(j, where, out);
  return out;
}

}  // namespace mt
