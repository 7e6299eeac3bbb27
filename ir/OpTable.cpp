// Builds the op table from Ops.def.
#include "ir/OpTable.h"

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln {

namespace {

// Each op's attribute specs in their own array, so OpInfo can hold a span.
#define KILN_OP(Enum, Mnemonic, Class, MinOps, MaxOps, NumRes, Flags, Summary, ...) \
  const AttrSpec kAttrs##Enum[] = {__VA_OPT__(__VA_ARGS__, ){"", AttrKind::Int, kOptional, {}}};
#include "ir/Ops.def"

const OpInfo kOpTable[] = {
#define KILN_OP(Enum, Mnemonic, Class, MinOps, MaxOps, NumRes, Flags, Summary, ...)                  \
  {OpKind::Enum, Mnemonic, OpClass::Class, MinOps, MaxOps, NumRes, Flags, Summary,                     \
   std::span<const AttrSpec>(kAttrs##Enum, std::size(kAttrs##Enum) - 1)},
#include "ir/Ops.def"
};

static_assert(std::size(kOpTable) == kNumOpKinds);

}  // namespace

const AttrSpec* OpInfo::findAttr(std::string_view name) const {
  for (const AttrSpec& spec : attrs)
    if (spec.name == name) return &spec;
  return nullptr;
}

const OpInfo& opInfo(OpKind kind) { return kOpTable[static_cast<size_t>(kind)]; }
std::string_view opName(OpKind kind) { return opInfo(kind).mnemonic; }
std::span<const OpInfo> allOps() { return kOpTable; }

std::optional<OpKind> lookupOp(std::string_view mnemonic) {
  static const auto* byName = [] {
    auto* m = new std::unordered_map<std::string_view, OpKind>();
    for (const OpInfo& info : kOpTable) (*m)[info.mnemonic] = info.kind;
    return m;
  }();
  auto it = byName->find(mnemonic);
  if (it == byName->end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln
