// CIFAR-10/100 binary files (small synthetic files written here), the uint8 image dataset and
// the synthetic dataset.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/data/cifar.h>
#include <galley/data/dataloader.h>
#include <galley/data/synthetic.h>

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace data = galley::data;
using testutil::error_of;
using testutil::expect_contains;

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("galley_cifar_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Pixel byte of record `r`, byte `k` of the image, in file `f`.
uint8_t pixel(int f, int r, int k) {
  return uint8_t((f * 31 + r * 7 + k) % 251);
}

// Writes `records` CIFAR records; CIFAR-100 records carry (coarse, fine) labels.
void write_cifar(const std::string& path, int f, int records, bool cifar100) {
  std::ofstream out(path, std::ios::binary);
  for (int r = 0; r < records; ++r) {
    if (cifar100) {
      out.put(char((r + f) % 20));
      out.put(char((r * 3 + f) % 100));
    } else {
      out.put(char((r + f) % 10));
    }
    for (int k = 0; k < 3072; ++k) out.put(char(pixel(f, r, k)));
  }
}

TEST(Cifar, ReadsCifar10Directory) {
  TempDir dir;
  for (int f = 1; f <= 5; ++f)
    write_cifar(dir.file("data_batch_" + std::to_string(f) + ".bin"), f, 3, false);
  write_cifar(dir.file("test_batch.bin"), 0, 4, false);
  data::CIFAR train(dir.path.string());
  data::CIFAR test(dir.path.string(), {.split = data::Split::Test});
  ASSERT_EQ(train.size(), 15u);
  ASSERT_EQ(test.size(), 4u);
  EXPECT_EQ(train.data_shape(), (galley::Shape{3, 32, 32}));
  // Record 1 of data_batch_2 is example 4.
  auto e = train.get(4);
  EXPECT_EQ(e.data.shape(), (galley::Shape{3, 32, 32}));
  EXPECT_EQ(int64_t(e.label.item()), (1 + 2) % 10);
  auto v = e.data.to_vector();
  for (int k : {0, 1, 1024, 3071}) EXPECT_FLOAT_EQ(v[k], pixel(2, 1, k) / 255.f) << k;
  // Through the loader: bytes become floats in the workers.
  data::DataLoader loader(train, {.batch_size = 4, .num_workers = 2});
  size_t rows = 0;
  for (auto& [x, y] : loader) {
    EXPECT_EQ(x.size(1), 3);
    rows += y.numel();
  }
  EXPECT_EQ(rows, 15u);
}

TEST(Cifar, ReadsCifar100FineAndCoarse) {
  TempDir dir;
  write_cifar(dir.file("train.bin"), 1, 5, true);
  data::CIFAR fine(dir.path.string(), {.kind = data::CifarKind::Cifar100});
  data::CIFAR coarse(dir.path.string(), {.kind = data::CifarKind::Cifar100, .fine_labels = false});
  ASSERT_EQ(fine.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(fine.labels()[r], (r * 3 + 1) % 100);
    EXPECT_EQ(coarse.labels()[r], (r + 1) % 20);
  }
  EXPECT_EQ(fine.pixels()[3072 * 2 + 5], pixel(1, 2, 5));
}

TEST(Cifar, TruncatedFileNamesFileAndOffset) {
  TempDir dir;
  write_cifar(dir.file("test_batch.bin"), 0, 3, false);
  fs::resize_file(dir.file("test_batch.bin"), 3073 * 2 + 100);
  const std::string msg =
      error_of([&] { data::CIFAR(dir.path.string(), {.split = data::Split::Test}); });
  expect_contains(msg, {dir.file("test_batch.bin"), "truncated", "record 2 at byte 6146",
                        "only 100 of its 3073 bytes"});
}

TEST(Cifar, CorruptLabelNamesFileAndOffset) {
  TempDir dir;
  write_cifar(dir.file("test_batch.bin"), 0, 3, false);
  {
    std::fstream f(dir.file("test_batch.bin"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(3073);
    f.put(char(42));
  }
  const std::string msg =
      error_of([&] { data::CIFAR(dir.path.string(), {.split = data::Split::Test}); });
  expect_contains(msg, {dir.file("test_batch.bin"), "label 42", "record 1 at byte 3073"});
  // A CIFAR-100 file read as CIFAR-10 has the wrong record size.
  write_cifar(dir.file("c100.bin"), 0, 2, true);
  std::vector<uint8_t> px;
  std::vector<int64_t> lb;
  expect_contains(error_of([&] {
                    data::read_cifar_file(dir.file("c100.bin"), data::CifarKind::Cifar10, px, lb);
                  }),
                  {"c100.bin", "truncated or corrupt"});
}

// A failed read adds nothing to the caller's vectors; a directory is not a file.
TEST(Cifar, AFailedReadLeavesTheVectorsAsTheyWere) {
  TempDir dir;
  write_cifar(dir.file("good.bin"), 0, 2, false);
  write_cifar(dir.file("bad.bin"), 0, 3, false);
  {
    std::fstream f(dir.file("bad.bin"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(3073);
    f.put(char(42));
  }
  std::vector<uint8_t> px;
  std::vector<int64_t> lb;
  data::read_cifar_file(dir.file("good.bin"), data::CifarKind::Cifar10, px, lb);
  expect_contains(error_of([&] {
                    data::read_cifar_file(dir.file("bad.bin"), data::CifarKind::Cifar10, px, lb);
                  }),
                  {"bad.bin", "label 42"});
  EXPECT_EQ(px.size(), 2u * 3072);
  EXPECT_EQ(lb.size(), 2u);
  std::filesystem::create_directory(dir.file("adir"));
  expect_contains(
      error_of([&] { data::read_cifar_file(dir.file("adir"), data::CifarKind::Cifar10, px, lb); }),
      {"adir", "not a regular file"});
}

// A file too large for the memory left (a sparse one here, under a limit on the address space)
// is an OutOfMemoryError naming it, the vectors as they were.
TEST(Cifar, AFileLargerThanMemoryIsAnOutOfMemoryErrorNamingIt) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers map more address space than a limit on it leaves";
#endif
  TempDir dir;
  std::ofstream(dir.file("test_batch.bin")).close();
  fs::resize_file(dir.file("test_batch.bin"), uintmax_t(3073) * 1'000'000);  // 3 GB of label 0
  std::vector<uint8_t> px(3072, 7);
  std::vector<int64_t> lb{1};
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = testutil::mapped_bytes() + (size_t(256) << 20);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &tight), 0);
  std::string what;
  bool out_of_memory = false;
  try {
    data::read_cifar_file(dir.file("test_batch.bin"), data::CifarKind::Cifar10, px, lb);
  } catch (const galley::OutOfMemoryError& e) {
    out_of_memory = true;
    what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_TRUE(out_of_memory) << what;
  expect_contains(what, {"test_batch.bin", "3073000000 bytes", "host memory"});
  EXPECT_EQ(px.size(), 3072u);
  EXPECT_EQ(lb.size(), 1u);
}

TEST(Cifar, MissingAndEmptyFiles) {
  TempDir dir;
  expect_contains(error_of([&] { data::CIFAR(dir.path.string()); }),
                  {"cannot open CIFAR-10 file", "data_batch_1.bin"});
  std::ofstream(dir.file("test.bin")).close();
  expect_contains(error_of([&] {
                    data::CIFAR(dir.path.string(),
                                {.kind = data::CifarKind::Cifar100, .split = data::Split::Test});
                  }),
                  {"test.bin", "is empty"});
}

TEST(UInt8ImageDataset, ChecksSizes) {
  expect_contains(error_of([] {
                    data::UInt8ImageDataset({1, 2, 3}, {0, 1}, {2});
                  }),
                  {"3 bytes do not hold 2 samples"});
  data::UInt8ImageDataset ds({0, 255, 51, 102}, {3, 4}, {2}, 1.f / 255.f);
  auto e = ds.get(1);
  auto v = e.data.to_vector();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FLOAT_EQ(v[0], 0.2f);
  EXPECT_FLOAT_EQ(v[1], 0.4f);
  EXPECT_EQ(int64_t(e.label.item()), 4);
}

TEST(SyntheticDataset, DeterministicAnyShape) {
  data::SyntheticDataset a({.size = 10, .data_shape = {2, 3, 4, 5}, .num_classes = 7, .seed = 3});
  data::SyntheticDataset b({.size = 10, .data_shape = {2, 3, 4, 5}, .num_classes = 7, .seed = 3});
  data::SyntheticDataset c({.size = 10, .data_shape = {2, 3, 4, 5}, .num_classes = 7, .seed = 4});
  EXPECT_EQ(a.get(6).data.shape(), (galley::Shape{2, 3, 4, 5}));
  EXPECT_EQ(a.get(6).data.to_vector(), b.get(6).data.to_vector());
  EXPECT_NE(a.get(6).data.to_vector(), c.get(6).data.to_vector());
  EXPECT_NE(a.get(6).data.to_vector(), a.get(7).data.to_vector());
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(int64_t(a.get(i).label.item()), a.label(i));
    EXPECT_LT(a.label(i), 7);
    for (float v : a.get(i).data.to_vector()) EXPECT_TRUE(v >= 0.f && v <= 1.f);
  }
  EXPECT_THROW(data::SyntheticDataset({.size = 1, .data_shape = {0}}), galley::Error);
  EXPECT_THROW(a.get(10), galley::Error);
}

}  // namespace
