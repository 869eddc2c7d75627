// The decode kernel of paged attention (flash-decoding): few query tokens, contexts up to tens of
// thousands of positions. Block (split, kv head slice, token) takes one contiguous chunk of the
// token's positions for up to kDecodeHeads query heads of one key/value group, so each K/V row
// is read once for all of them; with more than one split per token each block leaves its partial
// softmax state (max, sum, unnormalized output) in scratch and DecodeCombineKernel merges them.
//
// Within a block, a "team" of kLanes lanes holds one key's row (16-byte loads, kElems elements
// per lane); a warp takes kTeamsPerWarp * kKeysPerTeam consecutive keys per step, so one step
// reads whole contiguous runs of the pool's block. Each team keeps its own online softmax
// (max, sum, output) per head; the block merges its teams at the end through shared memory.
//
// Cost: per key a team does 2 * heads * head_dim FMAs and heads * log2(kLanes) shuffles; with
// bf16 K/V and 8 heads that is about 8 flop per byte read, so the kernel should run near the
// HBM bandwidth (4.8 TB/s on an H200) for groups up to 4 and at about two thirds of it for
// groups of 8, provided the grid has a few blocks per SM (PlanDecode sizes the splits for that).
#pragma once

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

  // The row element a lane's e-th register holds: 16-byte pieces, a warp's loads contiguous.
  __device__ __forceinline__ static int Elem(int lane_in_team, int e) {
    return (e / Kv::kVec) * (kLanes * Kv::kVec) + lane_in_team * Kv::kVec + e % Kv::kVec;
  }
};

// One team's online softmax over its keys, for kDecodeHeads heads.
template <int kElems>
struct TeamState {
  float m[kDecodeHeads];  // running max of the scores (log2 domain); -inf before any key
  float l[kDecodeHeads];  // running sum of exp2(score - m)
  float acc[kDecodeHeads][kElems];
};

template <int D, typename Kv>
__device__ __forceinline__ void DecodeTeamsOverChunk(
    const DecodeParams& p, const int32_t* table, int32_t start, int32_t end, int64_t head_off,
    const float (&q)[kDecodeHeads][DecodeShape<D, Kv>::kElems], int n_g,
    TeamState<DecodeShape<D, Kv>::kElems>& st) {
  using S = DecodeShape<D, Kv>;
  constexpr int kE = S::kElems;
  constexpr int kK = S::kKeysPerTeam;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int team_in_warp = lane / S::kLanes;
  const int li = lane % S::kLanes;
  // `base` is uniform over the warp, so every lane reaches the shuffles below.
  for (int32_t base = start + warp * S::kWarpKeys; base <= end; base += S::kWarps * S::kWarpKeys) {
    float kf[kK][kE], vf[kK][kE];
    bool valid[kK];
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      const int32_t key = base + team_in_warp * kK + kk;
      valid[kk] = key <= end;
      if (valid[kk]) {
        const uint8_t* row = p.pool.data + KeyRowOffset(p.pool, table, key) + head_off;
#pragma unroll
        for (int v = 0; v < S::kLoads; ++v) {
          const int64_t off = static_cast<int64_t>(S::Elem(li, v * Kv::kVec)) * p.pool.elem_bytes;
          Kv::Load(row + off, &kf[kk][v * Kv::kVec]);
          Kv::Load(row + p.pool.plane_bytes + off, &vf[kk][v * Kv::kVec]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kE; ++e) kf[kk][e] = vf[kk][e] = 0.0f;
      }
    }
    float s[kK][kDecodeHeads];
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
#pragma unroll
      for (int g = 0; g < kDecodeHeads; ++g) {
        float dot = 0.0f;
        if (g < n_g) {  // uniform over the block: every lane takes the shuffles or none does
#pragma unroll
          for (int e = 0; e < kE; ++e) dot = fmaf(q[g][e], kf[kk][e], dot);
#pragma unroll
          for (int o = S::kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        }
        s[kk][g] = dot * p.scale_log2;
      }
    }
#pragma unroll
    for (int g = 0; g < kDecodeHeads; ++g) {
      if (g >= n_g) break;
      float mx = st.m[g];
#pragma unroll
      for (int kk = 0; kk < kK; ++kk)
        if (valid[kk]) mx = fmaxf(mx, s[kk][g]);
      if (mx == -INFINITY) continue;            // this team had no key in this step
      const float alpha = exp2f(st.m[g] - mx);  // 0 while m is -inf
      float pk[kK];
      float sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kK; ++kk) {
        pk[kk] = valid[kk] ? exp2f(s[kk][g] - mx) : 0.0f;
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
}

// grid (splits, n_kv_heads * slices, T), kDecodeThreads threads. A block whose chunk starts past
// its token's position returns at once.
template <int D, typename Kv>
__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(DecodeParams p) {
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
  const int n_g = min(kDecodeHeads, p.group - slice * kDecodeHeads);
  const int li = threadIdx.x % S::kLanes;
  const int team = threadIdx.x / S::kLanes;

  float q[kDecodeHeads][kE];
#pragma unroll
  for (int g = 0; g < kDecodeHeads; ++g)
#pragma unroll
    for (int e = 0; e < kE; ++e)
      q[g][e] =
          g < n_g ? p.q[(static_cast<int64_t>(t) * p.n_heads + h0 + g) * D + S::Elem(li, e)] : 0.0f;
  TeamState<kE> st;
#pragma unroll
  for (int g = 0; g < kDecodeHeads; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) st.acc[g][e] = 0.0f;
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.seq_of[t]) * p.max_blocks;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * p.pool.elem_bytes;
  DecodeTeamsOverChunk<D, Kv>(p, table, start, end, head_off, q, n_g, st);

  // Merge the teams: [kTeams, kDecodeHeads, D] accumulators, 128 * kElems * 8 floats <= 32 KiB.
  __shared__ float red_acc[S::kTeams * kDecodeHeads * D];
  __shared__ float red_m[S::kTeams * kDecodeHeads];
  __shared__ float red_l[S::kTeams * kDecodeHeads];
  __shared__ float blk_m[kDecodeHeads];
  __shared__ float blk_l[kDecodeHeads];
#pragma unroll
  for (int g = 0; g < kDecodeHeads; ++g) {
#pragma unroll
    for (int e = 0; e < kE; ++e)
      red_acc[(team * kDecodeHeads + g) * D + S::Elem(li, e)] = st.acc[g][e];
    if (li == 0) {
      red_m[team * kDecodeHeads + g] = st.m[g];
      red_l[team * kDecodeHeads + g] = st.l[g];
    }
  }
  __syncthreads();
  if (threadIdx.x < n_g) {
    const int g = threadIdx.x;
    float m = -INFINITY;
    for (int i = 0; i < S::kTeams; ++i) m = fmaxf(m, red_m[i * kDecodeHeads + g]);
    blk_m[g] = m;  // finite: the block's first key went to team 0
  }
  __syncthreads();
  // Team weights exp2(m_team - m_block) in place of the teams' maxima.
  for (int i = threadIdx.x; i < S::kTeams * kDecodeHeads; i += kDecodeThreads) {
    const int g = i % kDecodeHeads;
    const float m = red_m[i];
    red_m[i] = g < n_g && m != -INFINITY ? exp2f(m - blk_m[g]) : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < n_g) {
    const int g = threadIdx.x;
    float l = 0.0f;
    for (int i = 0; i < S::kTeams; ++i)
      l += red_l[i * kDecodeHeads + g] * red_m[i * kDecodeHeads + g];
    blk_l[g] = l;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < n_g * D; o += kDecodeThreads) {
    const int g = o / D;
    const int d = o % D;
    float a = 0.0f;
    for (int i = 0; i < S::kTeams; ++i)
      a = fmaf(red_acc[(i * kDecodeHeads + g) * D + d], red_m[i * kDecodeHeads + g], a);
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
  const int h = blockIdx.x;
  const int t = blockIdx.y;
  const int d = threadIdx.x;
  const int32_t pos = p.positions[t];
  const int32_t n_keys = pos - FirstKey(pos, p.window) + 1;
  const int n_valid = (n_keys + p.chunk - 1) / p.chunk;
  const int64_t th = static_cast<int64_t>(t) * p.n_heads + h;
  const int64_t part0 = th * p.splits;
  float m = -INFINITY;
  for (int s = 0; s < n_valid; ++s) m = fmaxf(m, p.part_ml[2 * (part0 + s)]);
  float l = 0.0f;
  float a = 0.0f;
  for (int s = 0; s < n_valid; ++s) {
    const float w = exp2f(p.part_ml[2 * (part0 + s)] - m);
    l = fmaf(p.part_ml[2 * (part0 + s) + 1], w, l);
    a = fmaf(p.part_acc[(part0 + s) * d_head + d], w, a);
  }
  p.out[th * d_head + d] = a / l;
}

}  // namespace moetier::cuda::attention
