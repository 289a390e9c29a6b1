// The one parser for option specs (--straggle, --balancer, --predictor, --lr-schedule, --inject-fault):
//
//   SPEC   := KIND [":" ARGS] [";" KEY "=" VALUE]...
//   ARGS   := anything up to the first ';' (callers split it with args_list(',') or take it whole)
//
// Every error is std::invalid_argument in one style:  WHAT: WHY (in 'SPEC'; HELP)
// where WHAT names the option ("--straggle", "predictor") and HELP lists the valid forms.
// Header-only so that models/, predictors/, balancer/ and runtime/ share it without a link dependency.
#pragma once
#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace lbbsp::spec {

// Splits on `sep`, keeping empty fields ("a,,b" -> a, "", b; "" -> one empty field).
inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// The whole text as a T (std::from_chars: no '+', no spaces, nothing after the number); false when it is not
// one.
template <class T>
bool parse_number(std::string_view text, T& value) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

struct KeyValue {
  std::string key, value;
};

class Spec {
 public:
  Spec(std::string text, std::string what, std::string help)
      : text_(std::move(text)), what_(std::move(what)), help_(std::move(help)) {
    std::vector<std::string> parts = split(text_, ';');
    const std::string& head = parts[0];
    const size_t colon = head.find(':');
    kind_ = head.substr(0, colon);
    has_args_ = colon != std::string::npos;
    if (has_args_) args_ = head.substr(colon + 1);
    for (size_t i = 1; i < parts.size(); ++i) options_.push_back(key_value(parts[i], "option"));
  }

  const std::string& text() const { return text_; }
  const std::string& kind() const { return kind_; }
  bool has_args() const { return has_args_; }
  const std::string& args() const { return args_; }
  // ARGS split on `sep`; empty when there are none.
  std::vector<std::string> args_list(char sep = ',') const {
    return args_.empty() ? std::vector<std::string>{} : split(args_, sep);
  }
  const std::vector<KeyValue>& options() const { return options_; }

  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument(what_ + ": " + why + " (in '" + text_ + "'" + (help_.empty() ? "" : "; ") +
                                help_ + ")");
  }
  void expect_no_args() const {
    if (has_args_) fail("'" + kind_ + "' takes no arguments");
  }
  void expect_no_options() const {
    if (!options_.empty()) fail("'" + kind_ + "' takes no ;KEY=VALUE options, got '" + options_[0].key + "'");
  }
  // "KEY=VALUE" -> {KEY, VALUE}; `what` names the field in the message ("option", "narx option").
  KeyValue key_value(const std::string& part, const std::string& what) const {
    const size_t eq = part.find('=');
    if (eq == std::string::npos) fail(what + " '" + part + "' needs KEY=VALUE");
    return {part.substr(0, eq), part.substr(eq + 1)};
  }
  // Strict numbers: the whole text must parse; `name` says which field it is.
  double number(const std::string& text, const std::string& name) const {
    double v = 0;
    if (!parse_number(without_plus(text), v) || !std::isfinite(v))
      fail("'" + text + "' is not a number (in " + name + ")");
    return v;
  }
  int64_t integer(const std::string& text, const std::string& name) const {
    int64_t v = 0;
    if (!parse_number(without_plus(text), v)) fail("'" + text + "' is not an integer (in " + name + ")");
    return v;
  }

 private:
  static std::string_view without_plus(std::string_view text) {
    if (!text.empty() && text[0] == '+') text.remove_prefix(1);  // "+1" reads as 1, as strtod reads it
    return text;
  }

  std::string text_, what_, help_;
  std::string kind_, args_;
  bool has_args_ = false;
  std::vector<KeyValue> options_;
};

}  // namespace lbbsp::spec
