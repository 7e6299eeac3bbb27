// Formatting of locations and errors.
#include "ir/Support.h"

namespace kiln {

std::string Location::str() const {
  switch (kind) {
    case Kind::Unknown:
      return {};
    case Kind::Source:
    case Kind::FileLineCol:
      return file + ":" + std::to_string(line) + ":" + std::to_string(col);
    case Kind::Named:
      return (file.empty() ? std::string() : file + ": ") + "node '" + name + "'";
  }
  return {};
}

std::string Error::str() const {
  std::string where = loc_.str();
  return (where.empty() ? std::string() : where + ": ") + "error: " + message_;
}

}  // namespace kiln
