#include "io/json_file.h"

#include "io/mapped_file.h"

namespace moetier {

Expected<nlohmann::json> ParseJsonText(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(source + ": not valid JSON: " + e.what());
  }
}

Expected<nlohmann::json> ReadJsonFile(const std::filesystem::path& path) {
  MT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseJsonText(text, path.string());
}

}  // namespace moetier
