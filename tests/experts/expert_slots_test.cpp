// ExpertSlots against slow, obviously right references of its two evictions (a timestamp per
// slot, a linear search for the victim) on random routing, plus the rules a backend relies on.
#include "experts/expert_slots.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace moetier {
namespace {

// The reference: hits are touched in the order given, then each miss takes an empty slot (lowest
// index first), else the victim: with kLeastRecent the slot used longest ago; with kLayerOrder
// one not touched by this call, of the layer fewest layers back from the caller's (its own
// first, then the one before, ...; cyclically), used longest ago within it.
class Reference {
 public:
  Reference(int n_slots, int n_layers, int n_experts, ExpertSlots::Eviction eviction)
      : n_layers_(n_layers),
        n_experts_(n_experts),
        eviction_(eviction),
        stamp_(static_cast<size_t>(n_slots), -1),
        key_(stamp_.size(), -1) {}
  std::vector<ExpertSlots::Placement> Place(int layer, const std::vector<int32_t>& ex) {
    const int64_t call_start = clock_ + 1;
    std::vector<ExpertSlots::Placement> out(ex.size());
    for (size_t i = 0; i < ex.size(); ++i) {
      auto it = where_.find(Key(layer, ex[i]));
      if (it == where_.end()) continue;
      out[i] = {it->second, true};
      stamp_[static_cast<size_t>(it->second)] = ++clock_;
    }
    for (size_t i = 0; i < ex.size(); ++i) {
      if (out[i].hit) continue;
      const int32_t s = Victim(layer, call_start);
      if (key_[static_cast<size_t>(s)] >= 0) where_.erase(key_[static_cast<size_t>(s)]);
      key_[static_cast<size_t>(s)] = Key(layer, ex[i]);
      where_[Key(layer, ex[i])] = s;
      stamp_[static_cast<size_t>(s)] = ++clock_;
      out[i] = {s, false};
    }
    return out;
  }

 private:
  int64_t Key(int layer, int32_t e) const { return int64_t{layer} * n_experts_ + e; }
  int32_t Victim(int layer, int64_t call_start) const {
    int32_t best = -1;
    int64_t best_rank = 0;
    for (int32_t s = 0; s < static_cast<int32_t>(key_.size()); ++s) {
      const int64_t key = key_[static_cast<size_t>(s)];
      if (key < 0) return s;
      const int64_t stamp = stamp_[static_cast<size_t>(s)];
      if (stamp >= call_start) continue;  // this call's
      const auto back = (layer - key / n_experts_ + n_layers_) % n_layers_;
      const int64_t rank = eviction_ == ExpertSlots::Eviction::kLeastRecent
                               ? stamp
                               : back * (int64_t{1} << 40) + stamp;
      if (best < 0 || rank < best_rank) best = s, best_rank = rank;
    }
    return best;
  }
  int n_layers_, n_experts_;
  ExpertSlots::Eviction eviction_;
  std::vector<int64_t> stamp_;
  std::vector<int64_t> key_;
  std::map<int64_t, int32_t> where_;
  int64_t clock_ = 0;
};

std::vector<int32_t> RandomExperts(std::mt19937& rng, int n_experts, int max_count) {
  std::vector<int32_t> all(static_cast<size_t>(n_experts));
  for (int e = 0; e < n_experts; ++e) all[static_cast<size_t>(e)] = e;
  std::shuffle(all.begin(), all.end(), rng);
  const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(std::min(max_count, n_experts)));
  all.resize(static_cast<size_t>(n));
  return all;
}

TEST(ExpertSlots, MatchesTheReferencesOnRandomRouting) {
  for (const auto eviction :
       {ExpertSlots::Eviction::kLayerOrder, ExpertSlots::Eviction::kLeastRecent}) {
    for (const int n_slots : {1, 3, 16, 40}) {
      const int n_layers = 4, n_experts = 32;
      std::mt19937 rng(static_cast<unsigned>(n_slots));
      ExpertSlots slots(n_slots, n_layers, n_experts, eviction);
      Reference ref(n_slots, n_layers, n_experts, eviction);
      std::vector<ExpertSlots::Placement> got;
      int64_t hits = 0, misses = 0;
      for (int step = 0; step < 400; ++step) {
        // Mostly the layers in order, sometimes a jump (a test, or a step that ends early).
        const int layer = step % 7 == 6 ? static_cast<int>(rng() % n_layers) : step % n_layers;
        // Skewed choices, so that some experts come back while still cached.
        std::vector<int32_t> ex =
            RandomExperts(rng, step % 3 == 0 ? n_experts : 6, std::min(n_slots, 8));
        ASSERT_TRUE(slots.Place(layer, ex, got));
        const auto want = ref.Place(layer, ex);
        ASSERT_EQ(got.size(), want.size());
        std::set<int32_t> used;
        for (size_t i = 0; i < ex.size(); ++i) {
          EXPECT_EQ(got[i].slot, want[i].slot) << "step " << step << " expert " << ex[i];
          EXPECT_EQ(got[i].hit, want[i].hit) << "step " << step << " expert " << ex[i];
          EXPECT_EQ(slots.SlotOf(layer, ex[i]), got[i].slot);
          used.insert(got[i].slot);
          (got[i].hit ? hits : misses)++;
        }
        EXPECT_EQ(used.size(), ex.size()) << "two experts of one call share a slot";
      }
      EXPECT_EQ(slots.hits(), hits);
      EXPECT_EQ(slots.misses(), misses);
      if (n_slots >= 16) {  // smaller: the layers evict each other's experts
        EXPECT_GT(hits, 0) << n_slots;
      }
    }
  }
}

// Layers in order, each wanting the same experts every step, more of them than the cache
// holds: least recently used finds every layer's experts gone; the layer order keeps some.
TEST(ExpertSlots, LayerOrderKeepsHitsWhereLeastRecentlyUsedHasNone) {
  const int n_layers = 4, per_layer = 4, n_slots = 12;
  const std::vector<int32_t> ex = {0, 1, 2, 3};
  for (const auto eviction :
       {ExpertSlots::Eviction::kLayerOrder, ExpertSlots::Eviction::kLeastRecent}) {
    ExpertSlots slots(n_slots, n_layers, 8, eviction);
    std::vector<ExpertSlots::Placement> p;
    int64_t hits = 0;
    for (int step = 0; step < 20; ++step) {
      for (int layer = 0; layer < n_layers; ++layer) {
        ASSERT_TRUE(slots.Place(layer, ex, p));
        if (step < 2) continue;  // the cold start
        for (const auto& placed : p) hits += placed.hit ? 1 : 0;
      }
    }
    const int64_t wanted = int64_t{18} * n_layers * per_layer;
    if (eviction == ExpertSlots::Eviction::kLeastRecent) {
      EXPECT_EQ(hits, 0);
    } else {
      // A layer that misses takes the slots of the layer run just before it, which then
      // misses a step later: two of every three layer calls hit, all four experts.
      EXPECT_EQ(hits * 3, wanted * 2) << hits << " of " << wanted;
    }
  }
}

TEST(ExpertSlots, AFullCallKeepsItsHitsAndEvictsOnlyOthers) {
  ExpertSlots slots(4, 2, 8);
  std::vector<ExpertSlots::Placement> p;
  const std::vector<int32_t> first = {0, 1, 2, 3};
  ASSERT_TRUE(slots.Place(0, first, p));
  // Layer 1 takes every slot: all of layer 0's experts leave.
  const std::vector<int32_t> other = {4, 5, 6, 7};
  ASSERT_TRUE(slots.Place(1, other, p));
  for (int32_t e : first) EXPECT_EQ(slots.SlotOf(0, e), -1);
  // Two hits and two misses that together fill the cache: the hits stay where they were.
  const int32_t slot5 = slots.SlotOf(1, 5), slot7 = slots.SlotOf(1, 7);
  const std::vector<int32_t> mixed = {5, 0, 7, 1};
  ASSERT_TRUE(slots.Place(1, mixed, p));
  EXPECT_TRUE(p[0].hit);
  EXPECT_EQ(p[0].slot, slot5);
  EXPECT_TRUE(p[2].hit);
  EXPECT_EQ(p[2].slot, slot7);
  EXPECT_FALSE(p[1].hit);
  EXPECT_FALSE(p[3].hit);
  EXPECT_NE(p[1].slot, slot5);
  EXPECT_NE(p[1].slot, slot7);
  EXPECT_NE(p[3].slot, slot5);
  EXPECT_NE(p[3].slot, slot7);
  EXPECT_NE(p[1].slot, p[3].slot);
}

TEST(ExpertSlots, MoreExpertsThanSlotsIsRefusedWithoutChange) {
  ExpertSlots slots(2, 1, 8);
  std::vector<ExpertSlots::Placement> p;
  const std::vector<int32_t> two = {3, 4};
  ASSERT_TRUE(slots.Place(0, two, p));
  const std::vector<int32_t> three = {0, 1, 2};
  EXPECT_FALSE(slots.Place(0, three, p));
  EXPECT_NE(slots.SlotOf(0, 3), -1);
  EXPECT_NE(slots.SlotOf(0, 4), -1);
  EXPECT_EQ(slots.SlotOf(0, 0), -1);
  EXPECT_EQ(slots.misses(), 2);
}

}  // namespace
}  // namespace moetier
