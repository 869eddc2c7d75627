#include "backend/cuda/step_graphs.h"

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace moetier::cuda {

StepGraphs::~StepGraphs() {
  Invalidate();
}

void StepGraphs::Invalidate() {
  // The shapes seen keep their counts: the buffers only grow, so a shape that ran once fits
  // them and its next step can be recorded.
  for (auto& [key, entry] : entries_)
    if (entry.exec != nullptr) cudaGraphExecDestroy(std::exchange(entry.exec, nullptr));
  capturing_ = nullptr;
}

Expected<StepGraphs::Mode> StepGraphs::Begin(const Key& key, cudaStream_t stream) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxGraphs) return Mode::kEager;
    it = entries_.emplace(key, Entry{}).first;
  }
  Entry& e = it->second;
  if (e.exec != nullptr) {
    MT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e.exec, stream), "replaying the decode step's graph");
    if (key.segment == 0) ++replayed_;
    return Mode::kReplay;
  }
  if (++e.seen < 2) return Mode::kEager;
  // Thread-local: a call of this thread that would break the recording (a synchronization, an
  // allocation) fails instead; other threads' CUDA calls are not affected.
  MT_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                          "recording the decode step as a CUDA graph");
  capturing_ = &e;
  return Mode::kCapture;
}

Status StepGraphs::FinishCapture(cudaStream_t stream, bool discard) {
  Entry* e = std::exchange(capturing_, nullptr);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (discard || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != nullptr) e->seen = 0;  // record it again later
    MT_CUDA_RETURN_IF_ERROR(ended, "recording the decode step as a CUDA graph");
    return OkStatus();
  }
  const cudaError_t made = cudaGraphInstantiate(&e->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) e->exec = nullptr;
  MT_CUDA_RETURN_IF_ERROR(made, "instantiating the decode step's CUDA graph");
  ++recorded_;
  MT_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(e->exec, stream), "running the decode step's graph");
  return OkStatus();
}

}  // namespace moetier::cuda
