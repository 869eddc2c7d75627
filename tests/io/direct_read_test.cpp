// ReadFileRanges: ranges across files read as one chunk stream by several threads land byte for
// byte where their dst said; done runs in order, once a range is whole; a dst that waits for an
// earlier range's done (the loader's staging buffers) does not deadlock; errors name the file.
#include "io/direct_read.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

constexpr size_t kPage = 4096;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], FreeDeleter>;

AlignedBytes AllocateAligned(size_t n) {
  return AlignedBytes(static_cast<uint8_t*>(std::aligned_alloc(kPage, std::max(n, kPage))));
}

class DirectRead : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(testing::TestSeed());
    for (int f = 0; f < 2; ++f) {
      std::string bytes(kPage * (37 + 11 * static_cast<size_t>(f)), '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      paths_.push_back(dir_.path() / ("bank-" + std::to_string(f)));
      std::ofstream(paths_.back(), std::ios::binary).write(bytes.data(), std::ssize(bytes));
      contents_.push_back(std::move(bytes));
    }
    // Ranges of uneven lengths (a chunk is 3 pages below), one empty, two files interleaved.
    ranges_ = {{paths_[0], 0, 5 * kPage},          {paths_[1], 2 * kPage, 7 * kPage},
               {paths_[0], 5 * kPage, 0},          {paths_[0], 5 * kPage, 1 * kPage},
               {paths_[1], 9 * kPage, 39 * kPage}, {paths_[0], 30 * kPage, 7 * kPage}};
  }

  bool Whole(size_t i, const uint8_t* got) const {
    const FileRange& r = ranges_[i];
    const std::string& file = contents_[r.path == paths_[0] ? 0 : 1];
    return std::memcmp(got, file.data() + r.offset, r.n_bytes) == 0;
  }

  testing::TempDir dir_;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::string> contents_;
  std::vector<FileRange> ranges_;
};

TEST_F(DirectRead, RangesLandWhereDstSaysAndDoneComesInOrderOnceEachIsWhole) {
  ThreadPool pool(3);
  std::vector<AlignedBytes> buffers;
  for (const FileRange& r : ranges_) buffers.push_back(AllocateAligned(r.n_bytes));
  std::vector<int> asked(ranges_.size(), 0);
  std::vector<size_t> done_order;
  std::vector<bool> whole_at_done;
  RangeReader reader;
  reader.chunk_bytes = 3 * kPage;
  reader.dst = [&](size_t i) -> Expected<uint8_t*> {
    ++asked[i];
    return buffers[i].get();
  };
  reader.done = [&](size_t i) {
    done_order.push_back(i);
    whole_at_done.push_back(asked[i] == 1 && Whole(i, buffers[i].get()));
    return OkStatus();
  };
  ReadMode mode;
  ASSERT_TRUE(ReadFileRanges(ranges_, reader, pool, &mode).ok());
  ASSERT_EQ(done_order.size(), ranges_.size());
  for (size_t i = 0; i < ranges_.size(); ++i) {
    EXPECT_EQ(done_order[i], i);
    EXPECT_TRUE(whole_at_done[i]) << "range " << i;
    EXPECT_EQ(asked[i], 1) << "range " << i;
  }
}

TEST_F(DirectRead, ADstWaitingForAnEarlierRangesDoneDoesNotDeadlock) {
  // Two buffers, as the loader's staging: range i may start only once range i - 2 is done.
  constexpr size_t kBuffers = 2;
  ThreadPool pool(4);
  std::vector<AlignedBytes> slots;
  for (size_t k = 0; k < kBuffers; ++k) slots.push_back(AllocateAligned(39 * kPage));
  std::mutex mu;
  std::condition_variable cv;
  size_t n_done = 0;
  std::vector<bool> whole(ranges_.size(), false);
  RangeReader reader;
  reader.chunk_bytes = kPage;
  reader.dst = [&](size_t i) -> Expected<uint8_t*> {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return i < n_done + kBuffers; });
    return slots[i % kBuffers].get();
  };
  reader.done = [&](size_t i) {
    whole[i] = Whole(i, slots[i % kBuffers].get());
    std::lock_guard<std::mutex> l(mu);
    ++n_done;
    cv.notify_all();
    return OkStatus();
  };
  ASSERT_TRUE(ReadFileRanges(ranges_, reader, pool, nullptr).ok());
  for (size_t i = 0; i < ranges_.size(); ++i) EXPECT_TRUE(whole[i]) << "range " << i;
}

TEST_F(DirectRead, ErrorsNameTheFileAndStopTheStream) {
  ThreadPool pool(2);
  AlignedBytes buffer = AllocateAligned(64 * kPage);
  RangeReader reader;
  reader.chunk_bytes = 2 * kPage;
  reader.dst = [&](size_t) -> Expected<uint8_t*> { return buffer.get(); };
  // Past the end of the first file.
  std::vector<FileRange> past = {{paths_[0], 30 * kPage, 8 * kPage}};
  Status st = ReadFileRanges(past, reader, pool, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(paths_[0].string() + ": read failed at offset"), std::string::npos)
      << st.message();
  // A missing file.
  std::vector<FileRange> missing = {{dir_.path() / "nope", 0, kPage}};
  st = ReadFileRanges(missing, reader, pool, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nope: cannot open"), std::string::npos) << st.message();
  // dst's and done's errors come back; done runs for no range after the one that failed.
  std::vector<size_t> done;
  reader.dst = [&](size_t i) -> Expected<uint8_t*> {
    if (i == 3) return Status::Error("no buffer for range 3");
    return buffer.get();
  };
  reader.done = [&](size_t i) {
    done.push_back(i);
    return OkStatus();
  };
  st = ReadFileRanges(ranges_, reader, pool, nullptr);
  EXPECT_EQ(st.message(), "no buffer for range 3");
  for (size_t i : done) EXPECT_LT(i, 3u);
  reader.dst = [&](size_t) -> Expected<uint8_t*> { return buffer.get(); };
  reader.done = [&](size_t i) { return i == 1 ? Status::Error("range 1 refused") : OkStatus(); };
  EXPECT_EQ(ReadFileRanges(ranges_, reader, pool, nullptr).message(), "range 1 refused");
  // A chunk that is not a multiple of 4096.
  reader.chunk_bytes = 5000;
  st = ReadFileRanges(ranges_, reader, pool, nullptr);
  EXPECT_NE(st.message().find("multiple of 4096"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace moetier
