// The text parser of Kiln IR (syntax in docs/ir.md): a hand-written lexer
// and a recursive-descent parser that builds a Module. The only nesting is
// an op's regions (a `fused` op's body, the branches of `if`, the body of
// `loop`); regions nest at most kMaxRegionDepth deep, so the recursion is
// bounded and the work is linear in the input. Malformed input of any kind yields an
// Error at `file:line:col` saying what was expected; every integer and size
// is range-checked before use, and no allocation is sized from a number in
// the input before the data it describes has been read.
#include "ir/Parser.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

/// Types with more elements than this are rejected: no real tensor has them
/// and products of larger dims risk overflowing int64 in later layers.
constexpr int64_t kMaxElements = int64_t{1} << 40;

enum class Tok {
  Eof,
  Ident,      // func, return, loc, dense, true, inf, f32, add, N, ...
  FuncName,   // @name or @"name" (text excludes `@`)
  ValueName,  // %name (text excludes `%`)
  Int,        // -12
  Float,      // 1.5, -2e-3, -inf, -nan
  String,     // "..." (text is the decoded contents)
  // Punctuation: ( ) { } [ ] < > , : = -> ?
  LParen,
  RParen,
  LBrace,
  RBrace,
  LSquare,
  RSquare,
  Less,
  Greater,
  Comma,
  Colon,
  Equal,
  Arrow,
  Question,
  Caret,  // ^ before a region's arguments
};

struct Token {
  Tok kind = Tok::Eof;
  std::string text;
  int line = 1;
  int col = 1;
};

bool isIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isIdentChar(char c) { return isIdentStart(c) || isDigit(c); }
bool isNameChar(char c) { return isIdentChar(c) || c == '.' || c == '$' || c == '-'; }

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string quoteChar(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  static const char kHex[] = "0123456789abcdef";
  return std::string("byte 0x") + kHex[u >> 4] + kHex[u & 15];
}

/// "an int list", "a string": attribute kinds in messages.
std::string withArticle(std::string_view kindName) {
  bool vowel = !kindName.empty() && std::string_view("aeiou").find(kindName[0]) != std::string_view::npos;
  return std::string(vowel ? "an " : "a ") + std::string(kindName);
}

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& file, int firstLine)
      : text_(text), file_(file), lineOffset_(firstLine - 1) {}

  /// Reads the next token into `tok`.
  Status next(Token& tok) {
    skipSpaceAndComments();
    tok = Token{};
    tok.line = line_;
    tok.col = col_;
    if (pos_ >= text_.size()) return Status::success();
    char c = text_[pos_];
    auto punct = [&](Tok kind, size_t n) {
      tok.kind = kind;
      tok.text = std::string(text_.substr(pos_, n));
      advance(n);
      return Status::success();
    };
    switch (c) {
      case '(': return punct(Tok::LParen, 1);
      case ')': return punct(Tok::RParen, 1);
      case '{': return punct(Tok::LBrace, 1);
      case '}': return punct(Tok::RBrace, 1);
      case '[': return punct(Tok::LSquare, 1);
      case ']': return punct(Tok::RSquare, 1);
      case '<': return punct(Tok::Less, 1);
      case '>': return punct(Tok::Greater, 1);
      case ',': return punct(Tok::Comma, 1);
      case ':': return punct(Tok::Colon, 1);
      case '=': return punct(Tok::Equal, 1);
      case '?': return punct(Tok::Question, 1);
      case '^': return punct(Tok::Caret, 1);
      case '"': return lexString(tok);
      case '@': return lexSigilName(tok, Tok::FuncName, "function name after '@'");
      case '%': return lexSigilName(tok, Tok::ValueName, "value name after '%'");
      default: break;
    }
    if (c == '-' && peekChar(1) == '>') return punct(Tok::Arrow, 2);
    if (isDigit(c) || (c == '-' && isDigit(peekChar(1)))) return lexNumber(tok);
    if (c == '-' && isIdentStart(peekChar(1))) {
      // `-inf` and `-nan` are float literals; any other `-word` is an error.
      size_t end = pos_ + 1;
      while (end < text_.size() && isIdentChar(text_[end])) ++end;
      std::string_view word = text_.substr(pos_ + 1, end - pos_ - 1);
      if (word == "inf" || word == "nan") return punct(Tok::Float, end - pos_);
      return error("unexpected '-' before '" + std::string(word) + "'");
    }
    if (isIdentStart(c)) {
      size_t end = pos_;
      while (end < text_.size() && isIdentChar(text_[end])) ++end;
      return punct(Tok::Ident, end - pos_);
    }
    return error("unexpected character " + quoteChar(c));
  }

  /// The source location of a position in this chunk of text.
  Location location(int line, int col) const { return Location::source(file_, line + lineOffset_, col); }
  Error errorAt(int line, int col, const std::string& message) const { return Error(message, location(line, col)); }

 private:
  char peekChar(size_t ahead) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  void advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < text_.size(); ++i, ++pos_) {
      if (text_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }

  Error error(const std::string& message) const { return errorAt(line_, col_, message); }

  void skipSpaceAndComments() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance(1);
      } else if (c == '/' && peekChar(1) == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') advance(1);
      } else {
        break;
      }
    }
  }

  Status lexNumber(Token& tok) {
    size_t end = pos_;
    if (text_[end] == '-') ++end;
    while (end < text_.size() && isDigit(text_[end])) ++end;
    bool isFloat = false;
    if (end < text_.size() && text_[end] == '.') {
      isFloat = true;
      ++end;
      while (end < text_.size() && isDigit(text_[end])) ++end;
    }
    if (end < text_.size() && (text_[end] == 'e' || text_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < text_.size() && (text_[exp] == '+' || text_[exp] == '-')) ++exp;
      if (exp < text_.size() && isDigit(text_[exp])) {
        isFloat = true;
        end = exp;
        while (end < text_.size() && isDigit(text_[end])) ++end;
      }
    }
    tok.kind = isFloat ? Tok::Float : Tok::Int;
    tok.text = std::string(text_.substr(pos_, end - pos_));
    advance(end - pos_);
    return Status::success();
  }

  Status lexString(Token& tok) {
    int line = line_, col = col_;
    advance(1);  // opening quote
    std::string value;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n')
        return errorAt(line, col, "unterminated string literal (expected a closing '\"' on the same line)");
      char c = text_[pos_];
      if (c == '"') {
        advance(1);
        break;
      }
      if (c != '\\') {
        value += c;
        advance(1);
        continue;
      }
      char e = peekChar(1);
      if (e == '"' || e == '\\') {
        value += e;
        advance(2);
      } else if (e == 'n') {
        value += '\n';
        advance(2);
      } else if (e == 't') {
        value += '\t';
        advance(2);
      } else if (hexValue(e) >= 0 && hexValue(peekChar(2)) >= 0) {
        value += static_cast<char>(hexValue(e) * 16 + hexValue(peekChar(2)));
        advance(3);
      } else {
        return error("invalid escape in string literal (expected \\\", \\\\, \\n, \\t or two hex digits)");
      }
    }
    tok.kind = Tok::String;
    tok.text = std::move(value);
    tok.line = line;
    tok.col = col;
    return Status::success();
  }

  Status lexSigilName(Token& tok, Tok kind, const char* what) {
    int line = line_, col = col_;
    if (peekChar(1) == '"') {
      advance(1);
      KILN_TRY(lexString(tok));
      if (tok.text.empty()) return errorAt(line, col, std::string("expected a non-empty ") + what);
    } else {
      size_t end = pos_ + 1;
      while (end < text_.size() && isNameChar(text_[end])) ++end;
      if (end == pos_ + 1) return error(std::string("expected a ") + what);
      tok.text = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
      advance(end - pos_);
    }
    tok.kind = kind;
    tok.line = line;
    tok.col = col;
    return Status::success();
  }

  std::string_view text_;
  const std::string& file_;
  int lineOffset_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
};

/// A parsed attribute literal before it is matched to the op's declaration.
struct AttrLiteral {
  Attribute value;
  bool emptyList = false;  // `[]`: its kind comes from the declaration
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view filename, int firstLine)
      : file_(filename), lexer_(text, file_, firstLine) {}

  Expected<std::unique_ptr<Module>> parseModule() {
    auto module = std::make_unique<Module>();
    KILN_TRY(consume());
    while (tok_.kind != Tok::Eof) {
      if (!isKeyword("func")) return error("expected 'func' at the start of a function definition");
      KILN_TRY(parseFunction(*module));
    }
    return module;
  }

 private:
  // --- Token helpers ----------------------------------------------------------

  Status consume() { return lexer_.next(tok_); }
  bool isKeyword(std::string_view word) const { return tok_.kind == Tok::Ident && tok_.text == word; }
  Error error(const std::string& message) const { return errorAt(tok_, message); }
  Error errorAt(const Token& at, const std::string& message) const { return lexer_.errorAt(at.line, at.col, message); }
  Location sourceLoc(const Token& at) const { return lexer_.location(at.line, at.col); }

  /// Consumes a token of `kind`, or fails with "expected <what>".
  Status expect(Tok kind, const std::string& what) {
    if (tok_.kind != kind) return error("expected " + what + describeFound());
    return consume();
  }

  /// ", found 'x'" for messages about the current token.
  std::string describeFound() const {
    switch (tok_.kind) {
      case Tok::Eof: return ", found end of input";
      case Tok::String: return ", found a string";
      case Tok::FuncName: return ", found '@" + tok_.text + "'";
      case Tok::ValueName: return ", found '%" + tok_.text + "'";
      default: return ", found '" + tok_.text + "'";
    }
  }

  // --- Literals ---------------------------------------------------------------

  Status parseInt(const Token& t, int64_t& out) const {
    const char* begin = t.text.data();
    const char* end = begin + t.text.size();
    auto [ptr, ec] = std::from_chars(begin, end, out);
    if (ec != std::errc() || ptr != end) return errorAt(t, "integer literal " + t.text + " does not fit in 64 bits");
    return Status::success();
  }

  Status parseFloat(const Token& t, double& out) const {
    std::string_view s = t.text;
    bool negative = !s.empty() && s[0] == '-';
    std::string_view body = negative ? s.substr(1) : s;
    if (body == "inf" || body == "nan") {
      out = body == "inf" ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
      if (negative) out = -out;
      return Status::success();
    }
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || ptr != s.data() + s.size())
      return errorAt(t, "float literal " + t.text + " is out of the range of f64");
    return Status::success();
  }

  bool atFloatWord() const { return isKeyword("inf") || isKeyword("nan"); }

  // --- Types ------------------------------------------------------------------

  Status parseType(TensorType& out) {
    Token start = tok_;
    if (tok_.kind != Tok::Ident) return error("expected a tensor type such as f32[2,?]" + describeFound());
    auto dtype = parseDType(tok_.text);
    if (!dtype)
      return error("unknown element type '" + tok_.text +
                   "' (expected f64, f32, f16, bf16, i64, i32, i16, i8, u8 or bool)");
    out.dtype = *dtype;
    out.shape.clear();
    KILN_TRY(consume());
    KILN_TRY(expect(Tok::LSquare, "'[' after element type " + start.text));
    int64_t elements = 1;
    if (tok_.kind != Tok::RSquare) {
      while (true) {
        if (tok_.kind == Tok::Question) {
          out.shape.push_back(Dim::unknown());
        } else if (tok_.kind == Tok::Ident) {
          out.shape.push_back(Dim::symbolic(tok_.text));
        } else if (tok_.kind == Tok::Int) {
          int64_t n = 0;
          if (tok_.text[0] == '-' || !parseInt(tok_, n).ok() || n > kMaxElements)
            return error("dimension " + tok_.text + " is out of range (expected 0 to 2^40, '?' or a symbol)");
          if (n != 0 && elements > kMaxElements / n)
            return error("type " + start.text + " has more than 2^40 elements");
          elements *= n;
          out.shape.push_back(Dim::fixed(n));
        } else {
          return error("expected a dimension (an integer, '?' or a symbol)" + describeFound());
        }
        KILN_TRY(consume());
        if (tok_.kind == Tok::RSquare) break;
        KILN_TRY(expect(Tok::Comma, "',' or ']' in the dimensions of a type"));
      }
    }
    return consume();
  }

  // --- Locations --------------------------------------------------------------

  /// loc("file":line:col) | loc("name") | loc("file":"name"), after `loc`.
  Status parseLoc(Location& out) {
    KILN_TRY(consume());
    KILN_TRY(expect(Tok::LParen, "'(' after 'loc'"));
    if (tok_.kind != Tok::String) return error("expected a string in loc(...)" + describeFound());
    std::string first = tok_.text;
    KILN_TRY(consume());
    if (tok_.kind == Tok::RParen) {
      out = Location::named(std::move(first));
      return consume();
    }
    KILN_TRY(expect(Tok::Colon, "':' or ')' after the first string of loc(...)"));
    if (tok_.kind == Tok::String) {
      out = Location::named(tok_.text, std::move(first));
      KILN_TRY(consume());
    } else {
      int64_t line = 0, col = 0;
      KILN_TRY(parseLocNumber(line, "line"));
      KILN_TRY(expect(Tok::Colon, "':' between line and column in loc(...)"));
      KILN_TRY(parseLocNumber(col, "column"));
      out = Location::fileLineCol(std::move(first), static_cast<int>(line), static_cast<int>(col));
    }
    return expect(Tok::RParen, "')' to close loc(...)");
  }

  Status parseLocNumber(int64_t& out, const char* what) {
    if (tok_.kind != Tok::Int || tok_.text[0] == '-' || !parseInt(tok_, out).ok() ||
        out > std::numeric_limits<int>::max())
      return error(std::string("expected a ") + what + " number (0 to 2^31-1) in loc(...)" + describeFound());
    return consume();
  }

  // --- Functions --------------------------------------------------------------

  Status parseFunction(Module& module) {
    Token funcTok = tok_;
    KILN_TRY(consume());  // func
    if (tok_.kind != Tok::FuncName) return error("expected a function name like @main after 'func'" + describeFound());
    if (!functionNames_.insert(tok_.text).second) return error("redefinition of function @" + tok_.text);
    auto f = std::make_unique<Function>(tok_.text);
    f->setLoc(sourceLoc(funcTok));
    values_.clear();
    KILN_TRY(consume());
    KILN_TRY(expect(Tok::LParen, "'(' after the function name"));
    if (tok_.kind != Tok::RParen) {
      while (true) {
        if (tok_.kind != Tok::ValueName) return error("expected an argument like %x: f32[2]" + describeFound());
        Token nameTok = tok_;
        KILN_TRY(consume());
        KILN_TRY(expect(Tok::Colon, "':' after argument %" + nameTok.text));
        TensorType type;
        KILN_TRY(parseType(type));
        Value* arg = f->addArgument(std::move(type), nameTok.text);
        KILN_TRY(define(nameTok, arg));
        if (tok_.kind == Tok::Equal) {
          KILN_TRY(consume());
          Token valueTok = tok_;
          if (!isKeyword("dense")) return error("expected dense<...> as the default of argument %" + nameTok.text + describeFound());
          AttrLiteral literal;
          KILN_TRY(parseDense(literal));
          const DenseTensor& d = literal.value.getTensor();
          if (!typesCompatible(d.type, arg->type()))
            return errorAt(valueTok, "default of argument %" + nameTok.text + " has type " + d.type.str() +
                                         ", which does not match " + arg->type().str());
          f->setArgumentDefault(arg->index(), std::make_shared<const DenseTensor>(d));
        }
        if (tok_.kind == Tok::RParen) break;
        KILN_TRY(expect(Tok::Comma, "',' or ')' after an argument"));
      }
    }
    KILN_TRY(consume());  // ')'
    std::vector<TensorType> results;
    std::vector<std::string> resultNames;
    std::vector<int> resultAliases;
    if (tok_.kind == Tok::Arrow) {
      KILN_TRY(consume());
      if (tok_.kind == Tok::LParen) {
        KILN_TRY(consume());
        if (tok_.kind != Tok::RParen) {
          while (true) {
            std::string name;
            if (tok_.kind == Tok::String) {
              name = tok_.text;
              if (name.empty()) return error("a result name must not be empty");
              KILN_TRY(consume());
              KILN_TRY(expect(Tok::Colon, "':' after the result name \"" + name + "\""));
            }
            resultNames.push_back(std::move(name));
            results.emplace_back();
            KILN_TRY(parseType(results.back()));
            resultAliases.push_back(-1);
            if (isKeyword("aliases")) {
              KILN_TRY(consume());
              if (tok_.kind != Tok::ValueName) return error("expected an argument like %w after 'aliases'" + describeFound());
              auto it = values_.find(tok_.text);
              if (it == values_.end() || !it->second->isArgument())
                return error("result " + std::to_string(results.size() - 1) + " aliases %" + tok_.text +
                             ", which is not an argument of @" + f->name());
              resultAliases.back() = it->second->index();
              KILN_TRY(consume());
            }
            if (tok_.kind == Tok::RParen) break;
            KILN_TRY(expect(Tok::Comma, "',' or ')' after the result types"));
          }
        }
        KILN_TRY(consume());  // ')'
      } else {
        resultNames.emplace_back();
        results.emplace_back();
        KILN_TRY(parseType(results.back()));
      }
    }
    f->setResultTypes(std::move(results));
    for (size_t i = 0; i < resultNames.size(); ++i) f->setResultName(i, std::move(resultNames[i]));
    for (size_t i = 0; i < resultAliases.size(); ++i) f->setResultAlias(i, resultAliases[i]);
    if (isKeyword("loc")) {
      Location loc;
      KILN_TRY(parseLoc(loc));
      f->setLoc(std::move(loc));
    }
    KILN_TRY(expect(Tok::LBrace, "'{' to begin the body of @" + f->name()));
    while (tok_.kind != Tok::RBrace) {
      if (tok_.kind == Tok::Eof) return error("expected '}' at the end of @" + f->name() + describeFound());
      KILN_TRY(parseOp(*f));
    }
    KILN_TRY(consume());  // '}'
    module.addFunction(std::move(f));
    return Status::success();
  }

  /// Types separated by commas up to `close` (which is consumed); the list
  /// may be empty.
  Status parseTypeList(std::vector<TensorType>& out, Tok close, const std::string& closeWhat) {
    if (tok_.kind == close) return consume();
    while (true) {
      out.emplace_back();
      KILN_TRY(parseType(out.back()));
      if (tok_.kind == close) return consume();
      KILN_TRY(expect(Tok::Comma, "',' or " + closeWhat));
    }
  }

  Status define(const Token& nameTok, Value* v) {
    if (!values_.emplace(nameTok.text, v).second) return errorAt(nameTok, "redefinition of value %" + nameTok.text);
    return Status::success();
  }

  Status lookupValue(std::vector<Value*>& out) {
    if (tok_.kind != Tok::ValueName) return error("expected a value like %x" + describeFound());
    auto it = values_.find(tok_.text);
    if (it == values_.end()) return error("use of undefined value %" + tok_.text);
    out.push_back(it->second);
    return consume();
  }

  // --- Ops --------------------------------------------------------------------

  Status parseOp(Function& f) {
    Token first = tok_;
    if (isKeyword("return")) return parseReturn(f);

    std::vector<Token> resultNames;
    while (tok_.kind == Tok::ValueName) {
      resultNames.push_back(tok_);
      KILN_TRY(consume());
      if (tok_.kind == Tok::Equal) break;
      KILN_TRY(expect(Tok::Comma, "',' or '=' after result %" + resultNames.back().text));
    }
    if (!resultNames.empty()) KILN_TRY(consume());  // '='
    if (tok_.kind != Tok::Ident) return error("expected an op name" + describeFound());
    auto kind = lookupOp(tok_.text);
    if (!kind) return error("unknown op '" + tok_.text + "'");
    const OpInfo& info = opInfo(*kind);
    std::string opName = "'" + tok_.text + "'";
    if (*kind == OpKind::Return) return error("'return' has no results");
    KILN_TRY(consume());

    KILN_TRY(expect(Tok::LParen, "'(' after op name " + opName));
    std::vector<Value*> operands;
    if (tok_.kind != Tok::RParen) {
      while (true) {
        KILN_TRY(lookupValue(operands));
        if (tok_.kind == Tok::RParen) break;
        KILN_TRY(expect(Tok::Comma, "',' or ')' after an operand of " + opName));
      }
    }
    KILN_TRY(consume());  // ')'

    AttrMap attrs;
    const char* after = "operands";
    if (tok_.kind == Tok::LBrace) {
      KILN_TRY(parseAttrDict(info, attrs));
      after = "attributes";
    }

    std::vector<TensorType> types;
    if (!resultNames.empty()) {
      if (tok_.kind != Tok::Colon) return error("expected ':' after " + std::string(after) + " of " + opName);
      KILN_TRY(consume());
      while (true) {
        types.emplace_back();
        KILN_TRY(parseType(types.back()));
        if (tok_.kind != Tok::Comma) break;
        KILN_TRY(consume());
      }
    } else if (tok_.kind == Tok::Colon) {
      return error("op " + opName + " has result types but no result names (expected '%name = ' before it)");
    }
    if (types.size() != resultNames.size())
      return errorAt(first, "op " + opName + " declares " + std::to_string(resultNames.size()) + " result" +
                                (resultNames.size() == 1 ? "" : "s") + " but has " + std::to_string(types.size()) +
                                " type" + (types.size() == 1 ? "" : "s"));

    std::vector<std::unique_ptr<Function>> regions;
    while (tok_.kind == Tok::LBrace) {
      regions.emplace_back();
      KILN_TRY(parseRegion(first, types, regions.back()));
    }

    Location loc = sourceLoc(first);
    if (isKeyword("loc")) KILN_TRY(parseLoc(loc));

    Op* op =
        f.insert(nullptr, Op::create(*kind, std::move(operands), std::move(types), std::move(attrs), std::move(loc)));
    for (auto& region : regions) {
      region->setLoc(op->loc());
      op->addRegion(std::move(region));
    }
    for (size_t i = 0; i < resultNames.size(); ++i) {
      op->result(i)->setName(resultNames[i].text);
      KILN_TRY(define(resultNames[i], op->result(i)));
    }
    return Status::success();
  }

  /// `{ ^(%a: T, ...) [-> (T, ...)]: op* }` after an op's types: a body
  /// with its own names, which cannot see the values around it. Its result
  /// types are the op's unless it declares its own (the bodies of `if` and
  /// `loop`); the verifier checks its `return` against them.
  Status parseRegion(const Token& opTok, const std::vector<TensorType>& resultTypes, std::unique_ptr<Function>& out) {
    if (regionDepth_ >= kMaxRegionDepth)
      return error("regions nest more than " + std::to_string(kMaxRegionDepth) + " deep");
    KILN_TRY(consume());  // '{'
    KILN_TRY(expect(Tok::Caret, "'^' to begin the arguments of a region"));
    KILN_TRY(expect(Tok::LParen, "'(' after '^'"));
    auto region = std::make_unique<Function>("");
    region->setLoc(sourceLoc(opTok));
    region->setResultTypes(resultTypes);
    // The region's names are its own; the enclosing function's come back after.
    std::unordered_map<std::string, Value*> outer;
    outer.swap(values_);
    ++regionDepth_;
    Status status = parseRegionBody(*region);
    --regionDepth_;
    values_.swap(outer);
    KILN_TRY(std::move(status));
    out = std::move(region);
    return Status::success();
  }

  Status parseRegionBody(Function& region) {
    if (tok_.kind != Tok::RParen) {
      while (true) {
        if (tok_.kind != Tok::ValueName) return error("expected a region argument like %a" + describeFound());
        Token nameTok = tok_;
        KILN_TRY(consume());
        KILN_TRY(expect(Tok::Colon, "':' after region argument %" + nameTok.text));
        TensorType type;
        KILN_TRY(parseType(type));
        KILN_TRY(define(nameTok, region.addArgument(std::move(type), nameTok.text)));
        if (tok_.kind == Tok::RParen) break;
        KILN_TRY(expect(Tok::Comma, "',' or ')' after a region argument"));
      }
    }
    KILN_TRY(consume());  // ')'
    if (tok_.kind == Tok::Arrow) {
      KILN_TRY(consume());
      KILN_TRY(expect(Tok::LParen, "'(' before the result types of a region"));
      std::vector<TensorType> types;
      KILN_TRY(parseTypeList(types, Tok::RParen, "')' after the result types of a region"));
      region.setResultTypes(std::move(types));
    }
    KILN_TRY(expect(Tok::Colon, "':' after the arguments of a region"));
    while (tok_.kind != Tok::RBrace) {
      if (tok_.kind == Tok::Eof) return error("expected '}' at the end of a region" + describeFound());
      KILN_TRY(parseOp(region));
    }
    return consume();  // '}'
  }

  /// `return` [%v (, %v)*] [loc(...)]
  Status parseReturn(Function& f) {
    Token first = tok_;
    KILN_TRY(consume());
    std::vector<Value*> operands;
    if (tok_.kind == Tok::ValueName) {
      while (true) {
        KILN_TRY(lookupValue(operands));
        if (tok_.kind != Tok::Comma) break;
        KILN_TRY(consume());
      }
    }
    Location loc = sourceLoc(first);
    if (isKeyword("loc")) KILN_TRY(parseLoc(loc));
    f.insert(nullptr, Op::create(OpKind::Return, std::move(operands), {}, {}, std::move(loc)));
    return Status::success();
  }

  // --- Attributes -------------------------------------------------------------

  /// `{name = value, ...}`, each checked against the op table's declaration.
  Status parseAttrDict(const OpInfo& info, AttrMap& attrs) {
    std::string opName = "'" + std::string(info.mnemonic) + "'";
    KILN_TRY(consume());  // '{'
    if (tok_.kind == Tok::RBrace) return consume();
    while (true) {
      if (tok_.kind != Tok::Ident)
        return error("expected an attribute name in the attributes of " + opName + describeFound());
      Token nameTok = tok_;
      const AttrSpec* spec = info.findAttr(tok_.text);
      if (!spec) return error("unknown attribute '" + tok_.text + "' for " + opName + " (" + expectedAttrs(info) + ")");
      if (attrs.count(tok_.text)) return error("duplicate attribute '" + tok_.text + "' for " + opName);
      KILN_TRY(consume());
      KILN_TRY(expect(Tok::Equal, "'=' after attribute name '" + nameTok.text + "'"));
      Token valueTok = tok_;
      AttrLiteral literal;
      KILN_TRY(parseAttrValue(literal));
      auto value = convertAttr(literal, *spec);
      if (!value)
        return errorAt(valueTok, "attribute '" + nameTok.text + "' of " + opName + " expects " +
                                     withArticle(attrKindName(spec->kind)) + ", got " +
                                     (literal.emptyList ? std::string("an empty list")
                                                        : withArticle(attrKindName(literal.value.kind()))));
      attrs.emplace(nameTok.text, std::move(*value));
      if (tok_.kind == Tok::RBrace) return consume();
      KILN_TRY(expect(Tok::Comma, "',' or '}' after attribute '" + nameTok.text + "'"));
    }
  }

  static std::string expectedAttrs(const OpInfo& info) {
    if (info.attrs.empty()) return "it has no attributes";
    std::string s = "expected: ";
    for (size_t i = 0; i < info.attrs.size(); ++i) s += (i ? ", " : "") + std::string(info.attrs[i].name);
    return s;
  }

  /// The literal as the declared kind: ints widen to floats, `[]` takes the
  /// declared list kind. Nothing else converts.
  static std::optional<Attribute> convertAttr(const AttrLiteral& literal, const AttrSpec& spec) {
    AttrKind got = literal.value.kind();
    if (literal.emptyList) {
      if (spec.kind == AttrKind::Ints) return Attribute(std::vector<int64_t>{});
      if (spec.kind == AttrKind::Floats) return Attribute(std::vector<double>{});
      return std::nullopt;
    }
    if (got == spec.kind) return literal.value;
    if (got == AttrKind::Int && spec.kind == AttrKind::Float)
      return Attribute(static_cast<double>(literal.value.getInt()));
    if (got == AttrKind::Ints && spec.kind == AttrKind::Floats) {
      std::vector<double> v;
      for (int64_t x : literal.value.getInts()) v.push_back(static_cast<double>(x));
      return Attribute(std::move(v));
    }
    return std::nullopt;
  }

  Status parseAttrValue(AttrLiteral& out) {
    switch (tok_.kind) {
      case Tok::Int: {
        int64_t v = 0;
        KILN_TRY(parseInt(tok_, v));
        out.value = Attribute(v);
        return consume();
      }
      case Tok::Float: {
        double v = 0;
        KILN_TRY(parseFloat(tok_, v));
        out.value = Attribute(v);
        return consume();
      }
      case Tok::String: out.value = Attribute(tok_.text); return consume();
      case Tok::LSquare: return parseNumberList(out);
      case Tok::Ident:
        if (isKeyword("true") || isKeyword("false")) {
          out.value = Attribute(tok_.text == "true");
          return consume();
        }
        if (atFloatWord()) {
          double v = 0;
          KILN_TRY(parseFloat(tok_, v));
          out.value = Attribute(v);
          return consume();
        }
        if (isKeyword("dense")) return parseDense(out);
        break;
      default: break;
    }
    return error("expected an attribute value (a number, true/false, a string, a list or dense<...>)" +
                 describeFound());
  }

  /// `[1, 2]` (int list) or `[1.0, 2]` (float list, when any element is a float).
  Status parseNumberList(AttrLiteral& out) {
    KILN_TRY(consume());  // '['
    std::vector<int64_t> ints;
    std::vector<double> floats;
    bool anyFloat = false;
    if (tok_.kind == Tok::RSquare) {
      out.emptyList = true;
      out.value = Attribute(std::vector<int64_t>{});
      return consume();
    }
    while (true) {
      if (tok_.kind == Tok::Int) {
        int64_t v = 0;
        KILN_TRY(parseInt(tok_, v));
        ints.push_back(v);
        floats.push_back(static_cast<double>(v));
      } else if (tok_.kind == Tok::Float || atFloatWord()) {
        double v = 0;
        KILN_TRY(parseFloat(tok_, v));
        anyFloat = true;
        floats.push_back(v);
      } else {
        return error("expected a number in the list" + describeFound());
      }
      KILN_TRY(consume());
      if (tok_.kind == Tok::RSquare) break;
      KILN_TRY(expect(Tok::Comma, "',' or ']' in the list"));
    }
    out.value = anyFloat ? Attribute(std::move(floats)) : Attribute(std::move(ints));
    return consume();
  }

  /// `dense<TYPE>[e0, e1, ...]`: the elements in row-major order.
  Status parseDense(AttrLiteral& out) {
    KILN_TRY(consume());  // dense
    KILN_TRY(expect(Tok::Less, "'<' after 'dense'"));
    Token typeTok = tok_;
    TensorType type;
    KILN_TRY(parseType(type));
    if (!type.isStatic()) return errorAt(typeTok, "dense tensor type " + type.str() + " must have static dims");
    KILN_TRY(expect(Tok::Greater, "'>' after the type of dense<...>"));
    KILN_TRY(expect(Tok::LSquare, "'[' to begin the elements of dense<" + type.str() + ">"));
    int64_t expected = numElements(type.shape);
    // Elements are gathered before any storage for the type is allocated,
    // so a huge declared type costs nothing unless its data is present.
    std::vector<Token> elems;
    if (tok_.kind != Tok::RSquare) {
      while (true) {
        if (static_cast<int64_t>(elems.size()) >= expected)
          return error("dense<" + type.str() + "> expects " + std::to_string(expected) + " element" +
                       (expected == 1 ? "" : "s") + " but has more");
        elems.push_back(tok_);
        KILN_TRY(consume());
        if (tok_.kind == Tok::RSquare) break;
        KILN_TRY(expect(Tok::Comma, "',' or ']' in the elements of dense<" + type.str() + ">"));
      }
    }
    if (static_cast<int64_t>(elems.size()) != expected)
      return error("dense<" + type.str() + "> expects " + std::to_string(expected) + " element" +
                   (expected == 1 ? "" : "s") + " but has " + std::to_string(elems.size()));
    KILN_TRY(consume());  // ']'
    DenseTensor t = DenseTensor::zeros(type);
    for (size_t i = 0; i < elems.size(); ++i) KILN_TRY(storeElement(t, static_cast<int64_t>(i), elems[i]));
    out.value = Attribute(std::move(t));
    return Status::success();
  }

  Status storeElement(DenseTensor& t, int64_t i, const Token& e) const {
    DType dt = t.type.dtype;
    std::string dtName(dtypeName(dt));
    if (dt == DType::Bool) {
      if (e.kind != Tok::Ident || (e.text != "true" && e.text != "false"))
        return errorAt(e, "expected true or false as an element of a bool tensor, found '" + e.text + "'");
      t.setInt(i, e.text == "true");
      return Status::success();
    }
    if (isFloat(dt)) {
      double v = 0;
      if (e.kind == Tok::Int) {
        int64_t n = 0;
        KILN_TRY(parseInt(e, n));
        v = static_cast<double>(n);
      } else if (e.kind == Tok::Float || (e.kind == Tok::Ident && (e.text == "inf" || e.text == "nan"))) {
        KILN_TRY(parseFloat(e, v));
      } else {
        return errorAt(e, "expected a number as an element of a " + dtName + " tensor, found '" + e.text + "'");
      }
      t.setDouble(i, v);
      return Status::success();
    }
    if (e.kind != Tok::Int)
      return errorAt(e, "expected an integer as an element of a " + dtName + " tensor, found '" + e.text + "'");
    if (dt == DType::U64) {
      // 0 to 2^64 - 1, beyond int64.
      uint64_t u = 0;
      const char* end = e.text.data() + e.text.size();
      auto [ptr, ec] = std::from_chars(e.text.data(), end, u);
      if (ec != std::errc() || ptr != end)
        return errorAt(e, "element " + e.text + " is out of the range of u64 (0 to 18446744073709551615)");
      t.setInt(i, static_cast<int64_t>(u));
      return Status::success();
    }
    int64_t v = 0;
    KILN_TRY(parseInt(e, v));
    auto [lo, hi] = integerRange(dt);
    if (v < lo || v > hi)
      return errorAt(e, "element " + e.text + " is out of the range of " + dtName + " (" + std::to_string(lo) + " to " +
                            std::to_string(hi) + ")");
    t.setInt(i, v);
    return Status::success();
  }

  static std::pair<int64_t, int64_t> integerRange(DType dt) {
    switch (dt) {
      case DType::I32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
      case DType::I16: return {std::numeric_limits<int16_t>::min(), std::numeric_limits<int16_t>::max()};
      case DType::I8: return {std::numeric_limits<int8_t>::min(), std::numeric_limits<int8_t>::max()};
      case DType::U8: return {0, 255};
      case DType::U16: return {0, std::numeric_limits<uint16_t>::max()};
      case DType::U32: return {0, std::numeric_limits<uint32_t>::max()};
      default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
    }
  }

  std::string file_;
  Lexer lexer_;
  Token tok_;
  /// Names of the functions parsed so far.
  std::unordered_set<std::string> functionNames_;
  /// Values visible in the function (or region) being parsed, by name.
  std::unordered_map<std::string, Value*> values_;
  /// How many regions enclose the op being parsed.
  int regionDepth_ = 0;
  static constexpr int kMaxRegionDepth = 32;
};

}  // namespace

Expected<std::unique_ptr<Module>> parseModule(std::string_view text, std::string_view filename, int firstLine) {
  Parser parser(text, filename, firstLine);
  return parser.parseModule();
}

}  // namespace kiln
