// Typed op attributes. Each op's attributes are declared in the op table
// (Ops.def) with their kind, and the parser and verifier check them against
// that declaration. A dense tensor attribute carries constant data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ir/Types.h"

namespace kiln {

enum class AttrKind : uint8_t { Int, Float, Bool, String, Ints, Floats, Tensor };

std::string_view attrKindName(AttrKind k);

/// A constant tensor: a static type and its little-endian element bytes in
/// row-major order.
struct DenseTensor {
  TensorType type;
  std::vector<uint8_t> bytes;

  int64_t numElements() const { return kiln::numElements(type.shape); }
  /// Element `i` converted to double (bool as 0/1, 16-bit floats widened).
  double getDouble(int64_t i) const;
  /// Element `i` converted to int64 (floats truncated toward zero).
  int64_t getInt(int64_t i) const;
  /// Stores `v` at element `i`, converted to the element type.
  void setDouble(int64_t i, double v);
  void setInt(int64_t i, int64_t v);
  /// A zero-filled tensor of a static type.
  static DenseTensor zeros(TensorType type);
  bool operator==(const DenseTensor&) const = default;
};

/// One attribute value; its kind is the index of the alternative held.
class Attribute {
 public:
  using Storage = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::shared_ptr<const DenseTensor>>;

  Attribute() : v_(int64_t{0}) {}
  Attribute(int64_t v) : v_(v) {}
  Attribute(int v) : v_(int64_t{v}) {}
  Attribute(double v) : v_(v) {}
  Attribute(bool v) : v_(v) {}
  Attribute(std::string v) : v_(std::move(v)) {}
  Attribute(const char* v) : v_(std::string(v)) {}
  Attribute(std::vector<int64_t> v) : v_(std::move(v)) {}
  Attribute(std::vector<double> v) : v_(std::move(v)) {}
  Attribute(DenseTensor t) : v_(std::make_shared<const DenseTensor>(std::move(t))) {}

  AttrKind kind() const { return static_cast<AttrKind>(v_.index()); }
  int64_t getInt() const { return std::get<int64_t>(v_); }
  double getFloat() const { return std::get<double>(v_); }
  bool getBool() const { return std::get<bool>(v_); }
  const std::string& getString() const { return std::get<std::string>(v_); }
  const std::vector<int64_t>& getInts() const { return std::get<std::vector<int64_t>>(v_); }
  const std::vector<double>& getFloats() const { return std::get<std::vector<double>>(v_); }
  const DenseTensor& getTensor() const { return *std::get<std::shared_ptr<const DenseTensor>>(v_); }

  bool operator==(const Attribute& other) const;

 private:
  Storage v_;
};

/// Attributes by name; kept sorted so printing is deterministic.
using AttrMap = std::map<std::string, Attribute>;

}  // namespace kiln
