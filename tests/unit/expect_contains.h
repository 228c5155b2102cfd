// expect_contains.h: EXPECT_CONTAINS(text, part), a substring check that prints the whole text on failure
// (the test targets link GTest::gtest only, without gmock's HasSubstr).
#pragma once
#include <string>

#include <gtest/gtest.h>

namespace mt::testing_util {

inline ::testing::AssertionResult contains(const char* text_expr, const char*, const std::string& text,
                                           const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << text_expr << " is\n  " << text << "\nwhich does not contain\n  " << part;
}

}  // namespace mt::testing_util

#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::mt::testing_util::contains, text, part)
