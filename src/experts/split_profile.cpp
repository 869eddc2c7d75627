#include "experts/split_profile.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "io/mapped_file.h"

namespace moetier {

namespace {

constexpr const char* kFileName = "hybrid-split.json";

// The file's text; empty when it does not exist.
Expected<std::string> ReadText(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::string();
  return ReadTextFile(file);
}

// The text as a JSON object (empty text: an empty object).
Expected<nlohmann::json> ParseProfile(std::string_view text, const std::string& where) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(where + ": not a JSON object of hybrid split rates (delete it; the " +
                         "next hybrid run writes it again)");
  return j;
}

}  // namespace

std::filesystem::path SplitProfilePath() {
  if (const char* dir = std::getenv("MOETIER_CACHE_DIR"); dir != nullptr && *dir != '\0')
    return std::filesystem::path(dir) / kFileName;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::filesystem::path(xdg) / "moetier" / kFileName;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::filesystem::path(home) / ".cache" / "moetier" / kFileName;
  return {};
}

std::string SplitProfileKey(const std::string& gpu, const std::string& dtype, uint64_t expert_bytes,
                            int threads) {
  return gpu + " | " + dtype + " | " + std::to_string(expert_bytes) + " B/expert | " +
         std::to_string(threads) + " threads";
}

Expected<std::optional<SplitRates>> LoadSplitRates(const std::filesystem::path& file,
                                                   const std::string& key) {
  MT_ASSIGN_OR_RETURN(std::string text, ReadText(file));
  return ParseSplitRates(text, key, file.string());
}

Expected<std::optional<SplitRates>> ParseSplitRates(std::string_view text, const std::string& key,
                                                    const std::string& where) {
  MT_ASSIGN_OR_RETURN(nlohmann::json j, ParseProfile(text, where));
  const auto it = j.find(key);
  if (it == j.end()) return std::optional<SplitRates>();
  const nlohmann::json& e = *it;
  auto number = [&](const char* field) -> double {
    const auto f = e.is_object() ? e.find(field) : e.end();
    return f != e.end() && f->is_number() ? f->get<double>() : -1.0;
  };
  SplitRates r;
  r.copy_ns_per_expert = number("copy_ns_per_expert");
  r.cpu_ns_per_expert = number("cpu_ns_per_expert");
  r.split_steps = std::max<int64_t>(0, static_cast<int64_t>(std::min(number("split_steps"), 1e15)));
  if (!(r.copy_ns_per_expert > 0) || !(r.cpu_ns_per_expert > 0))
    return Status::Error(where + ": the rates of \"" + key +
                         "\" are not positive numbers (delete the file; the next hybrid run " +
                         "writes it again)");
  return std::optional<SplitRates>(r);
}

Status SaveSplitRates(const std::filesystem::path& file, const std::string& key,
                      const SplitRates& rates) {
  Expected<std::string> text = ReadText(file);
  Expected<nlohmann::json> old =
      text.ok() ? ParseProfile(*text, file.string()) : Expected<nlohmann::json>(text.status());
  nlohmann::json j = old.ok() ? std::move(*old) : nlohmann::json::object();
  j[key] = {{"copy_ns_per_expert", rates.copy_ns_per_expert},
            {"cpu_ns_per_expert", rates.cpu_ns_per_expert},
            {"split_steps", rates.split_steps}};
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec)
    return Status::Error(file.parent_path().string() + ": cannot be created: " + ec.message());
  const std::filesystem::path tmp = file.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) return Status::Error(tmp.string() + ": cannot be written");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status::Error(file.string() + ": cannot be replaced");
  }
  return OkStatus();
}

}  // namespace moetier
