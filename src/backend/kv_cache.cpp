#include "backend/kv_cache.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace moetier {

Expected<DType> ParseKvDType(std::string_view text) {
  if (text == "f32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  if (text == "f16") return DType::kF16;
  return Status::Error("--kv-dtype '" + std::string(text) + "': expected f32, bf16 or f16");
}

uint64_t KvPool::BlockBytes(const KvShape& shape, int64_t block_size, DType dtype) {
  return static_cast<uint64_t>(2 * shape.n_layers * block_size * shape.row()) * DTypeSize(dtype);
}

namespace {

class HostKvMemory final : public KvMemory {
 public:
  HostKvMemory(uint8_t* data, uint64_t n_bytes) : data_(data), n_bytes_(n_bytes) {}
  ~HostKvMemory() override { ::munmap(data_, n_bytes_); }
  HostKvMemory(const HostKvMemory&) = delete;
  HostKvMemory& operator=(const HostKvMemory&) = delete;
  uint8_t* data() const override { return data_; }
  bool on_host() const override { return true; }
  void Copy(uint64_t dst, uint64_t src, uint64_t n) override {
    std::memcpy(data_ + dst, data_ + src, n);
  }
  bool ToHost(uint64_t src, uint64_t n, void* dst) override {
    std::memcpy(dst, data_ + src, n);
    return true;
  }
  bool FromHost(uint64_t dst, const void* src, uint64_t n) override {
    std::memcpy(data_ + dst, src, n);
    return true;
  }

 private:
  uint8_t* data_;
  uint64_t n_bytes_;
};

}  // namespace

Expected<std::unique_ptr<KvMemory>> AllocateHostKv(uint64_t n_bytes) {
  void* m = ::mmap(nullptr, n_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return Status::Error("cannot reserve " + std::to_string(n_bytes >> 20) +
                         " MiB for the KV cache: " + std::strerror(errno) +
                         "; lower --ctx-size or --kv-cache-gb");
  return std::unique_ptr<KvMemory>(new HostKvMemory(static_cast<uint8_t*>(m), n_bytes));
}

Expected<KvPool> KvPool::Create(const KvShape& shape, int64_t n_blocks, int64_t block_size,
                                DType dtype, const KvAllocator& allocate) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    return Status::Error("the KV cache holds f32, bf16 or f16, not " +
                         std::string(DTypeName(dtype)));
  if (n_blocks <= 0 || block_size <= 0 || shape.row() <= 0 || shape.n_layers <= 0)
    return Status::Error("the KV cache needs at least one block of one position");
  KvPool p;
  p.shape_ = shape;
  p.n_blocks_ = n_blocks;
  p.block_size_ = block_size;
  p.dtype_ = dtype;
  p.plane_bytes_ = static_cast<uint64_t>(block_size * shape.row()) * DTypeSize(dtype);
  p.bytes_ = BlockBytes(shape, block_size, dtype) * static_cast<uint64_t>(n_blocks);
  MT_ASSIGN_OR_RETURN(p.memory_, allocate ? allocate(p.bytes_) : AllocateHostKv(p.bytes_));
  return p;
}

uint8_t* KvPool::Rows(int64_t block, int64_t layer, int kv) const {
  const uint64_t plane = static_cast<uint64_t>((block * shape_.n_layers + layer) * 2 + kv);
  return memory_->data() + plane * plane_bytes_;
}

namespace {

void StoreRows(const float* x, int64_t n, DType dtype, uint8_t* out) {
  switch (dtype) {
    case DType::kBF16: {
      auto* o = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = F32ToBf16(x[i]);
      break;
    }
    case DType::kF16: {
      auto* o = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = F32ToF16(x[i]);
      break;
    }
    default:
      std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace

void KvPool::WriteRows(int64_t block, int64_t layer, int64_t slot, int64_t n, const float* k,
                       const float* v) {
  const uint64_t offset = static_cast<uint64_t>(slot * shape_.row()) * DTypeSize(dtype_);
  StoreRows(k, n * shape_.row(), dtype_, keys(block, layer) + offset);
  StoreRows(v, n * shape_.row(), dtype_, values(block, layer) + offset);
}

void KvPool::CopyBlock(int64_t src, int64_t dst) {
  memory_->Copy(static_cast<uint64_t>(dst) * block_bytes(),
                static_cast<uint64_t>(src) * block_bytes(), block_bytes());
}

bool KvPool::SaveBlock(int64_t block, uint8_t* dst) const {
  return memory_->ToHost(static_cast<uint64_t>(block) * block_bytes(), block_bytes(), dst);
}

bool KvPool::LoadBlock(int64_t block, const uint8_t* src) {
  return memory_->FromHost(static_cast<uint64_t>(block) * block_bytes(), src, block_bytes());
}

Expected<KvCache> KvCache::Create(const KvShape& shape, int64_t max_positions, DType dtype,
                                  const KvAllocator& allocate) {
  if (max_positions <= 0) return Status::Error("the context must hold at least one position");
  KvCache c;
  const int64_t n_blocks =
      (max_positions + KvPool::kDefaultBlockSize - 1) / KvPool::kDefaultBlockSize;
  MT_ASSIGN_OR_RETURN(c.pool_,
                      KvPool::Create(shape, n_blocks, KvPool::kDefaultBlockSize, dtype, allocate));
  c.blocks_.resize(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b)
    c.blocks_[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  c.max_positions_ = max_positions;
  return c;
}

Status KvCache::Reserve(int64_t n_new) const {
  const int64_t need = n_past_ + n_new;
  if (need > max_positions_)
    return Status::Error("the sequence needs " + std::to_string(need) +
                         " positions but the context holds " + std::to_string(max_positions_) +
                         "; raise --ctx-size or shorten the prompt");
  return OkStatus();
}

}  // namespace moetier
