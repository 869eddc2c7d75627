// Fuzzes the config.json parser as the loader calls it (model/model_source.cpp): the class named
// by `architectures[0]` picks the architecture's own parser (ArchSpec::parse_config). Any text
// gives a ModelConfig or an error naming the file, never a crash; an accepted config keeps
// ParseModelConfig's promises, and the byte counts the loader derives from it (each weight as
// f32, the widest dtype, summed over the model) fit int64.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "io/json_file.h"
#include "model/arch/arch.h"
#include "model/config.h"

namespace {

using moetier::ModelConfig;

// int64 arithmetic that remembers an overflow instead of wrapping.
struct Checked {
  int64_t v = 0;
  bool ok = true;
  Checked& Mul(int64_t b) {
    ok = ok && !__builtin_mul_overflow(v, b, &v);
    return *this;
  }
  Checked& Add(const Checked& b) {
    ok = ok && b.ok && !__builtin_add_overflow(v, b.v, &v);
    return *this;
  }
};

Checked Product(std::initializer_list<int64_t> factors) {
  Checked p{1};
  for (int64_t f : factors) p.Mul(f);
  return p;
}

// Whether the bytes of every weight the config describes, as f32, fit int64.
bool ModelBytesFit(const ModelConfig& c) {
  const int64_t H = c.hidden_size;
  // q and o are [n_heads * head_dim, H], k and v [n_kv_heads * head_dim, H].
  const Checked attn =
      Product({2, H, c.head_dim, c.n_heads}).Add(Product({2, H, c.head_dim, c.n_kv_heads}));
  const Checked moe = Product({3, H, c.expert_intermediate_size, c.n_experts})
                          .Add(Product({c.n_experts, H}));  // the experts and the router
  const Checked dense = Product({3, H, c.dense_intermediate_size});
  Checked total = Product({2, c.vocab_size, H});  // the embedding and lm_head
  for (bool is_moe : c.layer_is_moe) total.Add(attn).Add(is_moe ? moe : dense);
  return total.Mul(4).ok;
}

void CheckAccepted(const ModelConfig& c, std::string_view arch) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (c.architecture != arch) std::abort();
  for (int64_t v : {c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                    c.expert_intermediate_size, c.n_experts, c.n_experts_per_token})
    if (v <= 0) std::abort();
  if (c.n_experts_per_token > c.n_experts || c.n_heads % c.n_kv_heads != 0 || c.head_dim % 2 != 0)
    std::abort();
  if (c.layer_is_moe.size() != static_cast<size_t>(c.n_layers)) std::abort();
  if (c.dense_intermediate_size < 0) std::abort();
  for (bool moe : c.layer_is_moe)
    if (!moe && c.dense_intermediate_size == 0) std::abort();
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1)) std::abort();
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) std::abort();
  // Positions are int32 (backend/batch.h) and the CUDA attention takes the window as one.
  if (c.sliding_window < 0 || c.sliding_window > kInt32Max) std::abort();
  if (c.max_position_embeddings < 0 || c.max_position_embeddings > kInt32Max) std::abort();
  for (int32_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size) std::abort();
  if (c.bos_token_id && (*c.bos_token_id < 0 || *c.bos_token_id >= c.vocab_size)) std::abort();
  if (!ModelBytesFit(c)) std::abort();
  (void)c.n_moe_layers();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz/config.json";
  // The loader's order (ReadConfigFile, OpenModelSource): parse, name the class, find its spec.
  auto j = moetier::ParseJsonText(text, source);
  if (!j.ok()) return 0;
  (void)moetier::DeclaresRopeTheta(*j);
  auto name = moetier::ReadArchitectureName(*j, source);
  if (!name.ok()) return 0;
  const moetier::arch::ArchSpec* spec = moetier::arch::FindArch(*name);
  if (spec == nullptr) return 0;
  auto c = moetier::ParseModelConfig(text, source, spec->parse_config);
  if (c.ok()) {
    CheckAccepted(*c, spec->hf_name);
  } else if (c.message().rfind(source + ": ", 0) != 0) {
    std::abort();  // every error names the file
  }
  return 0;
}
