// token_dtype.cpp: sizes and names of the token dtypes (token_dtype.h).
#include "core/tokenizer/token_dtype.h"

#include <fmt/format.h>

#include "core/io/file_error.h"

namespace mt {

size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::u8:
    case TokenDType::i8:
      return 1;
    case TokenDType::i16:
    case TokenDType::u16:
      return 2;
    case TokenDType::i32:
    case TokenDType::f32:
      return 4;
    case TokenDType::i64:
    case TokenDType::f64:
      return 8;
  }
  throw DataError(fmt::format("unknown token dtype code {}", static_cast<int>(t)));
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::u8:
      return "uint8";
    case TokenDType::i8:
      return "int8";
    case TokenDType::i16:
      return "int16";
    case TokenDType::i32:
      return "int32";
    case TokenDType::i64:
      return "int64";
    case TokenDType::f64:
      return "float64";
    case TokenDType::f32:
      return "float32";
    case TokenDType::u16:
      return "uint16";
  }
  return "unknown";
}

}  // namespace mt
