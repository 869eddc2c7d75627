// GET /v1/residency's body on real fixture models (one row per MoE layer of the config, the tiers
// of the model's residency report, counters that grow with a Forward, nulls when statistics are
// off) and the page of GET /residency (self-contained: it fetches /v1/residency and nothing
// else).
#include "server/residency_page.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "experts/tier.h"
#include "model/causal_lm.h"
#include "support/test_support.h"

namespace moetier::server {
namespace {

using nlohmann::ordered_json;

// The prompt of the Forward whose counters the tests read: a few tokens, inside every fixture's
// vocabulary.
const std::vector<int32_t> kPrompt = {1, 2, 3, 4, 5};

std::unique_ptr<CausalLM> Load(const std::string& fixture) {
  auto m = LoadCausalLM(testing::HfFixture(fixture), testing::WithThreads(1));
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(*m) : nullptr;
}

void RunPrompt(CausalLM& model) {
  auto cache = model.NewCache(static_cast<int64_t>(kPrompt.size()));
  ASSERT_TRUE(cache.ok()) << cache.message();
  std::vector<float> logits;
  const Status s = model.Forward(kPrompt, *cache, LogitsFor::kLastToken, logits);
  ASSERT_TRUE(s.ok()) << s.message();
}

std::vector<int64_t> MoeLayerIds(const ModelConfig& c) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < c.layer_is_moe.size(); ++i)
    if (c.layer_is_moe[i]) ids.push_back(static_cast<int64_t>(i));
  return ids;
}

std::vector<int64_t> JsonLayerIds(const ordered_json& j) {
  std::vector<int64_t> ids;
  for (const auto& l : j.at("layers")) ids.push_back(l.at("layer").get<int64_t>());
  return ids;
}

class ResidencyJsonTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResidencyJsonTest, LayersAndTiersFollowTheConfigAndTheReport) {
  std::unique_ptr<CausalLM> model = Load(GetParam());
  ASSERT_NE(model, nullptr);
  model->CollectExpertStats();
  const ordered_json j = ResidencyJson(*model, ServiceMetrics{}, 0.0);

  const std::vector<int64_t> moe = MoeLayerIds(model->config());
  ASSERT_FALSE(moe.empty());
  EXPECT_EQ(JsonLayerIds(j), moe);
  EXPECT_EQ(j.at("backend"), "cpu");
  EXPECT_EQ(j.at("model"), testing::HfFixture(GetParam()).filename().string());
  EXPECT_TRUE(j.at("expert_stats").get<bool>());

  const ResidencyReport& report = model->residency();
  ASSERT_TRUE(report.settled.has_value());
  ASSERT_EQ(report.plan.layers.size(), moe.size());
  uint64_t held_bytes = 0;
  for (size_t i = 0; i < moe.size(); ++i) {
    const ordered_json& l = j.at("layers")[i];
    EXPECT_EQ(l.at("planned"), std::string(TierName(report.plan.layers[i].tier)));
    EXPECT_EQ(l.at("settled"), std::string(TierName((*report.settled)[i].tier)));
    EXPECT_EQ(l.at("bytes").get<uint64_t>(), (*report.settled)[i].bytes);
    // No GPU here: every layer lives in host memory the CPU executor reads.
    const std::string settled = l.at("settled");
    EXPECT_TRUE(settled == "locked" || settled == "pageable") << settled;
    held_bytes += l.at("bytes").get<uint64_t>();
  }
  const ordered_json& by_tier = j.at("bytes");
  EXPECT_EQ(by_tier.at("locked").get<uint64_t>() + by_tier.at("pageable").get<uint64_t>(),
            held_bytes);
  EXPECT_EQ(j.at("vmlck_settled_bytes").get<uint64_t>(), report.vmlck_bytes);
  EXPECT_TRUE(j.at("vmlck_bytes").is_number_unsigned());
}

TEST_P(ResidencyJsonTest, CountersGrowWithAForward) {
  std::unique_ptr<CausalLM> model = Load(GetParam());
  ASSERT_NE(model, nullptr);
  model->CollectExpertStats();
  const ordered_json before = ResidencyJson(*model, ServiceMetrics{}, 1.0);
  for (const auto& l : before.at("layers")) {
    EXPECT_EQ(l.at("calls").get<int64_t>(), 0);
    EXPECT_EQ(l.at("active_experts").get<int64_t>(), 0);
  }
  EXPECT_EQ(before.at("totals").at("calls").get<int64_t>(), 0);
  EXPECT_EQ(before.at("tokens").at("forwarded_total").get<int64_t>(), 0);

  RunPrompt(*model);
  const ordered_json after = ResidencyJson(*model, ServiceMetrics{}, 2.0);
  EXPECT_EQ(JsonLayerIds(after), JsonLayerIds(before));
  const int64_t top_k = model->config().n_experts_per_token;
  int64_t calls = 0;
  for (const auto& l : after.at("layers")) {
    SCOPED_TRACE("layer " + l.at("layer").dump());
    EXPECT_EQ(l.at("calls").get<int64_t>(), 1);  // one Forward runs each MoE layer once
    // kPrompt's tokens choose top_k experts each, some of them the same ones.
    EXPECT_GE(l.at("active_experts").get<int64_t>(), top_k);
    EXPECT_EQ(l.at("assignments").get<int64_t>(), top_k * static_cast<int64_t>(kPrompt.size()));
    // The cpu backend computes every expert on the CPU and copies nothing to a GPU.
    EXPECT_EQ(l.at("cpu_experts"), l.at("active_experts"));
    EXPECT_EQ(l.at("gpu_experts").get<int64_t>(), 0);
    EXPECT_EQ(l.at("bytes_h2d").get<int64_t>(), 0);
    calls += l.at("calls").get<int64_t>();
  }
  EXPECT_EQ(after.at("totals").at("calls").get<int64_t>(), calls);
  EXPECT_EQ(after.at("tokens").at("forwarded_total").get<int64_t>(),
            static_cast<int64_t>(kPrompt.size()));
  EXPECT_DOUBLE_EQ(after.at("uptime_s").get<double>(), 2.0);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ResidencyJsonTest,
    ::testing::Values("realvocab/qwen3_moe_tiny", "realvocab/mixtral_tiny"), [](const auto& info) {
      std::string name = info.param.substr(info.param.find('/') + 1);
      std::replace_if(
          name.begin(), name.end(),
          [](char c) { return std::isalnum(static_cast<unsigned char>(c)) == 0; }, '_');
      return name;
    });

TEST(ResidencyJson, CountersAreNullWithoutStatistics) {
  std::unique_ptr<CausalLM> model = Load("realvocab/qwen3_moe_tiny");
  ASSERT_NE(model, nullptr);
  RunPrompt(*model);
  const ordered_json j = ResidencyJson(*model, ServiceMetrics{}, 0.0);
  EXPECT_FALSE(j.at("expert_stats").get<bool>());
  EXPECT_TRUE(j.at("totals").is_null());
  EXPECT_TRUE(j.at("tokens").at("forwarded_total").is_null());
  ASSERT_EQ(JsonLayerIds(j), MoeLayerIds(model->config()));
  for (const auto& l : j.at("layers")) {
    EXPECT_TRUE(l.at("calls").is_null());
    EXPECT_TRUE(l.at("cache_hits").is_null());
    EXPECT_TRUE(l.at("settled").is_string());  // the residency is known all the same
  }
}

TEST(ResidencyJson, CarriesTheServiceFigures) {
  std::unique_ptr<CausalLM> model = Load("realvocab/qwen3_moe_tiny");
  ASSERT_NE(model, nullptr);
  ServiceMetrics m;
  m.requests_running = 2;
  m.requests_waiting = 3;
  m.requests_total = 11;
  m.prompt_tokens_total = 400;
  m.cached_prompt_tokens_total = 128;
  m.generated_tokens_total = 987;
  m.kv_blocks_used = 5;
  m.kv_blocks_total = 64;
  const ordered_json j = ResidencyJson(*model, m, 12.5);
  EXPECT_EQ(j.at("requests"), ordered_json({{"running", 2}, {"waiting", 3}, {"total", 11}}));
  EXPECT_EQ(j.at("tokens"), ordered_json({{"prompt_total", 400},
                                          {"cached_prompt_total", 128},
                                          {"generated_total", 987},
                                          {"forwarded_total", nullptr}}));
  EXPECT_EQ(j.at("kv_blocks"), ordered_json({{"used", 5}, {"total", 64}}));
  EXPECT_DOUBLE_EQ(j.at("uptime_s").get<double>(), 12.5);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TEST(ResidencyPageHtml, FetchesItsOwnJsonAndNothingElse) {
  const std::string& html = ResidencyPageHtml();
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(html.find("const kEndpoint = '/v1/residency';"), std::string::npos);
  EXPECT_NE(html.find("fetch(kEndpoint"), std::string::npos);
  const std::string lower = Lower(html);
  // No address of another site, and no resource loaded by address at all (scripts, styles,
  // images and fonts are inline or absent).
  EXPECT_EQ(lower.find("http"), std::string::npos);
  EXPECT_EQ(lower.find("src="), std::string::npos);
  EXPECT_EQ(lower.find("href="), std::string::npos);
  EXPECT_EQ(lower.find("url("), std::string::npos);
  EXPECT_EQ(lower.find("@import"), std::string::npos);
  EXPECT_EQ(lower.find("fetch("), lower.rfind("fetch("));  // the one fetch above
}

TEST(ResidencyPageHtml, HasAnAccessibleTableOfLayers) {
  const std::string& html = ResidencyPageHtml();
  EXPECT_NE(html.find("<html lang=\"en\">"), std::string::npos);
  EXPECT_NE(html.find("<table id=\"layers\">"), std::string::npos);
  EXPECT_NE(html.find("<caption>"), std::string::npos);
  EXPECT_NE(html.find("<th scope=\"col\">Planned tier</th>"), std::string::npos);
  EXPECT_NE(html.find("<th scope=\"col\">Settled tier</th>"), std::string::npos);
  EXPECT_NE(html.find("role=\"status\""), std::string::npos);
  // Data reaches the page as text, never as markup.
  EXPECT_EQ(html.find("innerHTML"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

}  // namespace
}  // namespace moetier::server
