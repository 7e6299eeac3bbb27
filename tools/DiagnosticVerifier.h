// MLIR-style expected-diagnostic checking for `kiln-opt --verify-diagnostics`.
// Input files annotate the lines that must produce errors:
//
//   // expected-error@+1 {{unknown op 'foo'}}
//   %x = foo(%a) : f32[]
//
// `@+N`/`@-N` are relative to the comment's line; without `@` the comment's
// own line is meant. Every produced error must be expected and every
// expectation met.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/Support.h"

namespace kiln {

class DiagnosticVerifier {
 public:
  /// Collects the expectations of `text`, whose first line is `firstLine`
  /// of `filename`. Malformed expectation comments are reported by check().
  DiagnosticVerifier(std::string_view text, std::string filename, int firstLine);

  /// Records a produced diagnostic.
  void handle(const Error& e) { produced_.push_back(e); }

  /// Matches produced against expected diagnostics; returns one message per
  /// mismatch (empty when everything matched).
  std::vector<std::string> check() const;

 private:
  struct Expectation {
    int line;
    std::string substring;
    int commentLine;
  };
  std::string filename_;
  std::vector<Expectation> expected_;
  std::vector<std::string> malformed_;
  std::vector<Error> produced_;
};

}  // namespace kiln
