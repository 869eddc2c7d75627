// Which expert each slot of a GPU expert cache holds (the offload backend's VRAM cache: one
// expert's bytes per slot, shared by every cached layer), least recently used out first.
//
// Bookkeeping only — the slots' memory and the copies are the backend's (backend/cuda). Place
// takes one MoE layer's active experts of a step at once: hits keep their slots, misses take the
// least recently used slots that hold none of this call's experts, so a layer's hits are never
// evicted by its own misses. The caller makes sure no earlier kernel still reads a slot it is
// given for a miss (the CUDA backend reads a layer's routing only after the previous layer's
// experts ran). O(1) per expert, no allocation after construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moetier {

class ExpertSlots {
 public:
  // n_slots >= 1; experts are (layer, expert) with layer < n_layers, expert < n_experts.
  ExpertSlots(int64_t n_slots, int64_t n_layers, int64_t n_experts);

  struct Placement {
    int32_t slot = -1;
    bool hit = false;  // the slot already held the expert; false: the caller copies it in
  };
  // One placement per entry of `experts` (distinct ids of `layer`), into `out` (resized).
  // False, changing nothing, when there are more experts than slots.
  bool Place(int64_t layer, std::span<const int32_t> experts, std::vector<Placement>& out);

  int64_t n_slots() const { return static_cast<int64_t>(slots_.size()); }
  // The slot holding (layer, expert), or -1.
  int32_t SlotOf(int64_t layer, int32_t expert) const {
    return slot_of_[static_cast<size_t>(layer * n_experts_ + expert)];
  }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct Slot {
    int64_t key = -1;              // layer * n_experts + expert, or -1 (empty)
    int32_t prev = -1, next = -1;  // recency list: head least recently used
  };
  void Unlink(int32_t s);
  void PushBack(int32_t s);  // most recently used end

  int64_t n_experts_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // [n_layers * n_experts] -> slot or -1
  int32_t head_ = -1, tail_ = -1;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace moetier
