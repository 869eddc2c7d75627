// Attention kernels written once over a vector type, included by each SIMD impl header
// (matmul_avx2_impl.h, matmul_avx512_impl.h) after it has defined `Vec`: the ISA's float vector
// (kLanes, Zero, Load, Set1, Fma, Sum). Internal linkage only (see the ODR note in matmul_isa.h).
//
// Arithmetic per output element, the same whatever the tile (so results depend neither on how
// heads are split across threads nor on how many tokens a call carries):
//   score(g, j) = scale * (Sum(lane-wise FMA chain over head_dim in steps of kLanes)
//                          then a scalar fmaf chain over the last head_dim % kLanes elements)
//   out(g, d)   = fmaf chain over keys j = 0..n_keys-1 of p(g, j) * value(j, d), continued
//                 across the calls of one query when they accumulate (a paged cache's blocks)
// Tiles: 2 heads x 4 keys of scores (8 accumulators, each key row loaded once for both heads;
// the query heads sharing a key/value head are what makes that reuse possible) and 2 heads x 4
// vectors of the output (each value row chunk loaded once for both heads).

#define MOETIER_ATTN_UNROLL _Pragma("GCC unroll 16")

namespace attn {

// Key/value rows come from the cache in DRAM more often than not (a decode step streams far more
// weight bytes than the last-level cache holds) and are 512-1024 bytes, one per head, strided by
// the whole position row: too short a run for the hardware prefetcher. So each pass asks for
// the rows kAheadRows ahead of the ones it is reading.
constexpr int64_t kAheadRows = 8;

inline void PrefetchRow(const float* row, int64_t d) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * 4; b += 64) __asm__ volatile("prefetcht0 %0" : : "m"(p[b]));
}

// scores[g * n_keys + j] for g < NH, j < NK of the tile.
template <int NH, int NK>
inline void ScoreTile(const float* q, int64_t q_stride, const float* keys, int64_t key_stride,
                      int64_t d, float scale, float* scores, int64_t score_stride) {
  typename Vec::T acc[NH][NK];
  MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) MOETIER_ATTN_UNROLL for (int j = 0; j < NK; ++j)
      acc[h][j] = Vec::Zero();
  int64_t i = 0;
  for (; i + Vec::kLanes <= d; i += Vec::kLanes) {
    typename Vec::T kv[NK];
    MOETIER_ATTN_UNROLL for (int j = 0; j < NK; ++j) kv[j] = Vec::Load(keys + j * key_stride + i);
    MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) {
      const typename Vec::T qv = Vec::Load(q + h * q_stride + i);
      MOETIER_ATTN_UNROLL for (int j = 0; j < NK; ++j) acc[h][j] = Vec::Fma(qv, kv[j], acc[h][j]);
    }
  }
  MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h)
      MOETIER_ATTN_UNROLL for (int j = 0; j < NK; ++j) {
    float s = Vec::Sum(acc[h][j]);
    for (int64_t t = i; t < d; ++t)
      s = __builtin_fmaf(q[h * q_stride + t], keys[j * key_stride + t], s);
    scores[h * score_stride + j] = s * scale;
  }
}

template <int NH>
void ScoreRows(const float* q, int64_t q_stride, const float* keys, int64_t key_stride,
               int64_t n_keys, int64_t d, float scale, float* scores, int64_t score_stride) {
  int64_t j = 0;
  for (; j + 4 <= n_keys; j += 4) {
    for (int64_t a = j + kAheadRows; a < j + kAheadRows + 4 && a < n_keys; ++a)
      PrefetchRow(keys + a * key_stride, d);
    ScoreTile<NH, 4>(q, q_stride, keys + j * key_stride, key_stride, d, scale, scores + j,
                     score_stride);
  }
  switch (n_keys - j) {
    case 3:
      ScoreTile<NH, 3>(q, q_stride, keys + j * key_stride, key_stride, d, scale, scores + j,
                       score_stride);
      break;
    case 2:
      ScoreTile<NH, 2>(q, q_stride, keys + j * key_stride, key_stride, d, scale, scores + j,
                       score_stride);
      break;
    case 1:
      ScoreTile<NH, 1>(q, q_stride, keys + j * key_stride, key_stride, d, scale, scores + j,
                       score_stride);
      break;
    default:
      break;
  }
}

void Scores(const float* q, int64_t n_q, int64_t q_stride, const float* keys, int64_t key_stride,
            int64_t n_keys, int64_t d, float scale, float* scores, int64_t score_stride) {
  int64_t h = 0;
  for (; h + 2 <= n_q; h += 2)
    ScoreRows<2>(q + h * q_stride, q_stride, keys, key_stride, n_keys, d, scale,
                 scores + h * score_stride, score_stride);
  if (h < n_q)
    ScoreRows<1>(q + h * q_stride, q_stride, keys, key_stride, n_keys, d, scale,
                 scores + h * score_stride, score_stride);
}

// out[g * out_stride + i + v * kLanes ...] for g < NH and NV vectors from element i.
template <int NH, int NV>
inline void ValueTile(const float* p, int64_t n_keys, int64_t p_stride, const float* values,
                      int64_t value_stride, int64_t d, int64_t i, float* out, int64_t out_stride,
                      bool accumulate) {
  typename Vec::T acc[NH][NV];
  MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) MOETIER_ATTN_UNROLL for (int v = 0; v < NV; ++v)
      acc[h][v] = accumulate ? Vec::Load(out + h * out_stride + i + v * Vec::kLanes) : Vec::Zero();
  for (int64_t j = 0; j < n_keys; ++j) {
    // The first pass over the rows brings each whole row in; later passes find it in L2.
    if (i == 0 && j + kAheadRows < n_keys) PrefetchRow(values + (j + kAheadRows) * value_stride, d);
    typename Vec::T vv[NV];
    MOETIER_ATTN_UNROLL for (int v = 0; v < NV; ++v) vv[v] =
        Vec::Load(values + j * value_stride + i + v * Vec::kLanes);
    MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) {
      const typename Vec::T pv = Vec::Set1(p[h * p_stride + j]);
      MOETIER_ATTN_UNROLL for (int v = 0; v < NV; ++v) acc[h][v] = Vec::Fma(pv, vv[v], acc[h][v]);
    }
  }
  MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) MOETIER_ATTN_UNROLL for (int v = 0; v < NV; ++v)
      Vec::Store(out + h * out_stride + i + v * Vec::kLanes, acc[h][v]);
}

template <int NH>
void ValueRows(const float* p, int64_t n_keys, int64_t p_stride, const float* values,
               int64_t value_stride, int64_t d, float* out, int64_t out_stride, bool accumulate) {
  const int64_t vectors = d / Vec::kLanes;
  int64_t v = 0;
  for (; v + 4 <= vectors; v += 4)
    ValueTile<NH, 4>(p, n_keys, p_stride, values, value_stride, d, v * Vec::kLanes, out, out_stride,
                     accumulate);
  switch (vectors - v) {
    case 3:
      ValueTile<NH, 3>(p, n_keys, p_stride, values, value_stride, d, v * Vec::kLanes, out,
                       out_stride, accumulate);
      break;
    case 2:
      ValueTile<NH, 2>(p, n_keys, p_stride, values, value_stride, d, v * Vec::kLanes, out,
                       out_stride, accumulate);
      break;
    case 1:
      ValueTile<NH, 1>(p, n_keys, p_stride, values, value_stride, d, v * Vec::kLanes, out,
                       out_stride, accumulate);
      break;
    default:
      break;
  }
  for (int64_t i = vectors * Vec::kLanes; i < d; ++i)  // the same fmaf chain as one lane
    MOETIER_ATTN_UNROLL for (int h = 0; h < NH; ++h) {
      float o = accumulate ? out[h * out_stride + i] : 0.0f;
      for (int64_t j = 0; j < n_keys; ++j)
        o = __builtin_fmaf(p[h * p_stride + j], values[j * value_stride + i], o);
      out[h * out_stride + i] = o;
    }
}

void Values(const float* p, int64_t n_q, int64_t n_keys, int64_t p_stride, const float* values,
            int64_t value_stride, int64_t d, float* out, int64_t out_stride, bool accumulate) {
  int64_t h = 0;
  for (; h + 2 <= n_q; h += 2)
    ValueRows<2>(p + h * p_stride, n_keys, p_stride, values, value_stride, d, out + h * out_stride,
                 out_stride, accumulate);
  if (h < n_q)
    ValueRows<1>(p + h * p_stride, n_keys, p_stride, values, value_stride, d, out + h * out_stride,
                 out_stride, accumulate);
}

}  // namespace attn

#undef MOETIER_ATTN_UNROLL
