#include "experts/expert_slots.h"

namespace moetier {

ExpertSlots::ExpertSlots(int64_t n_slots, int64_t n_layers, int64_t n_experts, Eviction eviction)
    : n_layers_(n_layers),
      n_experts_(n_experts),
      eviction_(eviction),
      slots_(static_cast<size_t>(n_slots)),
      slot_of_(static_cast<size_t>(n_layers * n_experts), -1),
      by_layer_(static_cast<size_t>(n_layers)) {
  for (int32_t s = 0; s < static_cast<int32_t>(n_slots); ++s) PushBack(all_, &Slot::all, s);
}

void ExpertSlots::Unlink(List& list, Links Slot::*links, int32_t s) {
  Links& x = slots_[static_cast<size_t>(s)].*links;
  (x.prev >= 0 ? (slots_[static_cast<size_t>(x.prev)].*links).next : list.head) = x.next;
  (x.next >= 0 ? (slots_[static_cast<size_t>(x.next)].*links).prev : list.tail) = x.prev;
  x.prev = x.next = -1;
}

void ExpertSlots::PushBack(List& list, Links Slot::*links, int32_t s) {
  Links& x = slots_[static_cast<size_t>(s)].*links;
  x.prev = list.tail;
  x.next = -1;
  (list.tail >= 0 ? (slots_[static_cast<size_t>(list.tail)].*links).next : list.head) = s;
  list.tail = s;
}

void ExpertSlots::Touch(int32_t s, int64_t layer) {
  List& mine = by_layer_[static_cast<size_t>(layer)];
  Unlink(all_, &Slot::all, s);
  PushBack(all_, &Slot::all, s);
  Unlink(mine, &Slot::in_layer, s);
  PushBack(mine, &Slot::in_layer, s);
  slots_[static_cast<size_t>(s)].call = call_;
}

int32_t ExpertSlots::Victim(int64_t layer) const {
  if (n_filled_ < n_slots()) return n_filled_;  // empty slots are taken in index order
  if (eviction_ == Eviction::kLeastRecent) return all_.head;
  // This layer's slots of this call are at the recent end of its list: if its head is one of
  // them, the layer has no other. The other layers hold none of this call's.
  for (int64_t back = 0; back < n_layers_; ++back) {
    const int64_t m = (layer - back + n_layers_) % n_layers_;
    const int32_t s = by_layer_[static_cast<size_t>(m)].head;
    if (s >= 0 && slots_[static_cast<size_t>(s)].call != call_) return s;
  }
  return -1;  // not reached: Place checked that this call's experts leave a slot
}

bool ExpertSlots::Place(int64_t layer, std::span<const int32_t> experts,
                        std::vector<Placement>& out) {
  if (static_cast<int64_t>(experts.size()) > n_slots()) return false;
  ++call_;
  out.resize(experts.size());
  // Hits first, each moved to the recent end: then no miss takes one of this call's slots.
  for (size_t i = 0; i < experts.size(); ++i) {
    const int32_t s = SlotOf(layer, experts[i]);
    out[i] = Placement{s, s >= 0};
    if (s < 0) continue;
    Touch(s, layer);
    ++hits_;
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (out[i].hit) continue;
    const int32_t s = Victim(layer);
    Slot& x = slots_[static_cast<size_t>(s)];
    if (x.key >= 0) {
      slot_of_[static_cast<size_t>(x.key)] = -1;
      Unlink(by_layer_[static_cast<size_t>(x.key / n_experts_)], &Slot::in_layer, s);
    } else {
      ++n_filled_;
    }
    x.key = layer * n_experts_ + experts[i];
    x.call = call_;
    slot_of_[static_cast<size_t>(x.key)] = s;
    Unlink(all_, &Slot::all, s);
    PushBack(all_, &Slot::all, s);
    PushBack(by_layer_[static_cast<size_t>(layer)], &Slot::in_layer, s);
    out[i].slot = s;
    ++misses_;
  }
  return true;
}

}  // namespace moetier
