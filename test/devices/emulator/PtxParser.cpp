// PTX text to its syntax (PtxSyntax.h): a lexer over the text and a
// recursive-descent reader of the module's directives, variables,
// functions and statements. Meaning is left to PtxDecoder.cpp; here only
// the shape of the text is checked, and a directive the emulator does not
// know is an error naming it and its line.
#include <cstring>
#include <string>

#include "test/devices/emulator/PtxSyntax.h"

namespace kiln::emulator::syntax {
namespace {

struct Token {
  enum class Kind : uint8_t { Word, Number, String, Punct, End };
  Kind kind = Kind::End;
  std::string_view text;
  uint32_t line = 0;
  bool is(char c) const { return kind == Kind::Punct && text[0] == c; }
  bool is(std::string_view word) const { return kind == Kind::Word && text == word; }
};

bool isWordStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' || c == '%' || c == '.';
}
bool isWordChar(char c) { return isWordStart(c) || (c >= '0' && c <= '9'); }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

/// Splits the text into tokens; comments are skipped.
class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Token next() {
    skipSpace();
    Token t;
    t.line = line_;
    if (pos_ >= text_.size() || text_[pos_] == '\0') return t;
    const size_t start = pos_;
    const char c = text_[pos_];
    if (isWordStart(c)) {
      ++pos_;
      while (pos_ < text_.size()) {
        if (isWordChar(text_[pos_])) {
          ++pos_;
        } else if (text_[pos_] == ':' && pos_ + 1 < text_.size() && text_[pos_ + 1] == ':') {
          pos_ += 2;  // .L2::evict_last
        } else {
          break;
        }
      }
      t.kind = Token::Kind::Word;
    } else if (isDigit(c)) {
      const bool hex = c == '0' && pos_ + 1 < text_.size() &&
                       (text_[pos_ + 1] == 'x' || text_[pos_ + 1] == 'X' || text_[pos_ + 1] == 'f' ||
                        text_[pos_ + 1] == 'F' || text_[pos_ + 1] == 'd' || text_[pos_ + 1] == 'D');
      ++pos_;
      while (pos_ < text_.size()) {
        const char d = text_[pos_];
        if (isWordChar(d) && d != '%' && d != '$') {
          ++pos_;
        } else if (!hex && (d == '-' || d == '+') && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E')) {
          ++pos_;  // 1e-5
        } else {
          break;
        }
      }
      t.kind = Token::Kind::Number;
    } else if (c == '"') {
      ++pos_;
      while (pos_ < text_.size() && text_[pos_] != '"') {
        if (text_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= text_.size()) throw PtxError("line " + std::to_string(t.line) + ": unterminated string");
      ++pos_;
      t.kind = Token::Kind::String;
    } else {
      ++pos_;
      t.kind = Token::Kind::Punct;
    }
    t.text = text_.substr(start, pos_ - start);
    return t;
  }

  size_t position() const { return pos_; }
  std::string_view text() const { return text_; }

 private:
  void skipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') {
        ++line_;
        ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
        pos_ += 2;
        while (pos_ + 1 < text_.size() && !(text_[pos_] == '*' && text_[pos_ + 1] == '/')) {
          if (text_[pos_] == '\n') ++line_;
          ++pos_;
        }
        pos_ += 2;
      } else {
        break;
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  uint32_t line_ = 1;
};

[[noreturn]] void fail(uint32_t line, const std::string& message) {
  throw PtxError("line " + std::to_string(line) + ": " + message);
}

/// Reads integer and float literals: decimal, 0x hex, 0b binary, 0f (f32
/// bits), 0d (f64 bits), decimal floats; a trailing U is allowed.
Operand parseNumber(const Token& t, bool negative) {
  Operand o;
  o.kind = Operand::Kind::Immediate;
  std::string_view s = t.text;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'f' || s[1] == 'F' || s[1] == 'd' || s[1] == 'D')) {
    const bool f32 = s[1] == 'f' || s[1] == 'F';
    std::string digits(s.substr(2));
    if (digits.size() != (f32 ? 8u : 16u)) fail(t.line, "malformed float literal '" + std::string(s) + "'");
    o.literal = f32 ? Operand::Literal::F32 : Operand::Literal::F64;
    o.bits = std::stoull(digits, nullptr, 16);
    if (negative) o.bits ^= f32 ? 0x80000000ull : 0x8000000000000000ull;
    return o;
  }
  if (s.find_first_of(".eE") != std::string_view::npos && !(s.size() > 1 && (s[1] == 'x' || s[1] == 'X'))) {
    double v = std::stod(std::string(s));
    if (negative) v = -v;
    o.literal = Operand::Literal::F64;
    std::memcpy(&o.bits, &v, 8);
    return o;
  }
  if (!s.empty() && (s.back() == 'U' || s.back() == 'u')) s.remove_suffix(1);
  uint64_t value = 0;
  try {
    size_t used = 0;
    std::string digits(s);
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'b' || digits[1] == 'B')) {
      value = std::stoull(digits.substr(2), &used, 2);
      used += 2;
    } else if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
      value = std::stoull(digits, &used, 16);
    } else if (digits.size() > 1 && digits[0] == '0') {
      value = std::stoull(digits, &used, 8);
    } else {
      value = std::stoull(digits, &used, 10);
    }
    if (used != digits.size()) throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    fail(t.line, "malformed number '" + std::string(t.text) + "'");
  }
  o.literal = Operand::Literal::Int;
  o.bits = negative ? ~value + 1 : value;
  return o;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : lexer_(text) { advance(); }

  Module parseModule() {
    Module module;
    while (peek_.kind != Token::Kind::End) {
      const Token t = take();
      if (t.is(".version") || t.is(".target") || t.is(".file")) {
        skipLine(t.line);
      } else if (t.is(".address_size")) {
        const Token size = take();
        if (size.text != "64") fail(t.line, ".address_size " + std::string(size.text) + " (only 64 is implemented)");
      } else if (t.is(".visible") || t.is(".weak") || t.is(".extern") || t.is(".common")) {
        pendingExtern_ = pendingExtern_ || t.is(".extern");
        continue;
      } else if (t.is(".entry") || t.is(".func")) {
        module.functions.push_back(parseFunction(t.is(".entry"), t.line));
      } else if (t.is(".global") || t.is(".const") || t.is(".shared")) {
        Declaration::Kind kind = t.is(".global")  ? Declaration::Kind::Global
                                 : t.is(".const") ? Declaration::Kind::Const
                                                  : Declaration::Kind::Shared;
        Declaration d = parseDeclaration(kind, t.line, true);
        expect(';');
        module.variables.push_back(std::move(d));
      } else {
        fail(t.line, "unknown directive '" + std::string(t.text) + "' at module level");
      }
      pendingExtern_ = false;
    }
    return module;
  }

 private:
  Token take() {
    Token t = peek_;
    advance();
    return t;
  }
  void advance() { peek_ = lexer_.next(); }
  void expect(char c) {
    if (!peek_.is(c)) fail(peek_.line, std::string("expected '") + c + "', found '" + std::string(peek_.text) + "'");
    advance();
  }
  bool accept(char c) {
    if (!peek_.is(c)) return false;
    advance();
    return true;
  }
  void skipLine(uint32_t line) {
    while (peek_.kind != Token::Kind::End && peek_.line == line) advance();
  }
  uint64_t takeInteger() {
    const Token t = take();
    if (t.kind != Token::Kind::Number) fail(t.line, "expected a number, found '" + std::string(t.text) + "'");
    const Operand o = parseNumber(t, false);
    if (o.literal != Operand::Literal::Int) fail(t.line, "expected an integer, found '" + std::string(t.text) + "'");
    return o.bits;
  }

  /// `[.align N] [.ptr .space .align N] .type name[N] [= init]` after the
  /// state space (.reg, .param, .global, ...). Registers may be a list
  /// (`.reg .b32 a, b;`), which the caller handles through `more`.
  Declaration parseDeclaration(Declaration::Kind kind, uint32_t line, bool allowInit) {
    Declaration d;
    d.kind = kind;
    d.line = line;
    d.isExtern = pendingExtern_;
    bool haveType = false;
    while (peek_.kind == Token::Kind::Word && peek_.text[0] == '.') {
      const Token m = take();
      if (m.is(".align")) {
        d.align = static_cast<uint32_t>(takeInteger());
      } else if (m.is(".ptr") || m.is(".global") || m.is(".shared") || m.is(".const") || m.is(".local")) {
        // kernel parameter attributes (.ptr .global .align 4): informative only
      } else if (m.is(".v2") || m.is(".v4")) {
        fail(m.line, "vector declarations ('" + std::string(m.text) + "') are not implemented");
      } else {
        const PtxType type = typeFromName(m.text);
        if (type == PtxType::None) fail(m.line, "unknown declaration modifier '" + std::string(m.text) + "'");
        d.type = type;
        haveType = true;
      }
    }
    if (!haveType) fail(line, "declaration without a type");
    const Token name = take();
    if (name.kind != Token::Kind::Word) fail(name.line, "expected a name, found '" + std::string(name.text) + "'");
    d.name = name.text;
    if (peek_.is('<')) {
      advance();
      d.rangeCount = static_cast<uint32_t>(takeInteger());
      expect('>');
    }
    while (peek_.is('[')) {
      advance();
      if (peek_.is(']')) {
        d.arrayCount = 0;  // unsized (extern shared)
      } else {
        const uint64_t n = takeInteger();
        if (n > (1ull << 40) || (n && d.arrayCount > (1ull << 40) / n))
          fail(name.line, "array '" + std::string(d.name) + "' is too large");
        d.arrayCount *= n;
      }
      d.isArray = true;
      expect(']');
    }
    if (peek_.is('=')) {
      if (!allowInit) fail(peek_.line, "an initializer is only allowed on module variables");
      advance();
      parseInitializer(d);
    }
    return d;
  }

  void parseInitializer(Declaration& d) {
    const size_t elementBytes = typeBytes(d.type);
    auto element = [&]() {
      bool negative = accept('-');
      const Token t = take();
      if (t.kind != Token::Kind::Number)
        fail(t.line,
             "initializer element '" + std::string(t.text) + "' is not a number (addresses are not implemented)");
      Operand o = parseNumber(t, negative);
      uint64_t bits = o.bits;
      if (d.type == PtxType::F32 && o.literal == Operand::Literal::F64) {
        double v;
        std::memcpy(&v, &o.bits, 8);
        float f = static_cast<float>(v);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        bits = b;
      } else if (d.type == PtxType::F64 && o.literal == Operand::Literal::F32) {
        float f;
        uint32_t b = static_cast<uint32_t>(o.bits);
        std::memcpy(&f, &b, 4);
        double v = f;
        std::memcpy(&bits, &v, 8);
      }
      for (size_t i = 0; i < elementBytes; ++i) d.init.push_back(static_cast<uint8_t>(bits >> (8 * i)));
    };
    std::vector<int> depth;
    if (!peek_.is('{')) {
      element();
      return;
    }
    int open = 0;
    do {
      if (accept('{')) {
        ++open;
        continue;
      }
      if (accept('}')) {
        --open;
        continue;
      }
      if (accept(',')) continue;
      element();
    } while (open > 0);
  }

  Function parseFunction(bool isEntry, uint32_t line) {
    Function f;
    f.isEntry = isEntry;
    f.line = line;
    if (!isEntry && peek_.is('(')) {
      advance();
      f.returns = parseParamList();
    }
    const Token name = take();
    if (name.kind != Token::Kind::Word) fail(name.line, "expected a function name");
    f.name = name.text;
    if (peek_.is('(')) {
      advance();
      f.params = parseParamList();
    }
    // Performance directives between the signature and the body.
    while (peek_.kind == Token::Kind::Word && peek_.text[0] == '.') {
      const Token d = take();
      if (d.is(".maxntid") || d.is(".reqntid")) {
        uint32_t* dims = d.is(".maxntid") ? f.maxntid : f.reqntid;
        dims[0] = dims[1] = dims[2] = 1;
        for (int i = 0; i < 3; ++i) {
          dims[i] = static_cast<uint32_t>(takeInteger());
          if (!accept(',')) break;
        }
      } else if (d.is(".minnctapersm") || d.is(".maxnreg") || d.is(".maxclusterrank")) {
        takeInteger();
      } else if (d.is(".reqnctapercluster")) {
        do takeInteger();
        while (accept(','));
      } else if (d.is(".noreturn") || d.is(".explicitcluster")) {
      } else if (d.is(".pragma")) {
        take();
        expect(';');
      } else {
        fail(d.line, "unknown function directive '" + std::string(d.text) + "'");
      }
    }
    if (accept(';')) return f;  // a prototype
    f.defined = !pendingExtern_;
    expect('{');
    parseBody(f.body);
    return f;
  }

  std::vector<Declaration> parseParamList() {
    std::vector<Declaration> params;
    if (accept(')')) return params;
    do {
      const Token space = take();
      if (!space.is(".param") && !space.is(".reg"))
        fail(space.line, "expected .param in a parameter list, found '" + std::string(space.text) + "'");
      if (space.is(".reg")) fail(space.line, ".reg parameters are not implemented");
      Declaration d = parseDeclaration(Declaration::Kind::Param, space.line, false);
      params.push_back(d);
    } while (accept(','));
    expect(')');
    return params;
  }

  /// Statements up to the '}' that closes the body (nested scopes included).
  void parseBody(std::vector<Statement>& body) {
    int depth = 1;
    while (true) {
      if (peek_.kind == Token::Kind::End) fail(peek_.line, "unexpected end of text in a function body");
      const Token t = peek_;
      Statement s;
      s.line = t.line;
      if (t.is('{')) {
        advance();
        ++depth;
        s.kind = Statement::Kind::OpenScope;
        body.push_back(std::move(s));
        continue;
      }
      if (t.is('}')) {
        advance();
        if (--depth == 0) return;
        s.kind = Statement::Kind::CloseScope;
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind == Token::Kind::Word && t.text[0] == '.') {
        advance();
        Declaration::Kind kind;
        if (t.is(".reg")) {
          kind = Declaration::Kind::Register;
        } else if (t.is(".local")) {
          kind = Declaration::Kind::Local;
        } else if (t.is(".shared")) {
          kind = Declaration::Kind::Shared;
        } else if (t.is(".param")) {
          kind = Declaration::Kind::Param;
        } else if (t.is(".pragma")) {
          take();
          expect(';');
          continue;
        } else if (t.is(".loc")) {
          skipLine(t.line);
          continue;
        } else {
          fail(t.line, "unknown directive '" + std::string(t.text) + "' in a function body");
        }
        Declaration d = parseDeclaration(kind, t.line, false);
        s.kind = Statement::Kind::Declaration;
        // `.reg .b32 a, b, c;`
        while (accept(',')) {
          Statement first = s;
          first.declaration = d;
          body.push_back(std::move(first));
          const Token name = take();
          d.name = name.text;
          d.rangeCount = 0;
          if (accept('<')) {
            d.rangeCount = static_cast<uint32_t>(takeInteger());
            expect('>');
          }
        }
        s.declaration = d;
        expect(';');
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind == Token::Kind::Word && t.text[0] != '@') {
        // A label is a word followed by ':'.
        Token word = take();
        if (peek_.is(':')) {
          advance();
          s.kind = Statement::Kind::Label;
          s.label = word.text;
          body.push_back(std::move(s));
          continue;
        }
        s.kind = Statement::Kind::Instruction;
        s.instruction = parseInstruction(word, std::string_view());
        body.push_back(std::move(s));
        continue;
      }
      if (t.is('@')) {
        const size_t start = t.text.data() - lexer_.text().data();
        advance();
        bool negated = accept('!');
        const Token guard = take();
        if (guard.kind != Token::Kind::Word) fail(guard.line, "expected a guard predicate after '@'");
        const Token opcode = take();
        s.kind = Statement::Kind::Instruction;
        s.instruction = parseInstruction(opcode, lexer_.text().substr(start));
        s.instruction.guard = guard.text;
        s.instruction.guardNegated = negated;
        body.push_back(std::move(s));
        continue;
      }
      fail(t.line, "unexpected '" + std::string(t.text) + "' in a function body");
    }
  }

  /// The operands of `opcode` up to ';'. `from` is where the statement
  /// starts in the text when a guard precedes the opcode.
  Instruction parseInstruction(const Token& opcode, std::string_view from) {
    Instruction in;
    in.opcode = opcode.text;
    in.line = opcode.line;
    const char* begin = from.empty() ? opcode.text.data() : from.data();
    if (opcode.kind != Token::Kind::Word)
      fail(opcode.line, "expected an instruction, found '" + std::string(opcode.text) + "'");
    const bool isCall = opcode.text == "call" || opcode.text.substr(0, 5) == "call.";
    if (isCall) {
      if (accept('(')) {
        in.callReturns = operandList(')');
        expect(',');
      }
      in.operands.push_back(operand());
      if (accept(',')) {
        expect('(');
        in.callArguments = operandList(')');
      }
      if (accept(',')) fail(opcode.line, "indirect calls through a prototype are not implemented");
    } else if (!peek_.is(';')) {
      do in.operands.push_back(operand());
      while (accept(','));
    }
    if (!peek_.is(';'))
      fail(peek_.line,
           "expected ';' after '" + std::string(opcode.text) + "', found '" + std::string(peek_.text) + "'");
    const char* end = peek_.text.data();
    advance();
    in.text = std::string_view(begin, static_cast<size_t>(end - begin));
    return in;
  }

  std::vector<Operand> operandList(char close) {
    std::vector<Operand> list;
    if (accept(close)) return list;
    do list.push_back(operand());
    while (accept(','));
    expect(close);
    return list;
  }

  Operand operand() {
    Operand o;
    const Token t = peek_;
    if (accept('!')) {
      o = operand();
      o.negated = true;
      return o;
    }
    if (accept('-')) {
      const Token n = take();
      if (n.kind != Token::Kind::Number) fail(n.line, "expected a number after '-'");
      return parseNumber(n, true);
    }
    if (t.kind == Token::Kind::Number) {
      advance();
      return parseNumber(t, false);
    }
    if (accept('[')) {
      o.kind = Operand::Kind::Address;
      if (peek_.kind == Token::Kind::Word) {
        o.name = take().text;
      } else if (peek_.kind == Token::Kind::Number) {
        const Operand n = parseNumber(take(), false);
        o.offset = static_cast<int64_t>(n.bits);
      }
      while (peek_.is('+') || peek_.is('-')) {
        bool negative = take().is('-');
        if (accept('-')) negative = !negative;
        const Token n = take();
        if (n.kind != Token::Kind::Number) fail(n.line, "expected an address offset");
        const Operand value = parseNumber(n, negative);
        o.offset += static_cast<int64_t>(value.bits);
      }
      expect(']');
      return o;
    }
    if (accept('{')) {
      o.kind = Operand::Kind::Vector;
      o.elements = operandList('}');
      return o;
    }
    if (t.kind == Token::Kind::Word) {
      advance();
      o.name = t.text;
      if (t.text == "_") {
        o.kind = Operand::Kind::Sink;
      } else if (t.text[0] == '%') {
        o.kind = Operand::Kind::Register;
        if (accept('|')) o.second = take().text;
      } else {
        o.kind = Operand::Kind::Symbol;
        if (accept('|')) o.second = take().text;
        if (peek_.is('+')) {
          advance();
          o.offset = static_cast<int64_t>(parseNumber(take(), false).bits);
        }
      }
      return o;
    }
    fail(t.line, "unexpected '" + std::string(t.text) + "' in an operand");
  }

  Lexer lexer_;
  Token peek_;
  bool pendingExtern_ = false;
};

}  // namespace

PtxType typeFromName(std::string_view m) {
  static const struct {
    const char* name;
    PtxType type;
  } kTypes[] = {
      {".pred", PtxType::Pred},     {".b8", PtxType::B8},   {".b16", PtxType::B16},     {".b32", PtxType::B32},
      {".b64", PtxType::B64},       {".u8", PtxType::U8},   {".u16", PtxType::U16},     {".u32", PtxType::U32},
      {".u64", PtxType::U64},       {".s8", PtxType::S8},   {".s16", PtxType::S16},     {".s32", PtxType::S32},
      {".s64", PtxType::S64},       {".f16", PtxType::F16}, {".f16x2", PtxType::F16x2}, {".bf16", PtxType::BF16},
      {".bf16x2", PtxType::BF16x2}, {".f32", PtxType::F32}, {".f64", PtxType::F64},
  };
  for (const auto& t : kTypes)
    if (m == t.name) return t.type;
  return PtxType::None;
}

Module parse(std::string_view text) {
  Parser parser(text);
  return parser.parseModule();
}

}  // namespace kiln::emulator::syntax
