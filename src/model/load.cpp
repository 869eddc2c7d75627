#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "model/arch/arch.h"
#include "model/causal_lm.h"

namespace moetier {

Expected<std::unique_ptr<CausalLM>> LoadCausalLM(const std::filesystem::path& dir,
                                                 const LoadOptions& options) {
  if (!std::filesystem::is_directory(dir))
    return Status::Error(dir.string() + ": not a directory; --model takes a model directory");
  const std::filesystem::path config_path = dir / "config.json";
  MT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config_path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(config_path.string() + ": not valid JSON: " + e.what());
  }
  MT_ASSIGN_OR_RETURN(std::string arch_name, ReadArchitectureName(j, config_path.string()));
  const arch::ArchSpec* spec = arch::FindArch(arch_name);
  if (spec == nullptr)
    return Status::Error(config_path.string() + ": unknown architecture '" + arch_name +
                         "'; supported: " + arch::SupportedArchNames());
  MT_ASSIGN_OR_RETURN(ModelConfig config,
                      ParseModelConfig(text, config_path.string(), spec->defaults()));
  MT_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::OpenHfDirectory(dir));
  return spec->create(std::move(config), std::move(checkpoint), options.n_threads);
}

}  // namespace moetier
