#include "cli/model_options.h"

#include <algorithm>
#include <charconv>

namespace moetier::cli {

void AddModelOptions(CLI::App& cmd, ModelOptions& opts) {
  cmd.add_option("-m,--model", opts.model_dir,
                 "Model directory: a Hugging Face checkpoint (config.json + *.safetensors)")
      ->required();
  cmd.add_option("-t,--threads", opts.n_threads,
                 "CPU threads for the forward (default: every core this process may use)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("-c,--ctx-size", opts.ctx_size,
                 "Context length in tokens (default: the model's maximum, at most 8192)")
      ->check(CLI::NonNegativeNumber);
}

Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts) {
  LoadOptions load;
  load.n_threads = opts.n_threads;
  return LoadCausalLM(opts.model_dir, load);
}

int64_t ContextSize(const ModelOptions& opts, const CausalLM& model) {
  if (opts.ctx_size > 0) return opts.ctx_size;
  const int64_t max_pos = model.config().max_position_embeddings;
  return max_pos > 0 ? std::min(max_pos, kDefaultContext) : kDefaultContext;
}

Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      return Status::Error(flag + ": '" + item + "' is not a token id (expected e.g. 3,17,42)");
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

}  // namespace moetier::cli
