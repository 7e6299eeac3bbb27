// Prints Kiln IR in the text form described in docs/ir.md. Parsing what is
// printed gives back the same module: parse(print(m)) prints as print(m).
#pragma once

#include <ostream>
#include <string>
#include <unordered_map>

#include "ir/IR.h"

namespace kiln {

std::string print(const Module& m);
std::string print(const Function& f);
void print(const Module& m, std::ostream& os);
void print(const Function& f, std::ostream& os);
/// One op on one line, with the value names its function would print.
std::string printOp(const Op& op);
/// The name (without `%`) the printer gives each argument and top-level op
/// result of `f`: its name hint when usable and unique, else a number. Tools
/// that refer to values next to printed IR (the Kiln format writer, memory
/// plans) use it so that their names match the text.
std::unordered_map<const Value*, std::string> printedValueNames(const Function& f);
/// `value = dense<f32[2]>[1.0, 2.0]`-style text of an attribute value.
std::string printAttribute(const Attribute& a);

}  // namespace kiln
