// How dense weights are held for the CPU (model/dense_holding.h): on an in-memory store, what is
// packed, copied or left, byte for byte; the --dense-memory heuristic at its boundary; and, end
// to end on the fixtures with the cpu backend, that a copied model computes the mapped model's
// logits bit for bit and says what it did in its residency report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "core/dtype.h"
#include "kernels/cpu/bf16c.h"
#include "model/causal_lm.h"
#include "model/dense_holding.h"
#include "support/test_support.h"

namespace moetier {
namespace {

// An in-memory TensorStore of bf16 matrices.
class MemoryStore final : public TensorStore {
 public:
  void Add(const std::string& name, std::vector<int64_t> shape, std::vector<uint16_t> bits) {
    data_[name] = std::move(bits);
    const auto& d = data_[name];
    views_[name] = TensorView{DType::kBF16, std::move(shape), d.data(), d.size() * 2};
  }
  const TensorView* Find(const std::string& name) const override {
    auto it = views_.find(name);
    return it == views_.end() ? nullptr : &it->second;
  }
  std::string FileOf(const std::string& name) const override { return "memory:" + name; }
  const std::string& description() const override { return description_; }
  std::vector<std::string> Names() const override {
    std::vector<std::string> n;
    for (const auto& [name, v] : views_) n.push_back(name);
    return n;
  }

 private:
  std::map<std::string, std::vector<uint16_t>> data_;
  std::map<std::string, TensorView> views_;
  std::string description_ = "memory";
};

std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = F32ToBf16(d(rng));
  return v;
}

constexpr int64_t kRows = 8, kWide = 512, kShort = 128;

// A store of every kind of matrix, and the views it had before holding (the input's bytes).
struct Fixture {
  std::unique_ptr<MemoryStore> store = std::make_unique<MemoryStore>();
  std::map<std::string, TensorView> before;
  std::vector<uint16_t> wide = RandomBf16(kRows * kWide, 1);

  Fixture() {
    std::vector<uint16_t> bad = RandomBf16(kRows * kWide, 2);
    testing::WriteUnpackableRow(reinterpret_cast<char*>(bad.data() + 3 * kWide), kWide);  // row 3
    store->Add("wide", {kRows, kWide}, wide);
    store->Add("router", {kRows, kWide}, RandomBf16(kRows * kWide, 3));
    store->Add("short", {kRows, kShort}, RandomBf16(kRows * kShort, 4));
    store->Add("norm", {kWide}, RandomBf16(kWide, 5));
    store->Add("bad", {kRows, kWide}, bad);
    store->Add("expert", {kRows, kWide}, RandomBf16(kRows * kWide, 6));
    store->Add("embed", {kRows, kShort}, RandomBf16(kRows * kShort, 7));
    store->Add("embed_wide", {kRows, kWide}, RandomBf16(kRows * kWide, 8));
    for (const std::string& name : store->Names()) before[name] = *store->Find(name);
  }

  DenseHoldingOptions Options(WeightPacking packing, DenseMemory memory) const {
    DenseHoldingOptions o;
    o.packing = packing;
    o.memory = memory;
    o.available_bytes = 0;  // kAuto would copy nothing; the tests name kCopy or kMapped
    o.skip = {"expert"};
    o.keep_dtype = {"router"};
    o.gathered = {"embed", "embed_wide"};
    return o;
  }
};

// The view now served for `name` is the input's: same bytes at the same address.
void ExpectUntouched(const TensorStore& out, const Fixture& f, const std::string& name) {
  const TensorView* v = out.Find(name);
  ASSERT_NE(v, nullptr) << name;
  EXPECT_EQ(v->data, f.before.at(name).data) << name;
  EXPECT_EQ(v->dtype, f.before.at(name).dtype) << name;
}

// The view now served for `name` is a copy: same dtype, shape and bytes, elsewhere.
void ExpectCopied(const TensorStore& out, const Fixture& f, const std::string& name) {
  const TensorView* v = out.Find(name);
  const TensorView& b = f.before.at(name);
  ASSERT_NE(v, nullptr) << name;
  EXPECT_NE(v->data, b.data) << name;
  EXPECT_EQ(v->dtype, b.dtype) << name;
  EXPECT_EQ(v->shape, b.shape) << name;
  ASSERT_EQ(v->n_bytes, b.n_bytes) << name;
  EXPECT_EQ(0, std::memcmp(v->data, b.data, b.n_bytes)) << name;
}

// `name` is held as BF16C with the input's very values.
void ExpectPacked(const TensorStore& out, const Fixture& f, const std::string& name) {
  const TensorView* v = out.Find(name);
  const TensorView& b = f.before.at(name);
  ASSERT_NE(v, nullptr) << name;
  ASSERT_EQ(v->dtype, DType::kBF16C) << name;
  EXPECT_EQ(v->shape, b.shape) << name;
  const int64_t rows = b.shape[0], k = b.shape[1];
  ASSERT_EQ(v->n_bytes, rows * DTypeRowBytes(DType::kBF16C, k)) << name;
  std::vector<uint16_t> row(static_cast<size_t>(k));
  for (int64_t i = 0; i < rows; ++i) {
    kernels::UnpackRowBf16c(v->bytes() + i * DTypeRowBytes(DType::kBF16C, k), k, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), b.bytes() + i * k * 2, static_cast<size_t>(k) * 2))
        << name << " row " << i;
  }
}

TEST(DenseHolding, MappedPacksWhatShrinksAndLeavesTheRest) {
  Fixture f;
  ThreadPool pool(2);
  auto r = HoldDenseWeights(std::move(f.store),
                            f.Options(WeightPacking::kAuto, DenseMemory::kMapped), pool);
  ASSERT_TRUE(r.ok()) << r.message();
  const TensorStore& out = *r->store;
  EXPECT_FALSE(r->copies);
  EXPECT_EQ(r->n_packed, 2);  // wide, embed_wide
  EXPECT_EQ(r->n_copied, 0);
  EXPECT_EQ(r->bytes_before, static_cast<uint64_t>(2 * kRows * kWide * 2));
  EXPECT_EQ(r->bytes_after, 2 * kRows * DTypeRowBytes(DType::kBF16C, kWide));
  ExpectPacked(out, f, "wide");
  ExpectPacked(out, f, "embed_wide");
  // Kept by name, too short to pay, 1-D, skipped, and the matrix with a row that cannot pack.
  for (const char* name : {"router", "short", "norm", "bad", "expert", "embed"})
    ExpectUntouched(out, f, name);
  EXPECT_EQ(out.Find("missing"), nullptr);
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_NE(r->warnings[0].find("'bad' row 3 "), std::string::npos) << r->warnings[0];
  EXPECT_NE(r->warnings[0].find("stays BF16"), std::string::npos) << r->warnings[0];
}

TEST(DenseHolding, CopyHoldsEveryStreamedMatrixInItsOwnMemory) {
  Fixture f;
  ThreadPool pool(2);
  auto r = HoldDenseWeights(std::move(f.store), f.Options(WeightPacking::kAuto, DenseMemory::kCopy),
                            pool);
  ASSERT_TRUE(r.ok()) << r.message();
  const TensorStore& out = *r->store;
  EXPECT_TRUE(r->copies);
  EXPECT_EQ(r->n_packed, 2);
  ExpectPacked(out, f, "wide");
  ExpectPacked(out, f, "embed_wide");
  // The router keeps its dtype, the short matrix and the one that cannot pack stay bf16: all
  // three copied. 1-D tensors, the skipped expert and the gathered embedding stay mapped.
  for (const char* name : {"router", "short", "bad"}) ExpectCopied(out, f, name);
  for (const char* name : {"norm", "expert", "embed"}) ExpectUntouched(out, f, name);
  EXPECT_EQ(r->n_copied, 3);
  EXPECT_EQ(r->copied_bytes, static_cast<uint64_t>((2 * kRows * kWide + kRows * kShort) * 2));
  EXPECT_EQ(r->warnings.size(), 1u);
}

TEST(DenseHolding, NonePacksNothingAndCopiesEveryStreamedMatrix) {
  Fixture f;
  ThreadPool pool(2);
  auto r = HoldDenseWeights(std::move(f.store), f.Options(WeightPacking::kNone, DenseMemory::kCopy),
                            pool);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->n_packed, 0);
  EXPECT_TRUE(r->warnings.empty());
  for (const char* name : {"wide", "router", "short", "bad"}) ExpectCopied(*r->store, f, name);
  for (const char* name : {"norm", "expert", "embed", "embed_wide"})
    ExpectUntouched(*r->store, f, name);
  EXPECT_EQ(r->n_copied, 4);
}

TEST(DenseHolding, AutoCopiesOnlyWhileEnoughRamStaysAvailable) {
  const uint64_t copy = 5ull << 30;
  EXPECT_TRUE(CopiesDense(DenseMemory::kAuto, copy, copy + kDenseCopyMinFreeBytes));
  EXPECT_FALSE(CopiesDense(DenseMemory::kAuto, copy, copy + kDenseCopyMinFreeBytes - 1));
  EXPECT_FALSE(CopiesDense(DenseMemory::kAuto, copy, copy / 2));  // no wrap-around
  EXPECT_TRUE(CopiesDense(DenseMemory::kCopy, copy, 0));
  EXPECT_FALSE(CopiesDense(DenseMemory::kMapped, 0, ~0ull));
}

TEST(DenseHolding, ParsesTheFlagAndNamesItInErrors) {
  for (DenseMemory m : {DenseMemory::kAuto, DenseMemory::kCopy, DenseMemory::kMapped}) {
    auto p = ParseDenseMemory(std::string(DenseMemoryName(m)));
    ASSERT_TRUE(p.ok()) << DenseMemoryName(m);
    EXPECT_EQ(*p, m);
  }
  auto bad = ParseDenseMemory("anon");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--dense-memory"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("'anon'"), std::string::npos) << bad.message();
}

// End to end: the converted q8_0 and HF bf16 fixtures, cpu backend, copied against mapped.
struct Loaded {
  std::unique_ptr<CausalLM> model;
  std::vector<float> logits;
};

Loaded LoadAndRun(const std::filesystem::path& dir, DenseMemory memory, WeightPacking packing) {
  LoadOptions o = testing::WithThreads(2);
  o.residency.backend = Backend::kCpu;
  o.residency.dense_memory = memory;
  o.residency.packing = packing;
  auto m = LoadCausalLM(dir, o);
  EXPECT_TRUE(m.ok()) << dir << ": " << m.message();
  Loaded out;
  if (!m.ok()) return out;
  out.model = std::move(*m);
  KvCache cache = *out.model->NewCache(64);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 11, 4};
  EXPECT_TRUE(out.model->Forward(tokens, cache, LogitsFor::kAllTokens, out.logits).ok());
  return out;
}

TEST(DenseHoldingLoad, CopiedWeightsGiveTheMappedLogitsAndTheReportSaysSo) {
  for (const std::string fixture : {"realvocab/qwen3_moe_tiny", "mixtral"}) {
    SCOPED_TRACE(fixture);
    const std::filesystem::path dir = testing::HfFixture(fixture);
    const Loaded mapped = LoadAndRun(dir, DenseMemory::kMapped, WeightPacking::kNone);
    const Loaded copied = LoadAndRun(dir, DenseMemory::kCopy, WeightPacking::kNone);
    ASSERT_TRUE(mapped.model && copied.model);
    ASSERT_FALSE(mapped.logits.empty());
    ASSERT_EQ(mapped.logits.size(), copied.logits.size());
    EXPECT_EQ(0, std::memcmp(mapped.logits.data(), copied.logits.data(),
                             mapped.logits.size() * sizeof(float)));

    const auto& md = mapped.model->residency().dense;
    const auto& cd = copied.model->residency().dense;
    ASSERT_TRUE(md.has_value() && cd.has_value());
    EXPECT_EQ(md->memory, "mapped");
    EXPECT_EQ(md->copied_matrices, 0);
    EXPECT_EQ(md->held_bytes, 0u);
    EXPECT_EQ(cd->memory, "copy");
    // Every layer's attention (4 matrices) and router, and the lm_head (the embedding table
    // itself when tied; an untied embedding, read a row a token, stays mapped).
    const ModelConfig& c = copied.model->config();
    EXPECT_GE(cd->copied_matrices, 4 * c.n_layers + c.n_moe_layers() + 1);
    EXPECT_GT(cd->held_bytes, 0u);
    const auto json = ResidencyReportJson(copied.model->residency());
    ASSERT_TRUE(json.contains("dense"));
    EXPECT_EQ(json["dense"]["memory"], "copy");
    EXPECT_EQ(json["dense"]["copied_matrices"], cd->copied_matrices);
  }
}

}  // namespace
}  // namespace moetier
