// Matmul kernel throughput against the machine's limits, per weight format x instruction set x
// thread count. Prints one JSON object on stdout.
//
//   kernel_bench [--gib 1] [--reps 7] [--threads N] [--isa all|scalar,avx2,...]
//                [--formats f32,bf16,f16,q8_0,q4_0,bf16c] [--prefill 32,128] [--prefill-experts 4]
//
// Decode: Qwen3-30B-A3B expert shapes (gate/up [768, 2048], down [2048, 768]), as many experts
// as make --gib of weights (far past the last-level cache), one token. Each thread takes the
// same contiguous row range of every matrix (as the CPU executor splits an expert) and runs
// DotRows on it; activations are prepared once, outside the timing. GB/s counts weight bytes
// streamed. The reference is a streaming read (a sum of 64-bit words, plain or prefetching
// like the kernels, whichever is faster) over exactly the same byte ranges with the same
// threads: "pct_of_read" is the median over runs of kernel GB/s / read GB/s, each kernel run
// paired with a read run just before it. "decode_per_call" instead runs each matrix as its own
// Prepare + ParallelFor (what MatMul does), so it includes the pool's wake-up per matrix.
//
// Prefill: T tokens (default 32 and 128) through a few experts, each matrix a
// Prepare (on the pool, as MatMul does) + ParallelFor; GFLOP/s = 2·N·K·T / time, and
// "pct_of_fma_peak" compares it with a register-only fp32 FMA loop of the same vector width on the
// same threads (for quantized formats this says how the int8 path compares with fp32 FMA peak; it
// can exceed 100%).
//
// Every figure is the median of --reps timed runs after one warm-up.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/stream_read.h"

using namespace moetier;
using kernels::CpuIsa;
using Json = nlohmann::ordered_json;

namespace {

constexpr int64_t kDModel = 2048;   // Qwen3-30B-A3B hidden size
constexpr int64_t kExpertFf = 768;  // its moe_intermediate_size

struct Options {
  double gib = 1.0;
  int reps = 7;
  int threads = 0;
  std::vector<std::string> isas;  // empty: every supported one
  std::vector<std::string> formats = {"f32", "bf16", "f16", "q8_0", "q4_0"};
  std::vector<int64_t> prefill_tokens = {32, 128};
  int prefill_experts = 4;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

DType FormatDType(const std::string& f) {
  if (f == "f32") return DType::kF32;
  if (f == "bf16") return DType::kBF16;
  if (f == "f16") return DType::kF16;
  if (f == "q8_0") return DType::kQ8_0;
  if (f == "q4_0") return DType::kQ4_0;
  if (f == "bf16c") return DType::kBF16C;
  std::fprintf(stderr, "kernel_bench: unknown format '%s'\n", f.c_str());
  std::exit(2);
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <typename Fn>
double MedianSeconds(int reps, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(Seconds(a, std::chrono::steady_clock::now()));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---------------------------------------------------------------------------------------------
// The streaming read (kernels/cpu/stream_read.h), with the widest vectors the CPU has whatever
// --isa says: the limit every level's kernel is compared with.

uint64_t ReadSum(const uint8_t* p, size_t n, bool prefetch) {
  return kernels::StreamReadSum(kernels::BestCpuIsa(), p, n, prefetch);
}

// Register-only fp32 FMA throughput (GFLOP/s per call of `iters` x 12 FMAs per lane group).
__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float l[16];
  _mm512_store_ps(l, s);
  float t = 0.0f;
  for (float v : l) t += v;
  return t;
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

// GFLOP/s of the FMA loop of `width` lanes (8 or 16) on every thread of the pool.
double FmaPeakGflops(ThreadPool& pool, int width, int reps) {
  const int64_t iters = 20'000'000;
  std::vector<float> sink(static_cast<size_t>(pool.size()));
  const double s = MedianSeconds(reps, [&] {
    pool.ParallelFor(static_cast<size_t>(pool.size()), [&](size_t b, size_t, int) {
      sink[b] = width == 16 ? FmaLoopAvx512(iters) : FmaLoopAvx2(iters);
    });
  });
  return 2.0 * width * 12.0 * static_cast<double>(iters) * pool.size() / s / 1e9;
}

// ---------------------------------------------------------------------------------------------
// Expert weights.

struct Matrix {
  TensorView view;
  int64_t rows, k;
};

struct ExpertBank {
  DType dtype;
  uint8_t* data = nullptr;
  size_t bytes = 0;
  std::vector<Matrix> mats;  // expert after expert: gate, up, down
  ExpertBank() = default;
  ExpertBank(const ExpertBank&) = delete;
  ExpertBank& operator=(const ExpertBank&) = delete;
  ~ExpertBank() { std::free(data); }
};

// Random but benign contents: no NaN, infinity or subnormal (they could slow some paths).
void FillBank(ExpertBank& bank, ThreadPool& pool) {
  const size_t words = bank.bytes / 8;
  pool.ParallelFor(static_cast<size_t>(pool.size()), [&](size_t t, size_t, int) {
    const size_t a = words * t / static_cast<size_t>(pool.size());
    const size_t b = words * (t + 1) / static_cast<size_t>(pool.size());
    uint64_t s = 0x9E3779B97F4A7C15ull * (t + 1);
    auto* w = reinterpret_cast<uint64_t*>(bank.data);
    for (size_t i = a; i < b; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      uint64_t v = s;
      if (bank.dtype == DType::kBF16) v = (v & 0x807F807F807F807Full) | 0x3C003C003C003C00ull;
      if (bank.dtype == DType::kF16) v = (v & 0x83FF83FF83FF83FFull) | 0x2C002C002C002C00ull;
      if (bank.dtype == DType::kF32) v = (v & 0x807FFFFF807FFFFFull) | 0x3C0000003C000000ull;
      w[i] = v;
    }
  });
  if (IsBlockQuantized(bank.dtype)) {  // sane fp16 scales in every block
    const size_t bb = DTypeBlockBytes(bank.dtype);
    for (size_t off = 0; off + bb <= bank.bytes; off += bb) {
      const uint16_t h = 0x2C00 | static_cast<uint16_t>(off % 1021);
      std::memcpy(bank.data + off, &h, 2);
    }
  }
}

void MakeBank(ExpertBank& bank, DType dt, int64_t n_experts, ThreadPool& pool) {
  bank.dtype = dt;
  const size_t gate_bytes = DTypeRowBytes(dt, kDModel) * kExpertFf;
  const size_t down_bytes = DTypeRowBytes(dt, kExpertFf) * kDModel;
  const size_t per_expert = 2 * gate_bytes + down_bytes;
  bank.bytes = (per_expert * static_cast<size_t>(n_experts) + 4095) / 4096 * 4096;
  bank.data = static_cast<uint8_t*>(std::aligned_alloc(4096, bank.bytes));
  if (bank.data == nullptr) {
    std::fprintf(stderr, "kernel_bench: cannot allocate %zu bytes\n", bank.bytes);
    std::exit(1);
  }
  FillBank(bank, pool);
  size_t off = 0;
  for (int64_t e = 0; e < n_experts; ++e)
    for (int m = 0; m < 3; ++m) {
      const int64_t rows = m < 2 ? kExpertFf : kDModel, k = m < 2 ? kDModel : kExpertFf;
      const size_t n = m < 2 ? gate_bytes : down_bytes;
      bank.mats.push_back({TensorView{dt, {rows, k}, bank.data + off, n}, rows, k});
      off += n;
    }
  if (dt != DType::kBF16C) return;
  // Row headers of benign weights: a table of 16 high bytes for magnitudes 2^-3..2^4 of either
  // sign, and an exception every fourth row (real rows have ~0-1), so the patch path is timed.
  for (const Matrix& m : bank.mats) {
    const size_t rb = DTypeRowBytes(dt, m.k);
    for (int64_t r = 0; r < m.rows; ++r) {
      uint8_t* row = const_cast<uint8_t*>(m.view.bytes()) + static_cast<size_t>(r) * rb;
      for (int c = 0; c < 16; ++c) row[c] = static_cast<uint8_t>((c < 8 ? 0x3C : 0xBC) + c % 8 / 2);
      std::memset(row + 16, 0xFF, 48);
      if (r % 4 == 0) {
        const uint16_t at = static_cast<uint16_t>(r % m.k), bits = 0x3F80;
        std::memcpy(row + 16, &at, 2);
        std::memcpy(row + 18, &bits, 2);
      }
    }
  }
}

int64_t ExpertsFor(DType dt, double gib) {
  const size_t per_expert =
      2 * DTypeRowBytes(dt, kDModel) * kExpertFf + DTypeRowBytes(dt, kExpertFf) * kDModel;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(gib * 1073741824.0 / per_expert)));
}

// Thread t's rows of a matrix: the same contiguous split ThreadPool::ParallelFor makes.
std::pair<int64_t, int64_t> RowsOf(int64_t rows, int t, int n) {
  return {rows * t / n, rows * (t + 1) / n};
}

std::vector<float> RandomVec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  const char* kUsage =
      "usage: kernel_bench [--gib G] [--reps R] [--threads N] [--isa all|a,b]"
      " [--formats f32,bf16,f16,q8_0,q4_0,bf16c] [--prefill 32,128 | 0]"
      " [--prefill-experts E]\n"
      "  --prefill 0 skips the prefill measurements; see the top of kernel_bench.cpp for what"
      " each figure means\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) {
      std::fprintf(stderr, "kernel_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    ++i;
    if (a == "--gib")
      opt.gib = std::atof(v);
    else if (a == "--reps")
      opt.reps = std::max(1, std::atoi(v));
    else if (a == "--threads")
      opt.threads = std::atoi(v);
    else if (a == "--isa")
      opt.isas = std::string(v) == "all" ? std::vector<std::string>{} : Split(v);
    else if (a == "--formats")
      opt.formats = Split(v);
    else if (a == "--prefill") {
      opt.prefill_tokens.clear();
      for (const std::string& s : Split(v)) {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
          std::fprintf(stderr,
                       "kernel_bench: --prefill takes token counts like 32,128 (or 0), not '%s'\n",
                       s.c_str());
          return 2;
        }
        const long long t = std::atoll(s.c_str());
        if (t > 0) opt.prefill_tokens.push_back(t);  // 0: no prefill figures
      }
    } else if (a == "--prefill-experts")
      opt.prefill_experts = std::max(1, std::atoi(v));
    else {
      std::fprintf(stderr, "kernel_bench: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }

  std::vector<CpuIsa> isas;
  for (CpuIsa isa : kernels::kAllCpuIsas) {
    if (!kernels::CpuSupports(isa)) continue;
    if (!opt.isas.empty() && std::find(opt.isas.begin(), opt.isas.end(),
                                       std::string(kernels::CpuIsaName(isa))) == opt.isas.end())
      continue;
    isas.push_back(isa);
  }

  ThreadPool pool_all(opt.threads);
  ThreadPool pool_one(1);
  std::vector<ThreadPool*> pools = {&pool_one};
  if (pool_all.size() > 1) pools.push_back(&pool_all);

  Json out;
  Json supported = Json::array();
  for (CpuIsa isa : kernels::kAllCpuIsas)
    if (kernels::CpuSupports(isa)) supported.push_back(kernels::CpuIsaName(isa));
  out["machine"] = {{"cpu", CpuModel()},
                    {"threads", pool_all.size()},
                    {"isas_supported", supported},
                    {"default_isa", kernels::CpuIsaName(kernels::BestCpuIsa())}};
  out["shapes"] = {{"gate_up", {kExpertFf, kDModel}}, {"down", {kDModel, kExpertFf}}};
  out["method"] = "median of " + std::to_string(opt.reps) + " runs after 1 warm-up";

  Json peak = Json::object();
  for (ThreadPool* pool : pools) {
    const std::string key = std::to_string(pool->size());
    if (kernels::CpuSupports(CpuIsa::kAvx2))
      peak["avx2_fp32_gflops_t" + key] = FmaPeakGflops(*pool, 8, opt.reps);
    if (kernels::CpuSupports(CpuIsa::kAvx512))
      peak["avx512_fp32_gflops_t" + key] = FmaPeakGflops(*pool, 16, opt.reps);
  }
  out["fma_peak"] = peak;

  Json decode = Json::array(), per_call = Json::array(), read_bw = Json::array(),
       prefill = Json::array();
  const std::vector<float> x2048 = RandomVec(static_cast<size_t>(kDModel) * 512, 1);
  const std::vector<float> x768 = RandomVec(static_cast<size_t>(kExpertFf) * 512, 2);
  std::vector<float> y(static_cast<size_t>(kDModel) * 512);

  for (const std::string& fname : opt.formats) {
    const DType dt = FormatDType(fname);
    ExpertBank bank;
    MakeBank(bank, dt, ExpertsFor(dt, opt.gib), pool_all);
    const double gb = static_cast<double>(bank.bytes) / 1e9;

    // One streaming read over the same ranges the kernels read, with the same threads.
    auto read_sweep = [&](ThreadPool& pool, bool prefetch) {
      const int n = pool.size();
      std::vector<uint64_t> sink(static_cast<size_t>(n));
      pool.ParallelFor(static_cast<size_t>(n), [&](size_t t, size_t, int) {
        uint64_t acc = 0;
        for (const Matrix& m : bank.mats) {
          const auto [a, b] = RowsOf(m.rows, static_cast<int>(t), n);
          const size_t rb = DTypeRowBytes(dt, m.k);
          acc += ReadSum(m.view.bytes() + a * rb, static_cast<size_t>(b - a) * rb, prefetch);
        }
        sink[t] = acc;
      });
    };
    // The reference read bandwidth per thread count: the faster of a plain and a prefetching
    // streaming read (that variant is then re-measured alongside every kernel run).
    std::vector<bool> read_prefetch;
    for (ThreadPool* pool : pools) {
      Json row = {{"format", fname}, {"threads", pool->size()}, {"bytes", bank.bytes}};
      double best = 0.0;
      bool best_prefetch = false;
      for (bool prefetch : {false, true}) {
        const double g = gb / MedianSeconds(opt.reps, [&] { read_sweep(*pool, prefetch); });
        row[prefetch ? "gbs_prefetch" : "gbs_plain"] = g;
        if (g > best) {
          best = g;
          best_prefetch = prefetch;
        }
      }
      row["gbs"] = best;
      read_prefetch.push_back(best_prefetch);
      read_bw.push_back(row);
    }
    std::vector<double> read_gbs;
    for (const Json& r : read_bw)
      if (r["format"] == fname) read_gbs.push_back(r["gbs"].get<double>());

    for (CpuIsa isa : isas) {
      kernels::PreparedActivations p2048, p768;
      p2048.Prepare(x2048.data(), 1, kDModel, dt, isa);
      p768.Prepare(x768.data(), 1, kExpertFf, dt, isa);
      // The scalar reference is slow: fewer runs.
      const int reps = isa == CpuIsa::kScalar ? std::min(opt.reps, 3) : opt.reps;
      for (size_t pi = 0; pi < pools.size(); ++pi) {
        ThreadPool& pool = *pools[pi];
        const int n = pool.size();
        auto sweep = [&] {
          pool.ParallelFor(static_cast<size_t>(n), [&](size_t t, size_t, int) {
            for (const Matrix& m : bank.mats) {
              const auto [a, b] = RowsOf(m.rows, static_cast<int>(t), n);
              kernels::DotRows(m.view, a, b, m.k == kDModel ? p2048 : p768, y.data(), m.rows);
            }
          });
        };
        // Kernel and read sweeps alternate, so both see the same machine state; the share is
        // the median of the per-run ratios.
        std::vector<double> gbs, pct;
        sweep();
        for (int rep = 0; rep < reps; ++rep) {
          const double rs = MedianSeconds(1, [&] { read_sweep(pool, read_prefetch[pi]); });
          const auto a = std::chrono::steady_clock::now();
          sweep();
          const double ks = Seconds(a, std::chrono::steady_clock::now());
          gbs.push_back(gb / ks);
          pct.push_back(100.0 * rs / ks);
        }
        std::sort(gbs.begin(), gbs.end());
        std::sort(pct.begin(), pct.end());
        decode.push_back({{"format", fname},
                          {"isa", kernels::CpuIsaName(isa)},
                          {"threads", n},
                          {"gbs", gbs[gbs.size() / 2]},
                          {"pct_of_read", pct[pct.size() / 2]},
                          {"ms_per_sweep", gb / gbs[gbs.size() / 2] * 1e3}});
      }
      if (isa == CpuIsa::kScalar) continue;

      // Each matrix as its own Prepare + ParallelFor (MatMul's path), all threads.
      {
        ThreadPool& pool = *pools.back();
        kernels::PreparedActivations p;
        const double s = MedianSeconds(opt.reps, [&] {
          for (const Matrix& m : bank.mats) {
            p.Prepare(m.k == kDModel ? x2048.data() : x768.data(), 1, m.k, dt, isa);
            pool.ParallelFor(static_cast<size_t>(m.rows), [&](size_t a, size_t b, int) {
              kernels::DotRows(m.view, static_cast<int64_t>(a), static_cast<int64_t>(b), p,
                               y.data(), m.rows);
            });
          }
        });
        per_call.push_back({{"format", fname},
                            {"isa", kernels::CpuIsaName(isa)},
                            {"threads", pool.size()},
                            {"gbs", gb / s},
                            {"pct_of_read", 100.0 * (gb / s) / read_gbs.back()},
                            {"us_per_matrix", s * 1e6 / static_cast<double>(bank.mats.size())}});
      }

      // Prefill: T tokens through a few experts, Prepare included.
      for (int64_t T : opt.prefill_tokens) {
        const size_t n_mats =
            std::min(bank.mats.size(), static_cast<size_t>(3 * opt.prefill_experts));
        double flops = 0.0, bytes = 0.0;
        for (size_t i = 0; i < n_mats; ++i) {
          flops += 2.0 * bank.mats[i].rows * bank.mats[i].k * T;
          bytes += static_cast<double>(bank.mats[i].view.n_bytes);
        }
        for (ThreadPool* poolp : pools) {
          ThreadPool& pool = *poolp;
          kernels::PreparedActivations p;
          const double s = MedianSeconds(opt.reps, [&] {
            for (size_t i = 0; i < n_mats; ++i) {
              const Matrix& m = bank.mats[i];
              p.Prepare(pool, m.k == kDModel ? x2048.data() : x768.data(), T, m.k, dt, isa);
              pool.ParallelFor(static_cast<size_t>(m.rows), [&](size_t a, size_t b, int) {
                kernels::DotRows(m.view, static_cast<int64_t>(a), static_cast<int64_t>(b), p,
                                 y.data(), m.rows);
              });
            }
          });
          const bool wide = isa >= CpuIsa::kAvx512;
          const std::string pk = std::string(wide ? "avx512" : "avx2") + "_fp32_gflops_t" +
                                 std::to_string(pool.size());
          Json row = {{"format", fname},           {"isa", kernels::CpuIsaName(isa)},
                      {"threads", pool.size()},    {"tokens", T},
                      {"gflops", flops / s / 1e9}, {"weight_gbs", bytes / s / 1e9}};
          if (peak.contains(pk))
            row["pct_of_fma_peak"] = 100.0 * (flops / s / 1e9) / peak[pk].get<double>();
          prefill.push_back(row);
        }
      }
    }
  }
  out["read_bandwidth"] = read_bw;
  out["decode"] = decode;
  out["decode_per_call"] = per_call;
  out["prefill"] = prefill;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
