// The option-table parser behind every `kiln` subcommand (CommandLine.h).
#include "tools/CommandLine.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kiln::cli {

const std::string* ParsedArgs::get(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() || it->second.empty() ? nullptr : &it->second.back();
}

std::vector<std::string> ParsedArgs::all(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

namespace {

std::string validOptions(std::span<const OptionSpec> specs) {
  std::string list;
  for (const OptionSpec& s : specs) {
    list += list.empty() ? "" : ", ";
    list += s.name;
  }
  return list;
}

const OptionSpec* findSpec(std::span<const OptionSpec> specs, std::string_view name) {
  for (const OptionSpec& s : specs)
    if (s.name == name || (!s.alias.empty() && s.alias == name)) return &s;
  return nullptr;
}

}  // namespace

Expected<ParsedArgs> parseArgs(std::string_view command, std::span<const OptionSpec> specs,
                               std::span<const std::string> args) {
  ParsedArgs parsed;
  const std::string where = "'" + std::string(command) + "'";
  bool optionsEnded = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    // "-" alone is a positional (stdin by convention), as is anything after "--".
    if (optionsEnded || arg.size() < 2 || arg[0] != '-') {
      parsed.positionals_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      optionsEnded = true;
      continue;
    }
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    const OptionSpec* spec = findSpec(specs, name);
    if (!spec)
      return Error("unknown option '" + name + "' for " + where + " (valid options: " + validOptions(specs) + ")");
    std::string value;
    if (spec->metavar.empty()) {
      if (eq != std::string::npos) return Error("option '" + name + "' takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return Error("option '" + name + "' needs a value: " + std::string(spec->name) + " " +
                   std::string(spec->metavar));
    }
    auto& slot = parsed.values_[std::string(spec->name)];
    if (!slot.empty() && !spec->repeatable)
      return Error("option '" + std::string(spec->name) + "' is given more than once");
    slot.push_back(std::move(value));
  }
  return parsed;
}

std::string formatOptions(std::span<const OptionSpec> specs) {
  std::vector<std::string> heads;
  size_t width = 0;
  for (const OptionSpec& s : specs) {
    std::string head = "  ";
    if (!s.alias.empty()) head += std::string(s.alias) + ", ";
    head += s.name;
    if (!s.metavar.empty()) head += " " + std::string(s.metavar);
    width = std::max(width, head.size());
    heads.push_back(std::move(head));
  }
  std::string out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out += heads[i] + std::string(width + 2 - heads[i].size(), ' ') + std::string(specs[i].help);
    if (specs[i].repeatable) out += " (repeatable)";
    out += "\n";
  }
  return out;
}

Expected<int64_t> parseInteger(std::string_view text, std::string_view what, int64_t minValue, int64_t maxValue) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < minValue || value > maxValue)
    return Error(std::string(what) + " expects a whole number from " + std::to_string(minValue) + " to " +
                 std::to_string(maxValue) + ", got '" + std::string(text) + "'");
  return value;
}

Expected<double> parseNumber(const std::string& text, std::string_view what) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
    return Error(std::string(what) + " expects a finite number, got '" + text + "'");
  return v;
}

Expected<Precision> precisionOption(const ParsedArgs& args) {
  const std::string* name = args.get("--precision");
  if (!name) return args.has("--allow-tf32") ? Precision::TF32 : Precision::FP32;
  auto precision = parsePrecision(*name);
  if (!precision) return Error("--precision: " + precision.error().message());
  if (args.has("--allow-tf32") && *precision != Precision::TF32)
    return Error("--allow-tf32 means --precision tf32, not " + *name + "; give one of the two");
  return precision;
}

Expected<int64_t> parseByteSize(std::string_view text, std::string_view what) {
  static constexpr std::pair<std::string_view, int64_t> kUnits[] = {
      {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10}, {"B", 1}};
  int64_t scale = 1;
  std::string_view digits = text;
  for (const auto& [suffix, bytes] : kUnits)
    if (digits.ends_with(suffix)) {
      digits.remove_suffix(suffix.size());
      scale = bytes;
      break;
    }
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 1 ||
      value > (int64_t{1} << 50) / scale)
    return Error(std::string(what) + " expects a size such as 512MiB, 2GiB or a number of bytes, got '" +
                 std::string(text) + "'");
  return value * scale;
}

std::string millis(double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", ms);
  return buf;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace kiln::cli
