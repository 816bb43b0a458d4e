// Chat templates come from a model hub and run unread: each way a template could crash the
// engine, hang it or exhaust its memory is an error naming the template, line and column and the
// limit (jinja/limits.h), and integer arithmetic is exact or an error, never wrapped. (The hub
// templates the other chat tests render pass inside the limits.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "jinja/limits.h"
#include "jinja/template.h"

namespace engine::jinja {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string RenderWithinLimits(const std::string& source) {
  StatusOr<Template> t = Template::Parse(source, "t.jinja");
  if (!t.ok()) return "ERROR " + t.status().message();
  StatusOr<RenderOutput> out = t->Render({});
  if (!out.ok()) return "ERROR " + out.status().message();
  return out->text;
}

std::string Repeated(const std::string& s, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += s;
  return out;
}

TEST(JinjaLimitsTest, AMacroThatCallsItselfWithoutEndIsAnError) {
  EXPECT_EQ(RenderWithinLimits("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "ERROR t.jinja:1:21: calls nested deeper than 256 (a macro that calls itself "
            "without end?)");
  // Recursion that ends is fine.
  EXPECT_EQ(RenderWithinLimits(
                "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                "{{ f(5) }}"),
            "54321");
}

TEST(JinjaLimitsTest, LoopsStopAtTheWorkBudget) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(
      RenderWithinLimits("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                         "{% endfor %}"),
      testing::AllOf(StartsWith("ERROR t.jinja:1:"),
                     HasSubstr("the template ran past 10,000,000 steps")));
  // Filters over big ranges count too.
  EXPECT_THAT(
      RenderWithinLimits("{% for i in range(100000) %}{{ range(100000) | sum }}{% endfor %}"),
      HasSubstr("ran past 10,000,000 steps"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(JinjaLimitsTest, StringsAndListsStopAtTheirSize) {
  EXPECT_EQ(RenderWithinLimits("{{ 'a' * 10**9 }}"),
            "ERROR t.jinja:1:8: the template would build a string of 1,000,000,000 bytes, above "
            "the 67,108,864 a chat template may build");
  EXPECT_THAT(RenderWithinLimits("{{ [1] * 10**9 }}"),
              HasSubstr("would build a list of 1,000,000,000 items, above the 4,194,304"));
  EXPECT_THAT(RenderWithinLimits("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                                 "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}"),
              HasSubstr("would build a string of 134,217,728 bytes"));
  EXPECT_THAT(RenderWithinLimits("{{ {'a': [1, 2]} | tojson(indent=10**9) }}"),
              HasSubstr("would build a string of 1,000,000,000 bytes"));
  EXPECT_THAT(RenderWithinLimits("{{ 'a\nb' | indent(10**9) }}"),
              HasSubstr("would build a string of 1,000,000,000 bytes"));
  // The output itself: many small pieces.
  EXPECT_THAT(RenderWithinLimits("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"),
              HasSubstr("above the 67,108,864 a chat template may build"));
  // Python's json.dumps indents by nothing for a negative indent.
  EXPECT_EQ(RenderWithinLimits("{{ [1] | tojson(indent=-3) }}"), "[\n1\n]");
}

TEST(JinjaLimitsTest, IntegersAreExactOrAnError) {
  EXPECT_EQ(RenderWithinLimits("{{ 9223372036854775807 + 1 }}"),
            "ERROR t.jinja:1:24: integer overflow: 9223372036854775807 + 1 does not fit in 64 bits "
            "(jinja2 computes it exactly; this engine refuses it rather than give a wrong number)");
  EXPECT_THAT(RenderWithinLimits("{{ 10**10**10 }}"),
              HasSubstr("integer overflow: 10000000000 ** 10"));
  EXPECT_THAT(RenderWithinLimits("{{ -9223372036854775807 - 2 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(RenderWithinLimits("{{ 4294967296 * 4294967296 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(RenderWithinLimits("{{ (-9223372036854775807 - 1) // -1 }}"),
              HasSubstr("integer overflow"));
  EXPECT_EQ(
      RenderWithinLimits("{{ 2**62 }} {{ (-2)**63 }} {{ 3**0 }} {{ 1**10**18 }} {{ -7 // 2 }}"),
      "4611686018427387904 -9223372036854775808 1 1 -4");
  EXPECT_THAT(RenderWithinLimits("{{ 99999999999999999999 }}"),
              HasSubstr("number 99999999999999999999 is out of range"));
  // Found by jinja_fuzzer (tests/fixtures/fuzz/jinja_fuzzer/big_integer_attribute): an index
  // after a dot, and one in an attribute path, used to end the engine with out_of_range.
  EXPECT_EQ(RenderWithinLimits("{{ x.99999999999999999999 }}"),
            "ERROR t.jinja:1:6: number 99999999999999999999 is out of range");
  EXPECT_EQ(RenderWithinLimits(
                "{{ ([[1]] | map(attribute='99999999999999999999') | first) is defined }}"),
            "False");
  // range() stops at the last 64-bit integer instead of wrapping.
  EXPECT_EQ(RenderWithinLimits("{{ range(9223372036854775806, 9223372036854775807, 100) | list }}"),
            "[9223372036854775806]");
}

TEST(JinjaLimitsTest, NestingPastTheParserLimitIsAnErrorNotACrash) {
  EXPECT_THAT(
      RenderWithinLimits("{{ " + Repeated("(", 100000) + "1" + Repeated(")", 100000) + " }}"),
      HasSubstr("blocks or expressions nested deeper than 256 levels"));
  EXPECT_THAT(RenderWithinLimits("{{ " + Repeated("[", 100000) + Repeated("]", 100000) + " }}"),
              HasSubstr("nested deeper than 256 levels"));
  EXPECT_THAT(RenderWithinLimits("{{ " + Repeated("not ", 100000) + "1 }}"),
              HasSubstr("nested deeper than 256 levels"));
  EXPECT_THAT(
      RenderWithinLimits(Repeated("{% if true %}", 100000) + Repeated("{% endif %}", 100000)),
      HasSubstr("nested deeper than 256 levels"));
  // What real templates nest stays far inside.
  EXPECT_EQ(RenderWithinLimits(Repeated("{% if true %}", 30) + "x" + Repeated("{% endif %}", 30)),
            "x");
  EXPECT_EQ(RenderWithinLimits("{{ " + Repeated("(", 40) + "1" + Repeated(")", 40) + " }}"), "1");
}

// Chains the parser builds in a loop make trees as deep as their length: they count too.
TEST(JinjaLimitsTest, LongOperatorChainsAreNestingToo) {
  for (const std::string link : {"1 + ", "'a' ~ ", "x or ", "x and ", "2 if x else "}) {
    SCOPED_TRACE(link);
    EXPECT_THAT(RenderWithinLimits("{{ " + Repeated(link, 100000) + "1 }}"),
                HasSubstr("nested deeper than 256 levels"));
  }
  EXPECT_THAT(RenderWithinLimits("{{ x" + Repeated(".a", 100000) + " }}"),
              HasSubstr("nested deeper than 256 levels"));
  EXPECT_THAT(RenderWithinLimits("{{ 'a'" + Repeated(" | upper", 100000) + " }}"),
              HasSubstr("nested deeper than 256 levels"));
  EXPECT_EQ(RenderWithinLimits("{{ " + Repeated("1 + ", 30) + "1 }}"), "31");
}

TEST(JinjaLimitsTest, ValuesBuiltDeeperThanTheLimitAreAnError) {
  EXPECT_THAT(RenderWithinLimits("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                                 "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | length }}"),
              HasSubstr("the template would build a value nested deeper than 256 levels"));
  EXPECT_EQ(RenderWithinLimits("{% set ns = namespace(x=[]) %}{% for i in range(100) %}"
                               "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | length }}"),
            "1");
}

TEST(JinjaLimitsTest, WhatElseBuildsStringsOrIndexesStaysInBounds) {
  // An empty sequence repeated any number of times is empty at once.
  EXPECT_EQ(RenderWithinLimits("[{{ '' * 10**18 }}{{ [] * 10**18 }}]"), "[[]]");
  EXPECT_THAT(RenderWithinLimits("{{ (['x' * 40000000] * 2) | join }}"),
              HasSubstr("would build a string of"));
  EXPECT_THAT(RenderWithinLimits("{{ ','.join(['x' * 40000000] * 2) }}"),
              HasSubstr("would build a string of"));
  EXPECT_THAT(RenderWithinLimits("{{ ('x' * 40000000).replace('x', 'yy') }}"),
              HasSubstr("would build a string of"));
  // Copying big strings over and over is work too.
  EXPECT_THAT(RenderWithinLimits("{% set s = 'x' * 60000000 %}{% for i in range(100000) %}"
                                 "{% set t = s ~ '' %}{% endfor %}"),
              HasSubstr("ran past 10,000,000 steps"));
  // A stride past the last int64 ends the slice instead of wrapping.
  EXPECT_EQ(RenderWithinLimits("{{ [1, 2, 3][1::9223372036854775807] }}"), "[2]");
  EXPECT_EQ(RenderWithinLimits("{{ 'abc'[1::9223372036854775807] }}"), "b");
  EXPECT_THAT(RenderWithinLimits("{{ (-9223372036854775807 - 1) | abs }}"),
              HasSubstr("integer overflow"));
  EXPECT_THAT(RenderWithinLimits("{{ 1e30 | int }}"), HasSubstr("integer overflow"));
  EXPECT_EQ(RenderWithinLimits("{{ 9223372036854775807 % -2 }} {{ -7 % 3 }}"), "-1 2");
}

TEST(JinjaLimitsTest, ANamespaceThatHoldsItselfIsAnErrorWhenPrinted) {
  EXPECT_THAT(RenderWithinLimits("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}"),
              HasSubstr("a value nested deeper than 256 levels (a namespace that holds itself?) "
                        "cannot be printed"));
  EXPECT_THAT(
      RenderWithinLimits("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns.self.a }}"),
      testing::Eq("1"));
}

}  // namespace
}  // namespace engine::jinja
