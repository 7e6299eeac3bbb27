// Error values, source locations and diagnostics shared by every layer of
// Kiln. Errors are values: a function that can fail on bad input returns
// Expected<T> (or Status), never asserts and never throws across layers.
#pragma once

#include <cassert>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

/// Where an op or value came from. Explicit locations (a model's node name,
/// a `loc(...)` in text IR) are printed; a Source location is only the
/// position the parser saw and is used for diagnostics, never printed.
struct Location {
  enum class Kind { Unknown, Source, FileLineCol, Named };
  Kind kind = Kind::Unknown;
  std::string file;
  int line = 0;
  int col = 0;
  std::string name;

  static Location source(std::string file, int line, int col) {
    return {Kind::Source, std::move(file), line, col, {}};
  }
  static Location fileLineCol(std::string file, int line, int col) {
    return {Kind::FileLineCol, std::move(file), line, col, {}};
  }
  static Location named(std::string name, std::string file = {}) {
    return {Kind::Named, std::move(file), 0, 0, std::move(name)};
  }
  bool isPrinted() const { return kind == Kind::FileLineCol || kind == Kind::Named; }
  bool isUnknown() const { return kind == Kind::Unknown; }
  bool operator==(const Location&) const = default;

  /// `file:line:col` or `file: node 'name'`, the prefix of a diagnostic.
  std::string str() const;
};

/// An error a user can act on: a message and where it applies.
class Error {
 public:
  explicit Error(std::string message, Location loc = {})
      : message_(std::move(message)), loc_(std::move(loc)) {}
  const std::string& message() const { return message_; }
  const Location& location() const { return loc_; }
  /// `loc: error: message`, or `error: message` without a location.
  std::string str() const;

 private:
  std::string message_;
  Location loc_;
};

/// Either a T or an Error.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}
  Expected(Error error) : v_(std::move(error)) {}
  explicit operator bool() const { return v_.index() == 0; }
  bool ok() const { return v_.index() == 0; }
  T& operator*() { assert(ok()); return std::get<0>(v_); }
  const T& operator*() const { assert(ok()); return std::get<0>(v_); }
  T* operator->() { assert(ok()); return &std::get<0>(v_); }
  const T* operator->() const { assert(ok()); return &std::get<0>(v_); }
  const Error& error() const { assert(!ok()); return std::get<1>(v_); }
  Error takeError() { assert(!ok()); return std::move(std::get<1>(v_)); }

 private:
  std::variant<T, Error> v_;
};

/// Success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}
  static Status success() { return {}; }
  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { assert(!ok()); return *error_; }
  Error takeError() { assert(!ok()); return std::move(*error_); }

 private:
  std::optional<Error> error_;
};

/// Propagates a failed Status or Expected out of the enclosing function.
#define KILN_TRY(expr)                              \
  do {                                              \
    auto kiln_try_status_ = (expr);                 \
    if (!kiln_try_status_) return kiln_try_status_.takeError(); \
  } while (0)

/// Receives diagnostics. Verifiers report every problem they find through
/// one of these instead of stopping at the first.
using DiagnosticHandler = std::function<void(const Error&)>;

}  // namespace kiln
