// ExpertSlots against a slow, obviously right LRU (a timestamp per slot, a linear search for the
// oldest) on random routing, plus the rules a backend relies on.
#include "experts/expert_slots.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace moetier {
namespace {

// The reference: hits are touched in the order given, then each miss evicts the slot used
// longest ago (empty slots first, lowest index first).
class ReferenceLru {
 public:
  explicit ReferenceLru(int n_slots) : stamp_(static_cast<size_t>(n_slots)), key_(stamp_.size()) {
    for (int s = 0; s < n_slots; ++s) {
      stamp_[static_cast<size_t>(s)] = s - n_slots;
      key_[static_cast<size_t>(s)] = -1;
    }
  }
  std::vector<ExpertSlots::Placement> Place(int64_t key_base, const std::vector<int32_t>& ex) {
    std::vector<ExpertSlots::Placement> out(ex.size());
    for (size_t i = 0; i < ex.size(); ++i) {
      auto it = where_.find(key_base + ex[i]);
      if (it == where_.end()) continue;
      out[i] = {it->second, true};
      stamp_[static_cast<size_t>(it->second)] = ++clock_;
    }
    for (size_t i = 0; i < ex.size(); ++i) {
      if (out[i].hit) continue;
      const auto s =
          static_cast<int32_t>(std::min_element(stamp_.begin(), stamp_.end()) - stamp_.begin());
      if (key_[static_cast<size_t>(s)] >= 0) where_.erase(key_[static_cast<size_t>(s)]);
      key_[static_cast<size_t>(s)] = key_base + ex[i];
      where_[key_base + ex[i]] = s;
      stamp_[static_cast<size_t>(s)] = ++clock_;
      out[i] = {s, false};
    }
    return out;
  }

 private:
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

TEST(ExpertSlots, MatchesAReferenceLruOnRandomRouting) {
  for (const int n_slots : {1, 3, 16, 40}) {
    const int n_layers = 4, n_experts = 32;
    std::mt19937 rng(static_cast<unsigned>(n_slots));
    ExpertSlots slots(n_slots, n_layers, n_experts);
    ReferenceLru ref(n_slots);
    std::vector<ExpertSlots::Placement> got;
    int64_t hits = 0, misses = 0;
    for (int step = 0; step < 400; ++step) {
      const int layer = step % n_layers;
      // Skewed choices, so that some experts come back while still cached.
      std::vector<int32_t> ex =
          RandomExperts(rng, step % 3 == 0 ? n_experts : 6, std::min(n_slots, 8));
      ASSERT_TRUE(slots.Place(layer, ex, got));
      const auto want = ref.Place(int64_t{layer} * n_experts, ex);
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
