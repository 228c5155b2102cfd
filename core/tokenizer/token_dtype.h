// token_dtype.h: the dtypes token ids are stored in: Megatron's codes in the .idx header (core/data/indexed_dataset.h);
// a tokenizer names the smallest that holds its ids.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mt {

// Megatron's dtype codes in the .idx header.
enum class TokenDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };
size_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);  // "u8", "i16", ..., as numpy would say it without the width words

}  // namespace mt
