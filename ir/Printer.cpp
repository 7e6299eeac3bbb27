// The text printer of Kiln IR (syntax in docs/ir.md). Every value gets a
// function-unique name: its own name hint when that is usable and not taken,
// otherwise the next free number. Floats are printed with the fewest digits
// that read back to the same bits in their own precision, so parsing the
// output and printing again reproduces it exactly.
#include "ir/Printer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

bool isValueNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '$' || c == '-';
}

bool isIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isIdentChar(char c) { return isIdentStart(c) || (c >= '0' && c <= '9'); }

/// True when `name` can follow `@` without quotes.
bool isBareFunctionName(const std::string& name) {
  if (name.empty() || !isIdentStart(name[0])) return false;
  for (char c : name)
    if (!isValueNameChar(c)) return false;
  return true;
}

/// A symbolic dim as an identifier: names from model files (`batch size`,
/// `0N`) are made parseable by replacing what an identifier cannot hold.
std::string symbolText(const std::string& symbol) {
  std::string s;
  for (char c : symbol) s += isIdentChar(c) ? c : '_';
  if (!isIdentStart(s[0])) s.insert(s.begin(), '_');
  return s;
}

/// Decimal text of `d` from its significant digits, Python-repr style:
/// plain notation for exponents in [-4, 16), scientific otherwise, and
/// always with a `.` or an exponent so it reads back as a float.
std::string layoutDecimal(bool negative, std::string digits, int exponent) {
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string s = negative ? "-" : "";
  int n = static_cast<int>(digits.size());
  if (exponent >= 16 || exponent < -4) {
    s += digits[0];
    if (n > 1) s += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
    return s + exp;
  }
  if (exponent < 0) return s + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  if (exponent + 1 >= n) return s + digits + std::string(static_cast<size_t>(exponent + 1 - n), '0') + ".0";
  return s + digits.substr(0, static_cast<size_t>(exponent + 1)) + "." +
         digits.substr(static_cast<size_t>(exponent + 1));
}

/// `d` with the fewest significant digits (from `minDigits`) that
/// `readsBack` maps to the value being printed.
template <typename ReadsBack>
std::string shortestFloat(double d, int minDigits, int maxDigits, ReadsBack readsBack) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[48];
  for (int digits = minDigits; digits <= maxDigits; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, d);
    if (readsBack(std::strtod(buf, nullptr)) || digits == maxDigits) break;
  }
  // buf is `[-]d.ddde[+-]XX`.
  std::string_view text = buf;
  bool negative = text[0] == '-';
  if (negative) text.remove_prefix(1);
  size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(0, e))
    if (c != '.') digits += c;
  int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  return layoutDecimal(negative, std::move(digits), exponent);
}

/// Fewer digits than a precision's normal minimum can only be enough for
/// subnormals, whose spacing is coarser; start low for those.
int firstDigits(bool subnormal, int normalMinimum) { return subnormal ? 1 : normalMinimum; }

std::string formatDouble(double d) {
  return shortestFloat(d, firstDigits(std::fpclassify(d) == FP_SUBNORMAL, 15), 17,
                       [d](double back) { return back == d && std::signbit(back) == std::signbit(d); });
}

/// An element of a dense tensor, in the precision of its dtype.
std::string formatElement(const DenseTensor& t, int64_t i) {
  DType dt = t.type.dtype;
  switch (dt) {
    case DType::F64: return formatDouble(t.getDouble(i));
    case DType::F32: {
      float f = static_cast<float>(t.getDouble(i));
      return shortestFloat(f, firstDigits(std::fpclassify(f) == FP_SUBNORMAL, 6), 9, [f](double back) {
        float b = static_cast<float>(back);
        return b == f && std::signbit(b) == std::signbit(f);
      });
    }
    case DType::F16: {
      uint16_t h = floatToHalf(static_cast<float>(t.getDouble(i)));
      return shortestFloat(halfToFloat(h), 1, 9,
                           [h](double back) { return floatToHalf(static_cast<float>(back)) == h; });
    }
    case DType::BF16: {
      uint16_t b = floatToBFloat16(static_cast<float>(t.getDouble(i)));
      return shortestFloat(bfloat16ToFloat(b), 1, 9,
                           [b](double back) { return floatToBFloat16(static_cast<float>(back)) == b; });
    }
    case DType::Bool: return t.getInt(i) ? "true" : "false";
    case DType::U64: return std::to_string(static_cast<uint64_t>(t.getInt(i)));
    default: return std::to_string(t.getInt(i));
  }
}

void printString(std::ostream& os, const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  os << '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      os << '\\' << ch;
    } else if (c == '\n') {
      os << "\\n";
    } else if (c == '\t') {
      os << "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      os << '\\' << kHex[c >> 4] << kHex[c & 15];
    } else {
      os << ch;  // printable ASCII and UTF-8 bytes stay readable
    }
  }
  os << '"';
}

void printType(std::ostream& os, const TensorType& t) {
  os << dtypeName(t.dtype) << '[';
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) os << ',';
    const Dim& d = t.shape[i];
    if (d.isStatic())
      os << d.size;
    else if (d.isSymbolic())
      os << symbolText(d.symbol);
    else
      os << '?';
  }
  os << ']';
}

void printDense(std::ostream& os, const DenseTensor& t) {
  os << "dense<";
  printType(os, t.type);
  os << ">[";
  // Malformed tensors (a dynamic type, too few bytes) print only the
  // elements that exist; the verifier reports them.
  int64_t n = t.type.isStatic() ? t.numElements() : 0;
  int64_t available = static_cast<int64_t>(t.bytes.size() / dtypeSize(t.type.dtype));
  if (n > available) n = available;
  for (int64_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    os << formatElement(t, i);
  }
  os << ']';
}

void printAttr(std::ostream& os, const Attribute& a) {
  switch (a.kind()) {
    case AttrKind::Int: os << a.getInt(); break;
    case AttrKind::Float: os << formatDouble(a.getFloat()); break;
    case AttrKind::Bool: os << (a.getBool() ? "true" : "false"); break;
    case AttrKind::String: printString(os, a.getString()); break;
    case AttrKind::Ints: {
      os << '[';
      const auto& v = a.getInts();
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
      os << ']';
      break;
    }
    case AttrKind::Floats: {
      os << '[';
      const auto& v = a.getFloats();
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << formatDouble(v[i]);
      os << ']';
      break;
    }
    case AttrKind::Tensor: printDense(os, a.getTensor()); break;
  }
}

void printLoc(std::ostream& os, const Location& loc) {
  if (!loc.isPrinted()) return;
  os << " loc(";
  if (loc.kind == Location::Kind::FileLineCol) {
    printString(os, loc.file);
    // The parser reads only non-negative positions.
    os << ':' << std::max(loc.line, 0) << ':' << std::max(loc.col, 0);
  } else {
    if (!loc.file.empty()) {
      printString(os, loc.file);
      os << ':';
    }
    printString(os, loc.name);
  }
  os << ')';
}

/// The printed names of the values of one function.
class ValueNamer {
 public:
  /// Names every argument and op result of `f`. Usable name hints are
  /// reserved first so that a numbered value never takes a name that a
  /// later value asks for.
  explicit ValueNamer(const Function& f) {
    std::vector<const Value*> values;
    for (size_t i = 0; i < f.numArguments(); ++i) values.push_back(f.argument(i));
    for (const auto& op : f.ops())
      for (size_t i = 0; i < op->numResults(); ++i) values.push_back(op->result(i));
    nameAll(values);
  }
  /// Names the operands and results of a detached op.
  explicit ValueNamer(const Op& op) {
    std::vector<const Value*> values(op.operands().begin(), op.operands().end());
    for (size_t i = 0; i < op.numResults(); ++i) values.push_back(op.result(i));
    nameAll(values);
  }

  const std::unordered_map<const Value*, std::string>& names() const { return names_; }

  const std::string& name(const Value* v) {
    auto it = names_.find(v);
    if (it != names_.end()) return it->second;
    // A value from outside the function (invalid IR) still gets a name.
    return names_[v] = nextNumber();
  }

 private:
  static const std::string& hint(const Value* v) { return v->name(); }

  void nameAll(const std::vector<const Value*>& values) {
    for (const Value* v : values)
      if (v && !hint(v).empty()) taken_.insert(hint(v));
    std::unordered_set<std::string> given;
    for (const Value* v : values) {
      if (!v || names_.count(v)) continue;
      std::string h = hint(v);
      if (!h.empty() && given.insert(h).second)
        names_[v] = h;
      else
        names_[v] = nextNumber();
    }
  }

  std::string nextNumber() {
    std::string s;
    do s = std::to_string(counter_++);
    while (!taken_.insert(s).second);
    return s;
  }

  std::unordered_map<const Value*, std::string> names_;
  std::unordered_set<std::string> taken_;
  int64_t counter_ = 0;
};

void printValue(std::ostream& os, ValueNamer& namer, const Value* v) {
  if (!v) {
    os << "%<null>";  // only reachable from broken IR built in memory
    return;
  }
  const std::string& name = namer.name(v);
  os << '%';
  if (std::all_of(name.begin(), name.end(), isValueNameChar))
    os << name;
  else
    printString(os, name);
}

void printRegion(std::ostream& os, const Function& region, const Op& owner, int indent);

/// One op; an op with a region continues over the following lines, its
/// region indented by two more spaces than `indent` (the op's own).
void printOpLine(std::ostream& os, const Op& op, ValueNamer& namer, int indent = 2) {
  if (op.kind() == OpKind::Return) {
    os << "return";
    for (size_t i = 0; i < op.numOperands(); ++i) {
      os << (i ? ", " : " ");
      printValue(os, namer, op.operand(i));
    }
  } else {
    for (size_t i = 0; i < op.numResults(); ++i) {
      if (i) os << ", ";
      printValue(os, namer, op.result(i));
    }
    if (op.numResults()) os << " = ";
    os << op.name() << '(';
    for (size_t i = 0; i < op.numOperands(); ++i) {
      if (i) os << ", ";
      printValue(os, namer, op.operand(i));
    }
    os << ')';
  }
  if (!op.attrs().empty()) {
    os << " {";
    bool first = true;
    for (const auto& [name, value] : op.attrs()) {
      os << (first ? "" : ", ") << name << " = ";
      printAttr(os, value);
      first = false;
    }
    os << '}';
  }
  if (op.numResults()) {
    os << " : ";
    for (size_t i = 0; i < op.numResults(); ++i) {
      if (i) os << ", ";
      printType(os, op.result(i)->type());
    }
  }
  for (size_t r = 0; r < op.numRegions(); ++r) printRegion(os, *op.region(r), op, indent);
  printLoc(os, op.loc());
}

/// ` {`, then `^(%a: T, ...):` and the region's ops on their own lines, then
/// `}` at the op's indentation. A region whose result types are not the
/// op's (the bodies of `if` and `loop`) says them: `^(%a: T) -> (T, ...):`.
/// The region has its own namer: its values are local to it, so they may
/// reuse the names of values outside.
void printRegion(std::ostream& os, const Function& region, const Op& owner, int indent) {
  ValueNamer namer(region);
  std::string pad(static_cast<size_t>(indent), ' ');
  os << " {\n" << pad << "^(";
  for (size_t i = 0; i < region.numArguments(); ++i) {
    if (i) os << ", ";
    printValue(os, namer, region.argument(i));
    os << ": ";
    printType(os, region.argument(i)->type());
  }
  os << ')';
  std::vector<TensorType> ownerTypes;
  for (const Value* r : owner.results()) ownerTypes.push_back(r->type());
  if (region.resultTypes() != ownerTypes) {
    os << " -> (";
    for (size_t i = 0; i < region.resultTypes().size(); ++i) {
      if (i) os << ", ";
      printType(os, region.resultTypes()[i]);
    }
    os << ')';
  }
  os << ":\n";
  for (const auto& op : region.ops()) {
    os << pad << "  ";
    printOpLine(os, *op, namer, indent + 2);
    os << '\n';
  }
  os << pad << '}';
}

}  // namespace

void print(const Function& f, std::ostream& os) {
  ValueNamer namer(f);
  os << "func @";
  if (isBareFunctionName(f.name()))
    os << f.name();
  else
    printString(os, f.name());
  os << '(';
  for (size_t i = 0; i < f.numArguments(); ++i) {
    if (i) os << ", ";
    printValue(os, namer, f.argument(i));
    os << ": ";
    printType(os, f.argument(i)->type());
    if (const DenseTensor* d = f.argumentDefault(i)) {
      os << " = ";
      printDense(os, *d);
    }
  }
  os << ") -> ";
  bool named = false;
  for (size_t i = 0; i < f.resultTypes().size(); ++i) named |= !f.resultName(i).empty() || f.resultAlias(i) >= 0;
  if (f.resultTypes().size() == 1 && !named) {
    printType(os, f.resultTypes()[0]);
  } else {
    os << '(';
    for (size_t i = 0; i < f.resultTypes().size(); ++i) {
      if (i) os << ", ";
      if (!f.resultName(i).empty()) {
        printString(os, f.resultName(i));
        os << ": ";
      }
      printType(os, f.resultTypes()[i]);
      if (const int alias = f.resultAlias(i); alias >= 0 && static_cast<size_t>(alias) < f.numArguments()) {
        os << " aliases ";
        printValue(os, namer, f.argument(static_cast<size_t>(alias)));
      }
    }
    os << ')';
  }
  printLoc(os, f.loc());
  os << " {\n";
  for (const auto& op : f.ops()) {
    os << "  ";
    printOpLine(os, *op, namer);
    os << '\n';
  }
  os << "}\n";
}

void print(const Module& m, std::ostream& os) {
  bool first = true;
  for (const auto& f : m.functions()) {
    if (!first) os << '\n';
    print(*f, os);
    first = false;
  }
}

std::string print(const Module& m) {
  std::ostringstream os;
  print(m, os);
  return os.str();
}

std::string print(const Function& f) {
  std::ostringstream os;
  print(f, os);
  return os.str();
}

std::string printOp(const Op& op) {
  std::ostringstream os;
  if (op.parent()) {
    ValueNamer namer(*op.parent());
    printOpLine(os, op, namer);
  } else {
    ValueNamer namer(op);
    printOpLine(os, op, namer);
  }
  return os.str();
}

std::unordered_map<const Value*, std::string> printedValueNames(const Function& f) {
  return ValueNamer(f).names();
}

std::string printAttribute(const Attribute& a) {
  std::ostringstream os;
  printAttr(os, a);
  return os.str();
}

}  // namespace kiln
