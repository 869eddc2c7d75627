// Which expert each slot of a GPU expert cache holds (the offload backend's VRAM cache: one
// expert's bytes per slot, shared by every cached layer), and which slot a miss takes.
//
// Bookkeeping only — the slots' memory and the copies are the backend's (backend/cuda). Place
// takes one MoE layer's active experts of a step at once: hits keep their slots, misses take
// slots that hold none of this call's experts, so a layer's hits are never evicted by its own
// misses. O(n_layers) per miss at most, no allocation after construction. The caller makes sure
// no earlier kernel still reads a slot it is given for a miss (the CUDA backend reads a layer's
// routing only after the previous layer's experts ran).
//
// Which slot a miss takes (Eviction): an empty one first; then, by default, the expert used next
// the latest. The layers run in order, each once a step, so of the experts in the cache those
// of the calling layer (not in this call) are used next a whole step later, then those of the
// layer before it, and so on back to the next layer's, used first: that order, least recently
// used first within a layer. A least-recently-used cache is the worst choice for that cycle:
// once a step's experts outgrow it (several sequences decoding), every layer finds its experts
// evicted by the layers in between, and no step hits. Choosing the farthest next use keeps a
// share of the layers' experts to the cache's size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moetier {

class ExpertSlots {
 public:
  enum class Eviction {
    kLayerOrder,  // the next use farthest in the layers' order (the header comment)
    kLeastRecent  // the slot used longest ago, whatever its layer (MOETIER_CACHE_LRU=1)
  };
  // n_slots >= 1; experts are (layer, expert) with layer < n_layers, expert < n_experts.
  ExpertSlots(int64_t n_slots, int64_t n_layers, int64_t n_experts,
              Eviction eviction = Eviction::kLayerOrder);

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
  // A recency list threaded through the slots (head: least recently used), by slot index.
  struct Links {
    int32_t prev = -1, next = -1;
  };
  struct List {
    int32_t head = -1, tail = -1;
  };
  struct Slot {
    int64_t key = -1;     // layer * n_experts + expert, or -1 (empty)
    int64_t call = -1;    // the Place call that last placed it
    Links all, in_layer;  // in every slot's list, and in its layer's list
  };
  void Unlink(List& list, Links Slot::*links, int32_t s);
  void PushBack(List& list, Links Slot::*links, int32_t s);
  // The slot the next miss of `layer` takes (the header comment says which).
  int32_t Victim(int64_t layer) const;
  // A hit: moves slot s (holding one of layer's experts) to the recent end of its lists.
  void Touch(int32_t s, int64_t layer);

  int64_t n_layers_, n_experts_;
  Eviction eviction_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // [n_layers * n_experts] -> slot or -1
  List all_;                      // every slot, empty ones first
  std::vector<List> by_layer_;    // [n_layers]: the slots holding that layer's experts
  int64_t call_ = 0;
  int32_t n_filled_ = 0;  // slots [0, n_filled_) have held an expert
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace moetier
