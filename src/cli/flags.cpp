#include "cli/flags.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "io/mapped_file.h"

namespace moetier::cli {

namespace {

std::string FormatNumber(double v) {
  if (v == std::numeric_limits<double>::max()) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") + 1 - b);
}

// Levenshtein distance, for "did you mean" (command names are short).
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

CLI::Validator WholeNumber(int64_t min, int64_t max, std::string zero_means) {
  std::string range = max == std::numeric_limits<int64_t>::max()
                          ? ">= " + std::to_string(min)
                          : "from " + std::to_string(min) + " to " + std::to_string(max);
  if (!zero_means.empty()) range += " (0 = " + zero_means + ")";
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        const std::string t = Trimmed(text);
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v < min || v > max)
          return "must be a whole number " + range + ", not '" + text + "'";
        return std::string();
      },
      range);
}

CLI::Validator FiniteNumber(double min, double max, bool min_open, bool max_open) {
  const std::string range = std::string(min_open ? "(" : "[") + FormatNumber(min) + ", " +
                            FormatNumber(max) + (max_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::string t = Trimmed(text);
        char* end = nullptr;
        errno = 0;
        const double v = t.empty() ? 0.0 : std::strtod(t.c_str(), &end);
        const bool parsed = !t.empty() && end == t.c_str() + t.size() && errno != ERANGE;
        const bool in_range = parsed && std::isfinite(v) && (min_open ? v > min : v >= min) &&
                              (max_open ? v < max : v <= max);
        if (!in_range) return "must be a finite number in " + range + ", not '" + text + "'";
        return std::string();
      },
      range);
}

void ShowDefaultsInHelp(CLI::App& app) {
  app.option_defaults()->always_capture_default();
}

std::string FormatParseError(const CLI::App* app, const CLI::Error& e) {
  std::string what = e.what();
  std::replace(what.begin(), what.end(), '\n', ' ');
  while (!what.empty() && what.back() == ' ') what.pop_back();
  // The subcommand being parsed, for the pointer to its help.
  std::string cmd = "moetier";
  if (const auto chosen = app->get_subcommands(); !chosen.empty())
    cmd += " " + chosen.front()->get_name();
  return "error: " + what + " (see `" + cmd + " --help`)\n";
}

std::string UnknownCommandError(std::string_view arg, const std::vector<std::string>& commands) {
  if (arg.empty() || arg[0] == '-') return "";
  if (std::find(commands.begin(), commands.end(), arg) != commands.end()) return "";
  std::string list, nearest;
  size_t best = 3;  // a typo is at most two edits away
  for (const auto& c : commands) {
    list += (list.empty() ? "" : ", ") + c;
    const size_t d = EditDistance(arg, c);
    if (d < best || (c.rfind(arg, 0) == 0 && best > 0)) {
      best = c.rfind(arg, 0) == 0 ? 0 : d;
      nearest = c;
    }
  }
  std::string msg = "unknown command '" + std::string(arg) + "'";
  if (!nearest.empty()) msg += " (did you mean '" + nearest + "'?)";
  return msg + "; the commands are " + list + "; `moetier --help` explains them";
}

Status CheckWritableFile(const std::string& path, std::string_view flag) {
  const std::string what = path + ": cannot write (" + std::string(flag) + "): ";
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::directory)
    return Status::Error(what + "it is a directory; give a file name");
  const bool existed = st.type() != std::filesystem::file_type::not_found;
  if (ec && existed) return Status::Error(what + ec.message());
  // O_NONBLOCK: a FIFO nobody reads must fail here, not hang.
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return Status::Error(what + std::strerror(errno));
  ::close(fd);
  if (!existed) std::filesystem::remove(path, ec);
  return OkStatus();
}

Expected<std::string> ReadInputFile(const std::string& path, std::string_view flag) {
  auto text = ReadTextFile(path);
  if (!text.ok()) return Status::Error(text.message() + " (" + std::string(flag) + ")");
  return text;
}

}  // namespace moetier::cli
