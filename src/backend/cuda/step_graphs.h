// StepGraphs: decode steps recorded once as CUDA graphs and replayed.
//
// A decode step with every expert in VRAM is a fixed sequence of ~20 launches per layer whose
// arguments depend only on the step's shape: its token count, the block tables' stride, the
// attention plan's context bucket and the KV pool (the data — tokens, positions, tables — is
// copied to fixed device buffers before the step). Launched one by one, the host's launch cost
// (a few µs each) bounds a step of small kernels; a graph launches them all in one call.
//
// A step whose experts are offloaded waits for the host once per offloaded layer (the routing
// must reach it before the copies or the CPU's share): its launches between two such waits form
// a segment, recorded and replayed like a whole step; the host's work runs between segments.
// Segments are keyed by their index in the step and a variant (what besides the shape
// decides their launches).
//
// Per key: the first occurrence runs eagerly (it sizes every buffer and sets every kernel
// attribute), the second is captured while it is recorded and launched at its end, later ones
// are replayed. The graphs refer to the backend's buffers by address: when one moves, the
// backend calls Invalidate and each key is recorded again at its next occurrence.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/status.h"
#include "kernels/cuda/draw.h"

namespace moetier::cuda {

class StepGraphs {
 public:
  // What fixes a decode step's launches.
  struct Key {
    int64_t n_tokens = 0;
    int64_t max_blocks = 0;    // the block tables' row stride
    int32_t max_position = 0;  // the attention plan's bucket
    const void* kv = nullptr;  // the KV pool: its memory and layout
    int64_t kv_blocks = 0;
    int64_t kv_block_size = 0;
    int kv_dtype = 0;
    int output = 0;       // what the step ends with (StepOutput: the logits or their arg-max)
    DrawWork draws = {};  // tokens drawn on the device (Batch::draws)
    bool scored = false;  // rows' log-sum-exp (Batch::scored)
    int32_t segment = 0;  // the step's segment (0: from the step's start)
    int32_t variant = 0;
    bool operator<(const Key& o) const {
      return std::tie(n_tokens, max_blocks, max_position, kv, kv_blocks, kv_block_size, kv_dtype,
                      output, draws, scored, segment, variant) <
             std::tie(o.n_tokens, o.max_blocks, o.max_position, o.kv, o.kv_blocks, o.kv_block_size,
                      o.kv_dtype, o.output, o.draws, o.scored, o.segment, o.variant);
    }
  };
  enum class Mode {
    kEager,    // launch as usual
    kCapture,  // launch as usual into the capture; FinishCapture instantiates and runs it
    kReplay    // the step's graph is running: launch nothing
  };
  // More keys than this run eagerly (a graph holds a little device memory; an offloaded step
  // of n layers has n + 1 segments).
  static constexpr size_t kMaxGraphs = 1024;

  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // How the step of shape `key` runs on `stream`, after its inputs were queued there: kReplay
  // has launched its graph; kCapture has begun capturing the stream.
  Expected<Mode> Begin(const Key& key, cudaStream_t stream);
  // After the capturing step's last launch: ends the capture, instantiates the graph and
  // launches it. With `discard` (the step failed while it was recorded) only ends the capture.
  Status FinishCapture(cudaStream_t stream, bool discard);
  // Every graph refers to a buffer that moved or was freed.
  void Invalidate();

  // Steps whose first segment was replayed.
  int64_t replayed_steps() const { return replayed_; }
  int64_t recorded_graphs() const { return recorded_; }

 private:
  struct Entry {
    int64_t seen = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<Key, Entry> entries_;
  Entry* capturing_ = nullptr;
  int64_t replayed_ = 0;
  int64_t recorded_ = 0;
};

}  // namespace moetier::cuda
