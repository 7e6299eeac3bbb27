// Parses `expected-error` comments and matches them against diagnostics.
#include "tools/DiagnosticVerifier.h"

#include <cstdlib>

namespace kiln {

DiagnosticVerifier::DiagnosticVerifier(std::string_view text, std::string filename, int firstLine)
    : filename_(std::move(filename)) {
  int line = firstLine;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(pos, end - pos);
    size_t at = l.find("expected-error");
    if (at != std::string_view::npos && l.find("//") < at) {
      std::string_view rest = l.substr(at + std::string_view("expected-error").size());
      int target = line;
      if (!rest.empty() && rest.front() == '@') {
        rest.remove_prefix(1);
        char* parsedEnd = nullptr;
        std::string num(rest.substr(0, rest.find_first_of(" \t{")));
        long offset = std::strtol(num.c_str(), &parsedEnd, 10);
        if (num.empty() || (num[0] != '+' && num[0] != '-') || *parsedEnd != '\0') {
          malformed_.push_back(filename_ + ":" + std::to_string(line) +
                               ": error: expected '@+N' or '@-N' after 'expected-error'");
        }
        target = line + static_cast<int>(offset);
        rest.remove_prefix(num.size());
      }
      size_t open = rest.find("{{");
      size_t close = rest.rfind("}}");
      if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
        malformed_.push_back(filename_ + ":" + std::to_string(line) +
                             ": error: expected '{{message}}' in 'expected-error' comment");
      } else {
        expected_.push_back({target, std::string(rest.substr(open + 2, close - open - 2)), line});
      }
    }
    pos = end + 1;
    ++line;
  }
}

std::vector<std::string> DiagnosticVerifier::check() const {
  std::vector<std::string> problems = malformed_;
  std::vector<bool> met(expected_.size(), false);
  for (const Error& e : produced_) {
    bool matched = false;
    for (size_t i = 0; i < expected_.size() && !matched; ++i) {
      if (met[i] || expected_[i].line != e.location().line) continue;
      if (e.message().find(expected_[i].substring) == std::string::npos) continue;
      met[i] = matched = true;
    }
    if (!matched) problems.push_back("unexpected " + e.str());
  }
  for (size_t i = 0; i < expected_.size(); ++i)
    if (!met[i])
      problems.push_back(filename_ + ":" + std::to_string(expected_[i].commentLine) + ": error: expected error \"" +
                         expected_[i].substring + "\" on line " + std::to_string(expected_[i].line) +
                         " was not produced");
  return problems;
}

}  // namespace kiln
