// Load speed of a converted model against the raw sequential read speed of the same files,
// measured in the same run with the page cache dropped for the files before each measurement
// (posix_fadvise DONTNEED; bank reads use O_DIRECT anyway). Prints one JSON object.
//
//   load_bench --model CONVERTED_DIR [--repeats 3] [--backend cpu] [--no-verify]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "io/converted_model.h"
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, backend = "cpu";
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
  }
  if (dir.empty() || !IsConvertedModelDir(dir)) {
    std::fprintf(
        stderr,
        "usage: load_bench --model CONVERTED_DIR [--repeats N] [--backend B] [--no-verify]\n");
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
