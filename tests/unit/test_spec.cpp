// The shared spec grammar (common/spec.hpp): KIND[:ARGS][;KEY=VALUE]... and its one error style.
#include "common/spec.hpp"

#include <gtest/gtest.h>

#include <string>

using lbbsp::spec::Spec;

namespace {

std::string message_of(const std::string& text) {
  try {
    Spec s(text, "--thing", "valid: a, b:N");
    s.integer(s.args(), "N");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Spec, SplitsKindArgsAndOptions) {
  Spec s("trace:a,b;scale=2;seed=7", "--straggle", "");
  EXPECT_EQ(s.kind(), "trace");
  EXPECT_TRUE(s.has_args());
  EXPECT_EQ(s.args(), "a,b");
  ASSERT_EQ(s.args_list().size(), 2u);
  EXPECT_EQ(s.args_list()[1], "b");
  ASSERT_EQ(s.options().size(), 2u);
  EXPECT_EQ(s.options()[0].key, "scale");
  EXPECT_EQ(s.options()[1].value, "7");
}

TEST(Spec, ArgsKeepInnerColonsAndEmptyFields) {
  Spec s("lbbsp-cpu:narx:hidden=8", "balancer", "");
  EXPECT_EQ(s.kind(), "lbbsp-cpu");
  EXPECT_EQ(s.args(), "narx:hidden=8");
  Spec bare("bsp", "balancer", "");
  EXPECT_FALSE(bare.has_args());
  EXPECT_TRUE(bare.args_list().empty());
  Spec empty_args("static:", "--straggle", "");
  EXPECT_TRUE(empty_args.has_args());
  EXPECT_TRUE(empty_args.args_list().empty());
  EXPECT_EQ(lbbsp::spec::split("a,,b", ',').size(), 3u);
}

TEST(Spec, OneErrorStyleNamesOptionSpecAndHelp) {
  EXPECT_EQ(message_of("b:x"), "--thing: 'x' is not an integer (in N) (in 'b:x'; valid: a, b:N)");
  EXPECT_EQ(message_of("b:3;scale"),
            "--thing: option 'scale' needs KEY=VALUE (in 'b:3;scale'; valid: a, b:N)");
  EXPECT_EQ(message_of("b:42"), "");
}

TEST(Spec, NumbersAreStrict) {
  Spec s("k", "w", "");
  EXPECT_DOUBLE_EQ(s.number("0.25", "f"), 0.25);
  EXPECT_DOUBLE_EQ(s.number("+1e-3", "f"), 1e-3);
  EXPECT_EQ(s.integer("-12", "i"), -12);
  EXPECT_THROW(s.number("1x", "f"), std::invalid_argument);
  EXPECT_THROW(s.number("", "f"), std::invalid_argument);
  EXPECT_THROW(s.number("inf", "f"), std::invalid_argument);
  EXPECT_THROW(s.integer("1.5", "i"), std::invalid_argument);
  EXPECT_THROW(s.integer("99999999999999999999", "i"), std::invalid_argument);
}

TEST(Spec, NoArgsAndNoOptionsChecks) {
  EXPECT_THROW(Spec("bsp:1", "balancer", "").expect_no_args(), std::invalid_argument);
  EXPECT_THROW(Spec("bsp;x=1", "balancer", "").expect_no_options(), std::invalid_argument);
  EXPECT_NO_THROW(Spec("bsp", "balancer", "").expect_no_args());
}
