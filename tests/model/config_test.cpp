// config.json parsing: both key spellings real checkpoints use, each architecture's own keys and
// defaults (its ArchSpec::parse_config), and errors that name the field.
#include <gtest/gtest.h>

#include <limits>

#include "model/arch/arch.h"
#include "model/config.h"
#include "support/test_support.h"

namespace moetier {
namespace {

Expected<ModelConfig> Parse(const nlohmann::json& j, const char* arch = "Qwen3MoeForCausalLM") {
  return ParseModelConfig(j.dump(), "config.json", arch::FindArch(arch)->parse_config);
}

nlohmann::json Fixture(const std::string& rel) {
  return nlohmann::json::parse(testing::ReadFile(testing::HfFixture(rel) / "config.json"));
}

TEST(Config, ClassicSpellings) {
  // public/qwen3_moe uses rope_theta and num_experts.
  auto c = Parse(Fixture("qwen3_moe"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->n_experts, 8);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->expert_intermediate_size, 48);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->n_moe_layers(), 4);
}

TEST(Config, NewerSpellings) {
  // realvocab/qwen3_moe_tiny uses rope_parameters and num_local_experts.
  auto c = Parse(Fixture("realvocab/qwen3_moe_tiny"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->n_experts, 4);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_TRUE(c->tie_word_embeddings);
  auto m = Parse(Fixture("mixtral"), "MixtralForCausalLM");
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->n_experts, 4);
  EXPECT_EQ(m->head_dim, 64 / 8);  // head_dim: null → hidden_size / num_attention_heads
  EXPECT_EQ(m->expert_intermediate_size, 96);
}

TEST(Config, BothSpellingsGiveTheSameConfig) {
  nlohmann::json classic = Fixture("qwen3_moe");
  nlohmann::json newer = classic;
  newer.erase("rope_theta");
  newer.erase("num_experts");
  newer["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  newer["num_local_experts"] = 8;
  auto a = Parse(classic), b = Parse(newer);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->n_experts, b->n_experts);
  EXPECT_EQ(a->rope_theta, b->rope_theta);
}

TEST(Config, DenseLayersFromMlpOnlyLayersAndSparseStep) {
  nlohmann::json j = Fixture("qwen3_moe");
  j["mlp_only_layers"] = {0};
  j["decoder_sparse_step"] = 2;  // layers 1 and 3 are on the grid
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->layer_is_moe, (std::vector<bool>{false, true, false, true}));
}

TEST(Config, EachArchitectureDefaultsItsOwnKeys) {
  // Qwen3MoeConfig: norm_topk_prob false, rope_theta 10000.
  nlohmann::json q = Fixture("qwen3_moe");
  q.erase("norm_topk_prob");
  q.erase("rope_theta");
  auto qc = Parse(q);
  ASSERT_TRUE(qc.ok()) << qc.message();
  EXPECT_FALSE(qc->norm_topk_prob);
  EXPECT_DOUBLE_EQ(qc->rope_theta, 10000.0);
  // MixtralConfig: rope_theta 1e6; top-k always renormalised, whatever the config says.
  nlohmann::json m = Fixture("mixtral");
  m.erase("rope_parameters");
  m["norm_topk_prob"] = false;
  auto mc = Parse(m, "MixtralForCausalLM");
  ASSERT_TRUE(mc.ok()) << mc.message();
  EXPECT_DOUBLE_EQ(mc->rope_theta, 1e6);
  EXPECT_TRUE(mc->norm_topk_prob);
  EXPECT_EQ(mc->layer_is_moe, std::vector<bool>(3, true));
  EXPECT_EQ(mc->dense_intermediate_size, 96);
}

TEST(Config, SlidingWindowAsEachArchitectureSpellsIt) {
  // Qwen3-MoE: only with use_sliding_window.
  nlohmann::json q = Fixture("qwen3_moe");
  q["sliding_window"] = 4096;
  auto off = Parse(q);
  ASSERT_TRUE(off.ok()) << off.message();
  EXPECT_EQ(off->sliding_window, 0);
  q["use_sliding_window"] = true;
  auto on = Parse(q);
  ASSERT_TRUE(on.ok()) << on.message();
  EXPECT_EQ(on->sliding_window, 4096);
  // Mixtral: whenever it is not null (MixtralConfig has no use_sliding_window).
  nlohmann::json m = Fixture("mixtral");
  m["sliding_window"] = 4096;
  m["use_sliding_window"] = false;
  auto mc = Parse(m, "MixtralForCausalLM");
  ASSERT_TRUE(mc.ok()) << mc.message();
  EXPECT_EQ(mc->sliding_window, 4096);
}

// A config.json edit (of architecture `arch`'s config) that must be refused, and what the
// error must name.
struct ArchCase {
  const char* what;
  const char* arch;
  std::function<void(nlohmann::json&)> edit;
  const char* needle;
};

TEST(Config, ArchitectureKeyErrors) {
  const ArchCase cases[] = {
      {"qwen3 without expert width", "Qwen3MoeForCausalLM",
       [](auto& j) { j.erase("moe_intermediate_size"); }, "'moe_intermediate_size'"},
      {"qwen3 without expert count", "Qwen3MoeForCausalLM", [](auto& j) { j.erase("num_experts"); },
       "'num_local_experts'"},
      {"qwen3 window flag not a bool", "Qwen3MoeForCausalLM",
       [](auto& j) { j["use_sliding_window"] = 1; }, "'use_sliding_window'"},
      {"qwen3 negative window", "Qwen3MoeForCausalLM",
       [](auto& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = -1;
       },
       "sliding_window"},
      {"qwen3 dense layer without width", "Qwen3MoeForCausalLM",
       [](auto& j) {
         j.erase("intermediate_size");
         j["mlp_only_layers"] = {2};
       },
       "layer 2 is dense but 'intermediate_size' is missing"},
      {"qwen3 zero experts", "Qwen3MoeForCausalLM", [](auto& j) { j["num_experts"] = 0; },
       "number of experts must be positive"},
      {"mixtral without width", "MixtralForCausalLM", [](auto& j) { j.erase("intermediate_size"); },
       "'intermediate_size'"},
      {"mixtral without expert count", "MixtralForCausalLM",
       [](auto& j) { j.erase("num_local_experts"); }, "'num_local_experts'"},
      {"mixtral top-k > experts", "MixtralForCausalLM",
       [](auto& j) { j["num_experts_per_tok"] = 5; }, "num_experts_per_tok"},
      {"mixtral absurd expert count", "MixtralForCausalLM",
       [](auto& j) { j["num_local_experts"] = int64_t{1} << 30; }, "exceeds"},
  };
  for (const auto& c : cases) {
    nlohmann::json j =
        Fixture(std::string(c.arch) == "MixtralForCausalLM" ? "mixtral" : "qwen3_moe");
    c.edit(j);
    auto r = Parse(j, c.arch);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.message().find("config.json: "), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(c.needle), std::string::npos) << c.what << ": " << r.message();
  }
}

TEST(Config, Errors) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* needle;
  };
  const Case cases[] = {
      {"missing hidden_size", [](auto& j) { j.erase("hidden_size"); }, "'hidden_size'"},
      {"string where int", [](auto& j) { j["num_hidden_layers"] = "4"; }, "'num_hidden_layers'"},
      {"heads not divisible", [](auto& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads"},
      {"top-k > experts", [](auto& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
      {"yarn rope",
       [](auto& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
       },
       "yarn"},
      {"bad mlp_only_layers", [](auto& j) { j["mlp_only_layers"] = {7}; }, "mlp_only_layers"},
      {"gelu", [](auto& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"negative size", [](auto& j) { j["vocab_size"] = -1; }, "vocab_size"},
      {"absurd size", [](auto& j) { j["hidden_size"] = int64_t{1} << 40; }, "exceeds"},
      {"zero eps", [](auto& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
      {"negative eps", [](auto& j) { j["rms_norm_eps"] = -1e-6; }, "rms_norm_eps"},
      {"huge eps", [](auto& j) { j["rms_norm_eps"] = 5; }, "rms_norm_eps"},
      {"zero context", [](auto& j) { j["max_position_embeddings"] = 0; },
       "max_position_embeddings"},
      {"negative context", [](auto& j) { j["max_position_embeddings"] = -5; },
       "max_position_embeddings"},
      {"zero rope_theta", [](auto& j) { j["rope_theta"] = 0; }, "rope_theta"},
      {"negative rope_theta", [](auto& j) { j["rope_theta"] = -1e4; }, "rope_theta"},
      {"eos outside vocab", [](auto& j) { j["eos_token_id"] = 1 << 30; }, "eos_token_id"},
      {"negative eos",
       [](auto& j) {
         j["eos_token_id"] = {1, -2};
       },
       "eos_token_id"},
      {"bos outside vocab", [](auto& j) { j["bos_token_id"] = int64_t{1} << 33; }, "bos_token_id"},
      {"negative intermediate", [](auto& j) { j["intermediate_size"] = -4; }, "intermediate_size"},
      {"zero sparse step", [](auto& j) { j["decoder_sparse_step"] = 0; }, "decoder_sparse_step"},
      {"heads x head_dim",
       [](auto& j) {
         j["num_attention_heads"] = 1 << 16;
         j["num_key_value_heads"] = 1 << 16;
         j["head_dim"] = 1 << 16;
       },
       "head_dim"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = Fixture("qwen3_moe");
    c.edit(j);
    auto r = Parse(j);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.message().find("config.json: "), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(c.needle), std::string::npos) << c.what << ": " << r.message();
  }
}

TEST(Config, HugeSizesAreErrors) {
  // Sizes each under the per-size cap whose products (3 x hidden_size x expert width x experts x
  // layers) would overflow the int64 byte counts the loader derives (bank bytes, their sums); a
  // context or window past int32 positions; an integer past int64.
  const ArchCase cases[] = {
      {"qwen3 experts", "Qwen3MoeForCausalLM",
       [](auto& j) {
         j["hidden_size"] = 1 << 24;
         j["moe_intermediate_size"] = 1 << 24;
         j["num_experts"] = 1 << 24;
       },
       "the routed experts, 3 x hidden_size (16777216) x expert width (16777216) x 16777216 "
       "experts x 4 MoE layers, exceed"},
      {"mixtral experts over many layers", "MixtralForCausalLM",
       [](auto& j) {
         j["hidden_size"] = 1 << 16;
         j["intermediate_size"] = 1 << 16;
         j["num_local_experts"] = 1 << 8;
         j["num_hidden_layers"] = 1 << 20;
       },
       "the routed experts"},
      {"qwen3 dense weights", "Qwen3MoeForCausalLM",
       [](auto& j) {
         j["vocab_size"] = 1 << 24;
         j["hidden_size"] = 1 << 24;
       },
       "the weights besides the experts (from vocab_size, hidden_size, num_hidden_layers"},
      {"context past int32", "Qwen3MoeForCausalLM",
       [](auto& j) { j["max_position_embeddings"] = int64_t{1} << 62; },
       "max_position_embeddings must be positive and at most 2147483647"},
      {"window past int32", "MixtralForCausalLM",
       [](auto& j) { j["sliding_window"] = (int64_t{1} << 32) + 5; },
       "field 'sliding_window' is 4294967301"},
      {"size past int64", "MixtralForCausalLM",
       [](auto& j) { j["vocab_size"] = std::numeric_limits<uint64_t>::max(); },
       "field 'vocab_size' is 18446744073709551615, too large"},
  };
  for (const auto& c : cases) {
    nlohmann::json j =
        Fixture(std::string(c.arch) == "MixtralForCausalLM" ? "mixtral" : "qwen3_moe");
    c.edit(j);
    auto r = Parse(j, c.arch);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.message().find("config.json: "), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(c.needle), std::string::npos) << c.what << ": " << r.message();
  }
  // The largest real MoE configs stay well inside the bounds (DeepSeek-V3's sizes, here read as
  // Qwen3-MoE keys: 61 layers of 256 experts of width 2048, d_model 7168).
  nlohmann::json big = Fixture("qwen3_moe");
  big["hidden_size"] = 7168;
  big["num_attention_heads"] = 128;
  big["num_key_value_heads"] = 128;
  big["head_dim"] = 128;
  big["moe_intermediate_size"] = 2048;
  big["intermediate_size"] = 18432;
  big["num_experts"] = 256;
  big["num_experts_per_tok"] = 8;
  big["num_hidden_layers"] = 61;
  big["vocab_size"] = 129280;
  big["max_position_embeddings"] = 163840;
  auto ok = Parse(big);
  EXPECT_TRUE(ok.ok()) << ok.message();
}

TEST(Config, DeeplyNestedValueIsAnError) {
  // An error quoting such a value (hidden_act, mlp_only_layers) would recurse once per level in
  // json::dump and overflow the stack.
  nlohmann::json j = Fixture("qwen3_moe");
  std::string text = j.dump();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  text.replace(text.find("\"silu\""), 6, deep);
  auto r = ParseModelConfig(text, "config.json", arch::Qwen3MoeSpec().parse_config);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("config.json: field 'hidden_act' is nested deeper than"),
            std::string::npos)
      << r.message();
}

TEST(Config, NotJson) {
  auto r =
      ParseModelConfig("{\"hidden_size\": 4,", "x/config.json", arch::Qwen3MoeSpec().parse_config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message().rfind("x/config.json: not valid JSON", 0), 0u) << r.message();
}

}  // namespace
}  // namespace moetier
