#include "model/generation_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "io/json_file.h"

namespace moetier {

Expected<std::vector<int32_t>> ReadStopTokenIds(const std::filesystem::path& dir,
                                                const ModelConfig& config) {
  std::vector<int32_t> ids = config.eos_token_ids;
  const auto path = dir / "generation_config.json";
  if (std::filesystem::exists(path)) {
    MT_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
    if (j.is_object() && j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
      const auto& v = j["eos_token_id"];
      auto add = [&](const nlohmann::json& e) -> Status {
        if (!e.is_number_integer())
          return Status::Error(path.string() + ": field 'eos_token_id' must hold integers");
        ids.push_back(e.get<int32_t>());
        return OkStatus();
      };
      if (v.is_array()) {
        for (const auto& e : v) MT_RETURN_IF_ERROR(add(e));
      } else {
        MT_RETURN_IF_ERROR(add(v));
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace moetier

namespace moetier {

Expected<SamplingDefaults> ReadSamplingDefaults(const std::filesystem::path& dir) {
  SamplingDefaults d;
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  MT_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  if (!j.is_object()) return Status::Error(path.string() + ": not a JSON object");
  auto number = [&](const char* key, std::optional<float>& out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return OkStatus();
    if (!j[key].is_number())
      return Status::Error(path.string() + ": field '" + key + "' must be a number");
    out = j[key].get<float>();
    return OkStatus();
  };
  MT_RETURN_IF_ERROR(number("temperature", d.temperature));
  MT_RETURN_IF_ERROR(number("top_p", d.top_p));
  MT_RETURN_IF_ERROR(number("min_p", d.min_p));
  MT_RETURN_IF_ERROR(number("repetition_penalty", d.repetition_penalty));
  if (j.contains("top_k") && j["top_k"].is_number_integer()) d.top_k = j["top_k"].get<int32_t>();
  if (j.contains("do_sample") && j["do_sample"].is_boolean())
    d.do_sample = j["do_sample"].get<bool>();
  return d;
}

}  // namespace moetier
