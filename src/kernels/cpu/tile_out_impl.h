// Where a tile's results go, written once over an output vector type and included by each SIMD
// impl header (matmul_avx2_impl.h, matmul_avx512_impl.h) after it has defined `OutVec`: T,
// kLanes, Zero(), Insert(held, lane, v) (v into that lane), Store(y, held) (all lanes) and
// StoreFirst(y, held, n) (lanes 0..n-1 only). Internal linkage only (see matmul_isa.h).
//
// Decode (one token, a run of rows: R == C == 1) gathers kLanes rows' results in a register and
// writes them with one vector store; other tiles store each element. A scalar store after every
// decode row made the next row's activation loads wait for it on the dev machine's Zen 5 (the
// load/store check matched them on some address bits, and the stored value waits on the row's
// last DRAM read), so rows ran one memory latency apart: q4_0 decode on one core streamed
// 11.8 GB/s instead of 16-22 in about half of the processes started, depending on where their
// activations and output landed. One store per 8 or 16 rows leaves that wait too rare to see.
template <int R, int C>
class TileOut {
 public:
  TileOut(float* y, int64_t y_stride) : y_(y), y_stride_(y_stride) {}
  TileOut(const TileOut&) = delete;
  TileOut& operator=(const TileOut&) = delete;
  __attribute__((always_inline)) void Put(int r, int c, float v) {
    if constexpr (kGather) {
      (void)r, (void)c;
      held_ = OutVec::Insert(held_, n_, v);
      if (++n_ == OutVec::kLanes) {
        OutVec::Store(y_, held_);
        y_ += OutVec::kLanes;
        n_ = 0;
      }
    } else {
      y_[c * y_stride_ + r] = v;
    }
  }
  // After each tile of R rows.
  __attribute__((always_inline)) void NextTile() {
    if constexpr (!kGather) y_ += R;
  }
  // After the last tile: writes what is still held.
  __attribute__((always_inline)) void Flush() {
    if constexpr (kGather)
      if (n_ > 0) OutVec::StoreFirst(y_, held_, n_);
  }

 private:
  static constexpr bool kGather = R == 1 && C == 1;
  float* y_;
  int64_t y_stride_;
  typename OutVec::T held_ = OutVec::Zero();
  int n_ = 0;
};
