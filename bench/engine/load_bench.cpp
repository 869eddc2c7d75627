// Load speed of a converted model against the raw sequential read speed of the same files,
// measured in the same run with the page cache dropped for the files before each measurement
// (posix_fadvise DONTNEED; bank reads use O_DIRECT anyway). Prints one JSON object.
//
//   load_bench --model CONVERTED_DIR [--repeats 3] [--backend cpu] [--no-verify]
//   load_bench --model CONVERTED_DIR --streams 4x8,8x8,4x32 [--repeats 3]
//
// --streams reads only the banks, as the load does (ReadFileRanges into freshly mapped memory),
// with each THREADSxCHUNK_MIB given, and the files buffered with 1 MiB reads (`cat`'s way), the
// variants interleaved over the repeats; it gives each one's median GB/s.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/thread_pool.h"
#include "io/converted_model.h"
#include "io/direct_read.h"
#include "model/causal_lm.h"

using namespace moetier;
namespace fs = std::filesystem;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void DropCache(const std::vector<fs::path>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// One thread, 16 MiB O_DIRECT reads, file after file: what `dd iflag=direct bs=16M` measures.
double RawReadSeconds(const std::vector<fs::path>& files, uint64_t* bytes) {
  constexpr size_t kBlock = 16u << 20;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, kBlock) != 0) std::exit(1);
  *bytes = 0;
  const double t0 = Now();
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_DIRECT);
    const bool direct = fd >= 0;
    if (!direct) fd = ::open(f.c_str(), O_RDONLY);
    for (;;) {
      const ssize_t r = ::read(fd, buf, kBlock);
      if (r <= 0) break;
      *bytes += static_cast<uint64_t>(r);
    }
    ::close(fd);
  }
  const double t = Now() - t0;
  std::free(buf);
  return t;
}

// Every file read buffered in 1 MiB calls, one thread, as `cat` reads: seconds.
double BufferedReadSeconds(const std::vector<fs::path>& files) {
  std::vector<char> buf(1u << 20);
  const double t0 = Now();
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    while (fd >= 0 && ::read(fd, buf.data(), buf.size()) > 0) {
    }
    if (fd >= 0) ::close(fd);
  }
  return Now() - t0;
}

// The banks read as the load reads them, into fresh anonymous mappings: seconds (< 0: failed).
double StreamSeconds(const ConvertedModel& cm, int threads, size_t chunk_bytes) {
  std::vector<FileRange> ranges;
  for (const BankIndexBank& b : cm.index().banks)
    ranges.push_back({cm.FilePath(b.file), b.offset, b.bytes});
  std::vector<void*> maps(ranges.size(), MAP_FAILED);
  ThreadPool pool(threads);
  RangeReader reader;
  reader.chunk_bytes = chunk_bytes;
  reader.dst = [&](size_t i) -> Expected<uint8_t*> {
    maps[i] = ::mmap(nullptr, ranges[i].n_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (maps[i] == MAP_FAILED) return Status::Error("mmap failed");
    return static_cast<uint8_t*>(maps[i]);
  };
  const double t0 = Now();
  const Status st = ReadFileRanges(ranges, reader, pool, nullptr);
  const double t = Now() - t0;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (maps[i] != MAP_FAILED) ::munmap(maps[i], ranges[i].n_bytes);
  if (!st.ok()) std::fprintf(stderr, "error: %s\n", st.message().c_str());
  return st.ok() ? t : -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --streams: each variant's median GB/s over the repeats, as one JSON object.
int RunStreams(const ConvertedModel& cm, const std::vector<fs::path>& files,
               const std::string& list, int repeats) {
  struct Variant {
    int threads = 0;  // 0: buffered, one thread
    size_t chunk_mib = 0;
    std::vector<double> gbps;
  };
  std::vector<Variant> variants = {{}};
  for (size_t at = 0; at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    Variant v;
    if (std::sscanf(list.substr(at, comma - at).c_str(), "%dx%zu", &v.threads, &v.chunk_mib) != 2 ||
        v.threads < 1 || v.chunk_mib < 1) {
      std::fprintf(stderr, "--streams: '%s' is not THREADSxCHUNK_MIB\n",
                   list.substr(at, comma - at).c_str());
      return 2;
    }
    variants.push_back(v);
    at = comma + 1;
  }
  uint64_t bank_bytes = 0, file_bytes = 0;
  for (const BankIndexBank& b : cm.index().banks) bank_bytes += b.bytes;
  for (const auto& f : cm.index().files) file_bytes += f.bytes;
  for (int r = 0; r < repeats; ++r)
    for (Variant& v : variants) {
      DropCache(files);
      const double s = v.threads == 0 ? BufferedReadSeconds(files)
                                      : StreamSeconds(cm, v.threads, v.chunk_mib << 20);
      if (s < 0) return 1;
      v.gbps.push_back(static_cast<double>(v.threads == 0 ? file_bytes : bank_bytes) / 1e9 / s);
    }
  std::printf("{\"bank_bytes\": %llu, \"file_bytes\": %llu, \"repeats\": %d, \"streams\": [",
              static_cast<unsigned long long>(bank_bytes),
              static_cast<unsigned long long>(file_bytes), repeats);
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    std::printf(
        "%s{\"threads\": %d, \"chunk_mib\": %zu, \"gb_per_s\": %.3f, \"min\": %.3f, \"max\": %.3f}",
        i ? ", " : "", v.threads, v.chunk_mib, Median(v.gbps),
        *std::min_element(v.gbps.begin(), v.gbps.end()),
        *std::max_element(v.gbps.begin(), v.gbps.end()));
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, backend = "cpu", streams;
  int repeats = 3;
  bool verify = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc)
      dir = argv[++i];
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc)
      repeats = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--backend") && i + 1 < argc)
      backend = argv[++i];
    else if (!std::strcmp(argv[i], "--no-verify"))
      verify = false;
    else if (!std::strcmp(argv[i], "--streams") && i + 1 < argc)
      streams = argv[++i];
  }
  if (dir.empty() || !IsConvertedModelDir(dir)) {
    std::fprintf(
        stderr,
        "usage: load_bench --model CONVERTED_DIR [--repeats N] [--backend B] [--no-verify] "
        "[--streams THREADSxCHUNK_MIB,...]\n");
    return 2;
  }
  auto cm = ConvertedModel::Open(dir);
  if (!cm.ok()) {
    std::fprintf(stderr, "error: %s\n", cm.message().c_str());
    return 1;
  }
  std::vector<fs::path> files;
  for (uint32_t i = 0; i < cm->index().files.size(); ++i) files.push_back(cm->FilePath(i));
  SetLogLevel(std::getenv("MOETIER_DEBUG") ? LogLevel::kDebug : LogLevel::kWarn);
  if (!streams.empty()) return RunStreams(*cm, files, streams, repeats);

  std::vector<double> raw_gbps, load_gbps;
  uint64_t raw_bytes = 0, model_bytes = 0;
  for (const auto& f : cm->index().files) model_bytes += f.bytes;
  std::string read_mode;
  for (int r = 0; r < repeats; ++r) {
    DropCache(files);
    const double raw_s = RawReadSeconds(files, &raw_bytes);
    raw_gbps.push_back(static_cast<double>(raw_bytes) / 1e9 / raw_s);

    DropCache(files);
    LoadOptions o;
    auto b = ParseBackend(backend);
    if (!b.ok()) return 1;
    o.residency.backend = *b;
    o.residency.verify = verify;
    const double t0 = Now();
    auto m = LoadCausalLM(dir, o);
    const double load_s = Now() - t0;
    if (!m.ok()) {
      std::fprintf(stderr, "error: %s\n", m.message().c_str());
      return 1;
    }
    read_mode = (*m)->residency().read_mode;
    load_gbps.push_back(static_cast<double>(model_bytes) / 1e9 / load_s);
  }
  const double raw = Median(raw_gbps), load = Median(load_gbps);
  std::printf(
      "{\"model\": \"%s\", \"bytes\": %llu, \"repeats\": %d, \"verify\": %s, \"read_mode\": "
      "\"%s\", "
      "\"raw_read_gb_per_s\": %.3f, \"load_gb_per_s\": %.3f, \"load_over_raw\": %.3f}\n",
      dir.c_str(), static_cast<unsigned long long>(model_bytes), repeats, verify ? "true" : "false",
      read_mode.c_str(), raw, load, load / raw);
  return 0;
}
