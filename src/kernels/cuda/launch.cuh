// How our kernels are launched: with programmatic dependent launch (PDL, sm_90), a kernel may be
// scheduled onto the SMs while the kernel before it on the stream is still finishing, instead
// of after it has drained. Decode steps are chains of ~150 short kernels, where that gap is a
// large share of the step.
//
// The rule that keeps it correct: every kernel launched by Launch calls PdlWait() before it
// touches memory, which waits for the kernels before it to complete and their writes to be
// visible, then lets the next kernel be scheduled. Kernels of others (cuBLAS) and copies keep
// the stream's plain ordering. Before PdlWait a kernel only asks L2 for its weights
// (PrefetchL2: a hint that reads nothing into the kernel), so that their fetch overlaps the
// kernel before it (which is where PDL's gain lies in a chain of latency-bound kernels), and
// finds them from inputs the launches before that one wrote:
//
// What a kernel may read before PdlWait: what was written before the kernel before it. A kernel
// is scheduled only once every block of the one before it has returned from PdlWait or exited, and
// PdlWait returns only after everything earlier on the stream has completed with its writes
// visible (copies and others' kernels keep plain ordering: they are complete before the next
// kernel starts at all). So a kernel whose inputs were written two or more launches back (the
// routing, read by the expert kernels after an activation quantizing or the gate+up launch) may
// follow them to its weights and prefetch those before waiting for the launch just before it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/launch.h"

namespace moetier::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 to fetch the lines of [p, p + bytes), one 128-byte line a lane, the 32 lanes of a warp
// together (lane in [0, 32)), or all by one lane (lane 0, stride 1). Only a hint: it changes no
// result, whatever p points at.
__device__ __forceinline__ void PrefetchL2(const void* p, int64_t bytes, int lane,
                                           int stride = 32) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = (begin & ~uintptr_t{127}) + static_cast<uintptr_t>(lane) * 128; a < end;
       a += static_cast<uintptr_t>(stride) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL when it is on. A refused launch (too
// many threads for the kernel's registers, too much shared memory) is left, as with <<<>>>, in
// the runtime's last error, which CudaBackend::EndStep turns into the step's error.
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = ProgrammaticLaunch() ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace moetier::cuda
