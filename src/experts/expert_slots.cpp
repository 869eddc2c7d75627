#include "experts/expert_slots.h"

namespace moetier {

ExpertSlots::ExpertSlots(int64_t n_slots, int64_t n_layers, int64_t n_experts)
    : n_experts_(n_experts),
      slots_(static_cast<size_t>(n_slots)),
      slot_of_(static_cast<size_t>(n_layers * n_experts), -1) {
  for (int32_t s = 0; s < static_cast<int32_t>(n_slots); ++s) PushBack(s);
}

void ExpertSlots::Unlink(int32_t s) {
  Slot& x = slots_[static_cast<size_t>(s)];
  (x.prev >= 0 ? slots_[static_cast<size_t>(x.prev)].next : head_) = x.next;
  (x.next >= 0 ? slots_[static_cast<size_t>(x.next)].prev : tail_) = x.prev;
  x.prev = x.next = -1;
}

void ExpertSlots::PushBack(int32_t s) {
  Slot& x = slots_[static_cast<size_t>(s)];
  x.prev = tail_;
  x.next = -1;
  (tail_ >= 0 ? slots_[static_cast<size_t>(tail_)].next : head_) = s;
  tail_ = s;
}

bool ExpertSlots::Place(int64_t layer, std::span<const int32_t> experts,
                        std::vector<Placement>& out) {
  if (static_cast<int64_t>(experts.size()) > n_slots()) return false;
  out.resize(experts.size());
  // Hits first, each moved to the recent end: then the misses' least recently used slots are
  // never one of this call's (this call's slots are the most recent, fewer than all).
  for (size_t i = 0; i < experts.size(); ++i) {
    const int32_t s = SlotOf(layer, experts[i]);
    out[i] = Placement{s, s >= 0};
    if (s < 0) continue;
    Unlink(s);
    PushBack(s);
    ++hits_;
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (out[i].hit) continue;
    const int32_t s = head_;
    Slot& x = slots_[static_cast<size_t>(s)];
    if (x.key >= 0) slot_of_[static_cast<size_t>(x.key)] = -1;
    x.key = layer * n_experts_ + experts[i];
    slot_of_[static_cast<size_t>(x.key)] = s;
    Unlink(s);
    PushBack(s);
    out[i].slot = s;
    ++misses_;
  }
  return true;
}

}  // namespace moetier
