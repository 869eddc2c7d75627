// Reading JSON files (config.json, indexes) with one error style: "<file>: not valid JSON: ...".
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace moetier {

Expected<nlohmann::json> ParseJsonText(const std::string& text, const std::string& source);
Expected<nlohmann::json> ReadJsonFile(const std::filesystem::path& path);

}  // namespace moetier
