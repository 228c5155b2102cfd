// enum_names.h: an enum whose values have names (a config key's choices, a tokenizer kind): EnumNames<E> lists
// them in the order of the values, `planned` the names known but not implemented yet; name_of and parse_choice
// go between the two. Each enum's table stands beside the enum.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace mt {

template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = requires {
  EnumNames<E>::names;
};

// The name of a value, as a file spells it.
template <NamedEnum E>
std::string_view name_of(E e) {
  return EnumNames<E>::names.at(static_cast<size_t>(e));
}
// The value a name spells, if any.
template <NamedEnum E>
std::optional<E> parse_choice(std::string_view name) {
  for (size_t i = 0; i < EnumNames<E>::names.size(); ++i)
    if (name == EnumNames<E>::names[i]) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace mt
