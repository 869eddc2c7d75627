// The decode kernel of paged attention (flash-decoding): few query tokens, contexts up to tens of
// thousands of positions. Block (split, kv head slice, token) takes one contiguous chunk of the
// token's positions for up to kDecodeHeads query heads of one key/value group, so each K/V row
// is read once for all of them; with more than one split per token each block leaves its partial
// softmax state (max, sum, unnormalized output) in scratch and DecodeCombineKernel merges them.
//
// Within a block, the chunk's K and V rows are staged in shared memory tile by tile with cp.async
// (kStages tiles in flight, 16-byte copies of whole contiguous row pieces). A "team" of kLanes
// lanes holds one key's row (kElems elements per lane); every team takes kKeysPerTeam keys of a
// tile and keeps its own online softmax (max, sum, output) per head; the block merges its teams
// at the end through shared memory.
//
// Cost: per key a team does 2 * heads * head_dim FMAs, heads * log2(kLanes) shuffles and a few
// exponentials per head. With bf16 K/V that is 2 * heads flop per byte read: for groups up to 4
// the design should reach most of the HBM bandwidth (4.8 TB/s on an H200) once the grid has a
// few blocks per SM (PlanDecode sizes the splits for that); for groups of 8 the CUDA-core work
// per byte bounds it well below (about a quarter of the bandwidth); moving q·K and p·V onto
// tensor cores (mma.sync with the group's heads as rows) is what would lift that bound.
#pragma once

#include <cuda_pipeline.h>

#include <cmath>

#include "kernels/cuda/attention_common.cuh"

namespace moetier::cuda::attention {

// Query heads one decode block serves; larger groups are split into slices (grid.y). Eight
// heads keep q and the output accumulators in registers (2 * 8 * kElems floats per lane).
inline constexpr int kDecodeHeads = 8;
inline constexpr int kDecodeThreads = 128;

struct DecodeParams {
  const float* q = nullptr;   // [T, n_heads, D]
  float* out = nullptr;       // [T, n_heads, D]; written directly when splits == 1
  float* part_acc = nullptr;  // [T, n_heads, splits, D]: unnormalized outputs of the splits
  float* part_ml = nullptr;   // [T, n_heads, splits, 2]: their max (log2 domain) and sum
  const int32_t* positions = nullptr;
  const int32_t* seq_of = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  PoolRef pool;
  int32_t n_heads = 0;
  int32_t group = 0;
  int32_t slices = 0;  // ceil(group / kDecodeHeads)
  int32_t window = 0;
  int32_t chunk = 0;        // positions per split
  int32_t splits = 0;       // splits per token (grid.x)
  float scale_log2 = 0.0f;  // log2(e) / sqrt(D)
};

template <int D, typename Kv>
struct DecodeShape {
  static constexpr int kLanes = D / Kv::kVec < kWarp ? D / Kv::kVec : kWarp;  // per key
  static constexpr int kElems = D / kLanes;                                   // per lane
  static constexpr int kLoads = kElems / Kv::kVec;  // 16-byte loads per lane per row
  static constexpr int kTeamsPerWarp = kWarp / kLanes;
  static constexpr int kTeams = kDecodeThreads / kLanes;
  // Two keys per team per step: their K and V loads are in flight together.
  static constexpr int kKeysPerTeam = 2;
  static constexpr int kWarpKeys = kTeamsPerWarp * kKeysPerTeam;
  static constexpr int kWarps = kDecodeThreads / kWarp;
  static_assert(kElems % Kv::kVec == 0 && kLanes * kElems == D);
  // Keys per tile (one step of every team), staged in shared memory with cp.async, kStages tiles
  // in flight: 8 KiB (K and V) per tile per 16-byte load of a lane, 32 KiB in all.
  static constexpr int kTileKeys = kWarps * kWarpKeys;
  static constexpr int kRowBytes = D * (16 / Kv::kVec);
  static constexpr int kTileBytes = 2 * kTileKeys * kRowBytes;  // K rows, then V rows
  static constexpr int kStages = 4 / kLoads;

  // The row element a lane's e-th register holds: 16-byte pieces, a warp's loads contiguous.
  __device__ __forceinline__ static int Elem(int lane_in_team, int e) {
    return (e / Kv::kVec) * (kLanes * Kv::kVec) + lane_in_team * Kv::kVec + e % Kv::kVec;
  }
};

// One team's online softmax over its keys, for kG heads.
template <int kElems, int kG>
struct TeamState {
  float m[kG];  // running max of the scores (log2 domain); -inf before any key
  float l[kG];  // running sum of exp2(score - m)
  float acc[kG][kElems];
};

// Queues the cp.async copies of tile j's K and V rows (keys past `end` are left as they are)
// and commits them as one group; a tile past the chunk commits an empty group, so that every
// thread counts the same groups.
template <int D, typename Kv>
__device__ __forceinline__ void IssueTile(const DecodeParams& p, const int32_t* table,
                                          int32_t start, int32_t end, int64_t head_off, int j,
                                          int n_tiles, uint8_t* stage) {
  using S = DecodeShape<D, Kv>;
  constexpr int kPieces = S::kRowBytes / 16;
  if (j < n_tiles) {
    for (int i = threadIdx.x; i < S::kTileKeys * kPieces; i += kDecodeThreads) {
      const int c = i / kPieces;
      const int piece = i % kPieces;
      const int32_t key = start + j * S::kTileKeys + c;
      if (key > end) continue;
      const uint8_t* src = p.pool.data + KeyRowOffset(p.pool, table, key) + head_off + piece * 16;
      uint8_t* dst = stage + c * S::kRowBytes + piece * 16;
      __pipeline_memcpy_async(dst, src, 16);
      __pipeline_memcpy_async(dst + S::kTileKeys * S::kRowBytes, src + p.pool.plane_bytes, 16);
    }
  }
  __pipeline_commit();
}

// One team's step over its kKeysPerTeam keys of a staged tile. Heads past the block's n_g have
// q = 0 and are computed anyway: no branch separates the heads, so the shuffles and
// exponentials of all kG heads and both keys interleave.
template <int D, typename Kv, int kG>
__device__ __forceinline__ void TeamStep(const DecodeParams& p, const uint8_t* stage, int32_t key0,
                                         int32_t end,
                                         const float (&q)[kG][DecodeShape<D, Kv>::kElems],
                                         TeamState<DecodeShape<D, Kv>::kElems, kG>& st) {
  using S = DecodeShape<D, Kv>;
  constexpr int kE = S::kElems;
  constexpr int kK = S::kKeysPerTeam;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int team_in_warp = lane / S::kLanes;
  const int li = lane % S::kLanes;
  float kf[kK][kE], vf[kK][kE];
  bool valid[kK];
#pragma unroll
  for (int kk = 0; kk < kK; ++kk) {
    const int c = warp * S::kWarpKeys + team_in_warp * kK + kk;  // key within the tile
    valid[kk] = key0 + c <= end;
    const uint8_t* row = stage + c * S::kRowBytes;
#pragma unroll
    for (int v = 0; v < S::kLoads; ++v) {
      const int off = S::Elem(li, v * Kv::kVec) * (16 / Kv::kVec);
      Kv::Load(row + off, &kf[kk][v * Kv::kVec]);
      Kv::Load(row + S::kTileKeys * S::kRowBytes + off, &vf[kk][v * Kv::kVec]);
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) vf[kk][e] = valid[kk] ? vf[kk][e] : 0.0f;  // stale rows
  }
  float s[kK][kG];
#pragma unroll
  for (int kk = 0; kk < kK; ++kk)
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) dot = fmaf(q[g][e], kf[kk][e], dot);
      s[kk][g] = dot;
    }
#pragma unroll
  for (int o = S::kLanes / 2; o > 0; o >>= 1)
#pragma unroll
    for (int kk = 0; kk < kK; ++kk)
#pragma unroll
      for (int g = 0; g < kG; ++g) s[kk][g] += __shfl_xor_sync(0xffffffffu, s[kk][g], o);
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float mx = st.m[g];
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      s[kk][g] = valid[kk] ? s[kk][g] * p.scale_log2 : -INFINITY;
      mx = fmaxf(mx, s[kk][g]);
    }
    // mx is -inf only for a team that has had no key yet: then everything stays 0.
    const float m_ref = mx == -INFINITY ? 0.0f : mx;
    const float alpha = exp2f(st.m[g] - m_ref);  // 0 while m is -inf
    float pk[kK];
    float sum = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      pk[kk] = exp2f(s[kk][g] - m_ref);  // 0 for a missing key
      sum += pk[kk];
    }
    st.l[g] = st.l[g] * alpha + sum;
    st.m[g] = mx;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      float a = st.acc[g][e] * alpha;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) a = fmaf(pk[kk], vf[kk][e], a);
      st.acc[g][e] = a;
    }
  }
}

// kG (4 or 8, >= the block's heads) sizes the registers: a group of 4 computes no idle heads.
template <int D, typename Kv, int kG>
__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(DecodeParams p) {
  PdlWait();
  using S = DecodeShape<D, Kv>;
  constexpr int kE = S::kElems;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / p.slices;
  const int slice = blockIdx.y % p.slices;
  const int t = blockIdx.z;
  const int32_t pos = p.positions[t];
  const int32_t first = FirstKey(pos, p.window);
  const int32_t start = first + split * p.chunk;
  if (start > pos) return;
  const int32_t end = min(pos, start + p.chunk - 1);
  const int h0 = kvh * p.group + slice * kDecodeHeads;
  const int n_g = min(kDecodeHeads, p.group - slice * kDecodeHeads);  // <= kG
  const int li = threadIdx.x % S::kLanes;
  const int team = threadIdx.x / S::kLanes;

  float q[kG][kE];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < kE; ++e)
      q[g][e] =
          g < n_g ? p.q[(static_cast<int64_t>(t) * p.n_heads + h0 + g) * D + S::Elem(li, e)] : 0.0f;
  TeamState<kE, kG> st;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) st.acc[g][e] = 0.0f;
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.seq_of[t]) * p.max_blocks;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * p.pool.elem_bytes;
  // The staged tiles, then (after the loop) the teams' accumulators [kTeams, kG, D]:
  // 128 * kElems * kG floats <= 32 KiB.
  constexpr int kRedBytes = S::kTeams * kG * D * static_cast<int>(sizeof(float));
  constexpr int kStageBytes = S::kStages * S::kTileBytes;
  __shared__ __align__(16) uint8_t smem[kRedBytes > kStageBytes ? kRedBytes : kStageBytes];
  __shared__ float red_m[S::kTeams * kG];
  __shared__ float red_l[S::kTeams * kG];
  __shared__ float blk_m[kG];
  __shared__ float blk_l[kG];

  // The pipeline: kStages - 1 tiles in flight while one is computed. Every thread runs every
  // iteration (n_tiles is uniform), so the barriers are reached by all.
  const int n_tiles = (end - start + S::kTileKeys) / S::kTileKeys;
  for (int j = 0; j < S::kStages - 1; ++j)
    IssueTile<D, Kv>(p, table, start, end, head_off, j, n_tiles, smem + j * S::kTileBytes);
  for (int j = 0; j < n_tiles; ++j) {
    __pipeline_wait_prior(S::kStages - 2);
    __syncthreads();  // tile j is in place; every thread is done with tile j - 1
    const int next = j + S::kStages - 1;
    IssueTile<D, Kv>(p, table, start, end, head_off, next, n_tiles,
                     smem + (next % S::kStages) * S::kTileBytes);
    TeamStep<D, Kv, kG>(p, smem + (j % S::kStages) * S::kTileBytes, start + j * S::kTileKeys, end,
                        q, st);
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // the stages are free for the merge
  float* red_acc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int e = 0; e < kE; ++e) red_acc[(team * kG + g) * D + S::Elem(li, e)] = st.acc[g][e];
    if (li == 0) {
      red_m[team * kG + g] = st.m[g];
      red_l[team * kG + g] = st.l[g];
    }
  }
  __syncthreads();
  if (threadIdx.x < n_g) {
    const int g = threadIdx.x;
    float m = -INFINITY;
    for (int i = 0; i < S::kTeams; ++i) m = fmaxf(m, red_m[i * kG + g]);
    blk_m[g] = m;  // finite: the block's first key went to team 0
  }
  __syncthreads();
  // Team weights exp2(m_team - m_block) in place of the teams' maxima.
  for (int i = threadIdx.x; i < S::kTeams * kG; i += kDecodeThreads) {
    const int g = i % kG;
    const float m = red_m[i];
    red_m[i] = g < n_g && m != -INFINITY ? exp2f(m - blk_m[g]) : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < n_g) {
    const int g = threadIdx.x;
    float l = 0.0f;
    for (int i = 0; i < S::kTeams; ++i) l += red_l[i * kG + g] * red_m[i * kG + g];
    blk_l[g] = l;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < n_g * D; o += kDecodeThreads) {
    const int g = o / D;
    const int d = o % D;
    float a = 0.0f;
    for (int i = 0; i < S::kTeams; ++i)
      a = fmaf(red_acc[(i * kG + g) * D + d], red_m[i * kG + g], a);
    const int64_t th = static_cast<int64_t>(t) * p.n_heads + h0 + g;  // (token, head)
    if (p.splits == 1) {
      p.out[th * D + d] = a / blk_l[g];
    } else {
      const int64_t part = th * p.splits + split;
      p.part_acc[part * D + d] = a;
      if (d == 0) {
        p.part_ml[2 * part] = blk_m[g];
        p.part_ml[2 * part + 1] = blk_l[g];
      }
    }
  }
}

// grid (n_heads, T), D threads: merges the splits of token t's head h that had positions.
__global__ void DecodeCombineKernel(DecodeParams p, int d_head) {
  PdlWait();
  const int h = blockIdx.x;
  const int t = blockIdx.y;
  const int d = threadIdx.x;
  const int32_t pos = p.positions[t];
  const int32_t n_keys = pos - FirstKey(pos, p.window) + 1;
  const int n_valid = (n_keys + p.chunk - 1) / p.chunk;
  const int64_t th = static_cast<int64_t>(t) * p.n_heads + h;
  const int64_t part0 = th * p.splits;
  float m = -INFINITY;
#pragma unroll 4
  for (int s = 0; s < n_valid; ++s) m = fmaxf(m, p.part_ml[2 * (part0 + s)]);
  float l = 0.0f;
  float a = 0.0f;
#pragma unroll 4  // the loads of four splits in flight together
  for (int s = 0; s < n_valid; ++s) {
    const float w = exp2f(p.part_ml[2 * (part0 + s)] - m);
    l = fmaf(p.part_ml[2 * (part0 + s) + 1], w, l);
    a = fmaf(p.part_acc[(part0 + s) * d_head + d], w, a);
  }
  p.out[th * d_head + d] = a / l;
}

}  // namespace moetier::cuda::attention
