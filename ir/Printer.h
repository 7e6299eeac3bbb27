// Prints Kiln IR in the text form described in docs/ir.md. Parsing what is
// printed gives back the same module: parse(print(m)) prints as print(m).
#pragma once

#include <ostream>
#include <string>

#include "ir/IR.h"

namespace kiln {

std::string print(const Module& m);
std::string print(const Function& f);
void print(const Module& m, std::ostream& os);
void print(const Function& f, std::ostream& os);
/// One op on one line, with the value names its function would print.
std::string printOp(const Op& op);
/// `value = dense<f32[2]>[1.0, 2.0]`-style text of an attribute value.
std::string printAttribute(const Attribute& a);

}  // namespace kiln
