// The syntax of a PTX module as PtxParser.cpp reads it, before decoding
// (PtxDecoder.cpp): module variables, function prototypes and bodies, and
// each statement of a body as written, its opcode still a dotted string and
// its operands still names. Views point into the module's text, which must
// outlive the syntax tree.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "test/devices/emulator/Ptx.h"

namespace kiln::emulator::syntax {

struct Operand {
  enum class Kind : uint8_t { Register, Immediate, Symbol, Address, Vector, Sink };
  Kind kind = Kind::Immediate;
  std::string_view name;    // register, symbol, or an address's base (empty: none)
  std::string_view second;  // %p|%q: the second register
  bool negated = false;     // !%p
  // Immediates: an integer, or a float's bits (0f: f32 bits, 0d or decimal: f64 bits).
  enum class Literal : uint8_t { Int, F32, F64 };
  Literal literal = Literal::Int;
  uint64_t bits = 0;
  int64_t offset = 0;             // an address's displacement
  std::vector<Operand> elements;  // a vector's registers
};

struct Instruction {
  std::string_view guard;  // predicate register, empty when unguarded
  bool guardNegated = false;
  std::string_view opcode;  // "ld.global.nc.f32"
  std::vector<Operand> operands;
  // call only: (returns), target, (arguments).
  std::vector<Operand> callReturns;
  std::vector<Operand> callArguments;
  std::string_view text;  // the statement as written, without ';'
  uint32_t line = 0;
};

/// A .reg, .local, .shared or .param declaration: a name (register names
/// with a count, %r<5>, stand for %r0 .. %r4), its element type, and for
/// arrays the element count.
struct Declaration {
  enum class Kind : uint8_t { Register, Local, Shared, Param, Global, Const };
  Kind kind = Kind::Register;
  PtxType type = PtxType::B32;
  uint32_t align = 0;  // 0: the type's size
  std::string_view name;
  uint32_t rangeCount = 0;  // %r<5>: 5; 0 for one named register
  uint64_t arrayCount = 1;  // name[24]: 24; 0 for name[] (extern, unsized)
  bool isArray = false;
  bool isExtern = false;
  std::vector<uint8_t> init;  // .global/.const initializers, as bytes
  uint32_t line = 0;
  uint64_t bytes() const { return typeBytes(type) * (isArray ? arrayCount : 1); }
};

struct Statement {
  enum class Kind : uint8_t { Instruction, Label, Declaration, OpenScope, CloseScope };
  Kind kind = Kind::Instruction;
  Instruction instruction;
  Declaration declaration;
  std::string_view label;
  uint32_t line = 0;
};

struct Function {
  bool isEntry = false;
  std::string_view name;
  std::vector<Declaration> params;
  std::vector<Declaration> returns;
  std::vector<Statement> body;
  bool defined = false;  // false for a prototype (`.func f(...);`) or .extern
  uint32_t maxntid[3] = {0, 0, 0};
  uint32_t reqntid[3] = {0, 0, 0};
  uint32_t line = 0;
};

struct Module {
  std::vector<Function> functions;
  std::vector<Declaration> variables;  // module-level .global, .const, .shared
};

/// Parses `text` into its syntax; throws PtxError on malformed text and on
/// directives it does not implement.
Module parse(std::string_view text);

/// The type a modifier names (".f32" -> F32), None when it names none.
PtxType typeFromName(std::string_view modifier);

}  // namespace kiln::emulator::syntax
