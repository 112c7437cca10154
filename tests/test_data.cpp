// Datasets, the batch iterator, and IDX files (raw and gzip) including MNIST-style directories.
#include <gtest/gtest.h>

#include <numeric>

#include "test_util.h"

#include <galley/galley.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using galley::Shape;
using galley::Tensor;
using galley::data::BatchIterator;
using galley::data::BatchOptions;
using galley::data::Example;
using galley::data::TensorDataset;

using testutil::error_of;

using testutil::expect_contains;

// N examples whose data [2, 3] is filled with the example's index, labelled index * 10.
TensorDataset indexed_dataset(int64_t n) {
  std::vector<float> d;
  std::vector<int64_t> l;
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 6; ++k) d.push_back(float(i) + 0.01f * k);
    l.push_back(i * 10);
  }
  return TensorDataset(Tensor::from_vector(d, {n, 2, 3}), Tensor::from_vector(l, {n}));
}

// The example indices of one batch, read back from its data, checking the labels agree.
std::vector<int64_t> indices_of(const Example& b) {
  std::vector<int64_t> out;
  std::vector<float> d = b.data.to_vector();
  std::vector<int64_t> l = b.label.to_vector<int64_t>();
  EXPECT_EQ(b.data.size(0), b.label.size(0));
  for (int64_t i = 0; i < b.data.size(0); ++i) {
    const int64_t idx = static_cast<int64_t>(d[i * 6]);
    EXPECT_NEAR(d[i * 6 + 5], float(idx) + 0.05f, 1e-4);
    EXPECT_EQ(l[i], idx * 10) << "data and label of a batch row come from different examples";
    out.push_back(idx);
  }
  return out;
}

std::vector<int64_t> epoch_order(BatchIterator& it) {
  std::vector<int64_t> out;
  for (Example& b : it) {
    std::vector<int64_t> idx = indices_of(b);
    out.insert(out.end(), idx.begin(), idx.end());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// TensorDataset

TEST(TensorDataset, GetAndShapes) {
  TensorDataset ds = indexed_dataset(5);
  EXPECT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds.data_shape(), (Shape{2, 3}));
  EXPECT_EQ(ds.label_shape(), Shape{});
  EXPECT_EQ(ds.label_dtype(), galley::DType::Int64);
  Example e = ds.get(3);
  EXPECT_EQ(e.data.shape(), (Shape{2, 3}));
  EXPECT_EQ(e.label.shape(), Shape{});
  EXPECT_EQ(e.data.to_vector(), (std::vector<float>{3.f, 3.01f, 3.02f, 3.03f, 3.04f, 3.05f}));
  EXPECT_EQ(e.label.to_vector<int64_t>(), (std::vector<int64_t>{30}));
  // A copy: writing it leaves the dataset alone.
  e.data.fill_(-1.f);
  EXPECT_FLOAT_EQ(ds.get(3).data.to_vector()[0], 3.f);
  std::string msg = error_of([&] { ds.get(5); });
  expect_contains(msg, {"5"});
}

TEST(TensorDataset, GetBatch) {
  TensorDataset ds = indexed_dataset(8);
  Tensor d = Tensor::empty({3, 2, 3}), l = Tensor::empty({3}, galley::DType::Int64);
  ds.get_batch({6, 0, 6}, d, l);
  EXPECT_EQ(indices_of({d, l}), (std::vector<int64_t>{6, 0, 6}));
  EXPECT_THROW(ds.get_batch({1, 8, 2}, d, l), galley::Error);
}

TEST(TensorDataset, MultiDimensionalFloatLabels) {
  Tensor data = galley::arange(0, 12).reshape({4, 3});
  Tensor targets = galley::arange(100, 108).reshape({4, 2});
  TensorDataset ds(data, targets);
  EXPECT_EQ(ds.label_shape(), (Shape{2}));
  EXPECT_EQ(ds.label_dtype(), galley::DType::Float32);
  Example e = ds.get(2);
  EXPECT_EQ(e.label.to_vector(), (std::vector<float>{104, 105}));
  BatchIterator it(ds, {.batch_size = 3});
  it.begin();
  Example b = it.load(0);
  EXPECT_EQ(b.label.shape(), (Shape{3, 2}));
  EXPECT_EQ(b.label.to_vector(), (std::vector<float>{100, 101, 102, 103, 104, 105}));
}

TEST(TensorDataset, RejectsMismatchedInputs) {
  std::string msg = error_of([] { TensorDataset(galley::zeros({4, 2}), galley::zeros({3})); });
  expect_contains(msg, {"[4, 2]", "[3]"});
  EXPECT_THROW(TensorDataset(galley::zeros({2}, galley::DType::Int64), galley::zeros({2})),
               galley::Error);
}

// get_batch writes into the caller's tensors: ones that cannot take the batch are refused before
// a byte is written (a batch too small for its indices overflowed the heap).
TEST(TensorDataset, GetBatchRefusesTensorsThatDoNotFit) {
  TensorDataset ds(galley::zeros({10, 2}), Tensor::from_vector(std::vector<int64_t>(10, 1), {10}));
  std::vector<size_t> all(10);
  std::iota(all.begin(), all.end(), size_t(0));
  Tensor small = Tensor::empty({1, 2}), labels = Tensor::empty({10}, galley::DType::Int64);
  expect_contains(error_of([&] { ds.get_batch(all, small, labels); }),
                  {"TensorDataset", "data", "[1, 2]", "10 examples"});
  Tensor data = Tensor::empty({10, 2}), float_labels = Tensor::empty({10});
  expect_contains(error_of([&] { ds.get_batch(all, data, float_labels); }),
                  {"TensorDataset", "label", "float32", "int64"});
  Tensor undefined;
  expect_contains(error_of([&] { ds.get_batch(all, undefined, labels); }),
                  {"TensorDataset", "contiguous tensor on the host"});
  ds.get_batch(all, data, labels);  // the right ones
  EXPECT_EQ(labels.to_vector<int64_t>(), std::vector<int64_t>(10, 1));
}

// ---------------------------------------------------------------------------------------------
// BatchIterator

TEST(BatchIterator, SizesWithAndWithoutDropLast) {
  TensorDataset ds = indexed_dataset(10);
  BatchIterator keep(ds, {.batch_size = 4});
  EXPECT_EQ(keep.size(), 3u);
  std::vector<int64_t> sizes;
  for (Example& b : keep) {
    sizes.push_back(b.data.size(0));
    EXPECT_EQ(b.data.shape(), (Shape{b.data.size(0), 2, 3}));
    EXPECT_EQ(b.label.shape(), (Shape{b.data.size(0)}));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));

  BatchIterator drop(ds, {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(drop.size(), 2u);
  sizes.clear();
  for (Example& b : drop) sizes.push_back(b.data.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));

  TensorDataset even = indexed_dataset(8);
  EXPECT_EQ(BatchIterator(even, {.batch_size = 4}).size(), 2u);
  EXPECT_EQ(BatchIterator(even, {.batch_size = 4, .drop_last = true}).size(), 2u);
  EXPECT_EQ(BatchIterator(even, {.batch_size = 100}).size(), 1u);
  EXPECT_EQ(BatchIterator(even, {.batch_size = 100, .drop_last = true}).size(), 0u);
  BatchIterator none(even, {.batch_size = 100, .drop_last = true});
  int count = 0;
  for (Example& b : none) {
    (void)b;
    ++count;
  }
  EXPECT_EQ(count, 0);
  EXPECT_THROW(BatchIterator(even, {.batch_size = 0}), galley::Error);
}

TEST(BatchIterator, InOrderWithoutShuffle) {
  TensorDataset ds = indexed_dataset(7);
  BatchIterator it(ds, {.batch_size = 3});
  const std::vector<int64_t> want{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(epoch_order(it), want);
  EXPECT_EQ(epoch_order(it), want);
}

TEST(BatchIterator, EveryExampleOncePerEpoch) {
  TensorDataset ds = indexed_dataset(23);
  BatchIterator it(ds, {.batch_size = 5, .shuffle = true, .seed = 3});
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order = epoch_order(it);
    ASSERT_EQ(order.size(), 23u);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 23; ++i) EXPECT_EQ(sorted[i], i) << "epoch " << epoch;
  }
  // With drop_last the epoch holds distinct examples, the last partial batch left out.
  BatchIterator dl(ds, {.batch_size = 5, .shuffle = true, .seed = 3, .drop_last = true});
  std::vector<int64_t> order = epoch_order(dl);
  EXPECT_EQ(order.size(), 20u);
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 20u);
}

TEST(BatchIterator, ShuffleDependsOnlyOnSeedAndEpoch) {
  TensorDataset ds = indexed_dataset(50);
  BatchIterator a(ds, {.batch_size = 8, .shuffle = true, .seed = 17});
  BatchIterator b(ds, {.batch_size = 8, .shuffle = true, .seed = 17});
  std::vector<int64_t> a0 = epoch_order(a), a1 = epoch_order(a);
  std::vector<int64_t> b0 = epoch_order(b), b1 = epoch_order(b);
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);
  std::vector<int64_t> identity(50);
  for (int i = 0; i < 50; ++i) identity[i] = i;
  EXPECT_NE(a0, identity);

  // A different seed gives a different order.
  BatchIterator c(ds, {.batch_size = 8, .shuffle = true, .seed = 18});
  EXPECT_NE(epoch_order(c), a0);

  // set_epoch picks the epoch: a fresh iterator jumps straight to epoch 1, then goes on to 2.
  BatchIterator d(ds, {.batch_size = 8, .shuffle = true, .seed = 17});
  d.set_epoch(1);
  EXPECT_EQ(epoch_order(d), a1);
  std::vector<int64_t> a2 = epoch_order(a);
  EXPECT_EQ(epoch_order(d), a2);
  d.set_epoch(0);
  EXPECT_EQ(epoch_order(d), a0);

  // The batch size does not change the order of the examples.
  BatchIterator e(ds, {.batch_size = 7, .shuffle = true, .seed = 17});
  EXPECT_EQ(epoch_order(e), a0);
}

TEST(BatchIterator, LoadReturnsFreshTensors) {
  TensorDataset ds = indexed_dataset(6);
  BatchIterator it(ds, {.batch_size = 2});
  it.begin();
  Example b0 = it.load(0);
  Example b2 = it.load(2);
  EXPECT_EQ(indices_of(b0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(indices_of(b2), (std::vector<int64_t>{4, 5}));
  EXPECT_NE(b0.data.raw_data(), b2.data.raw_data());
}

// Records the index lists get_batch receives and checks nothing.
class Recording : public galley::data::Dataset {
 public:
  size_t size() const override { return 6; }
  Example get(size_t) const override {
    return {galley::zeros({1}), galley::zeros({}, galley::DType::Int64)};
  }
  Shape data_shape() const override { return {1}; }
  void get_batch(const std::vector<size_t>& indices, Tensor&, Tensor&) const override {
    calls.push_back(indices);
  }
  mutable std::vector<std::vector<size_t>> calls;
};

TEST(BatchIterator, LoadOutOfRangeThrows) {
  // Batch indices past the epoch must be refused, not read past the epoch's order.
  Recording ds;
  BatchIterator it(ds, {.batch_size = 4});
  it.begin();
  it.load(1);
  ASSERT_EQ(ds.calls.size(), 1u);
  EXPECT_EQ(ds.calls[0], (std::vector<size_t>{4, 5}));
  EXPECT_THROW(it.load(2), galley::Error);
  EXPECT_EQ(ds.calls.size(), 1u) << "get_batch was called for a batch past the epoch";
}

// A dataset computed on the fly: exercises Dataset::get_batch's default per-example path.
class Squares : public galley::data::Dataset {
 public:
  size_t size() const override { return 9; }
  Example get(size_t i) const override {
    GALLEY_CHECK(i < size(), "Squares: index ", i);
    return {galley::full({2}, float(i * i)),
            Tensor::from_vector(std::vector<int64_t>{int64_t(i)}, {})};
  }
  Shape data_shape() const override { return {2}; }
};

TEST(BatchIterator, DefaultGetBatchUsesGet) {
  Squares ds;
  BatchIterator it(ds, {.batch_size = 4, .shuffle = true, .seed = 1});
  std::set<int64_t> seen;
  for (Example& b : it) {
    std::vector<float> d = b.data.to_vector();
    std::vector<int64_t> l = b.label.to_vector<int64_t>();
    ASSERT_EQ(b.data.shape(), (Shape{int64_t(l.size()), 2}));
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_FLOAT_EQ(d[2 * i], float(l[i] * l[i]));
      EXPECT_FLOAT_EQ(d[2 * i + 1], float(l[i] * l[i]));
      seen.insert(l[i]);
    }
  }
  EXPECT_EQ(seen.size(), 9u);
}

// ---------------------------------------------------------------------------------------------
// IDX files

void put_u32(std::string& s, uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((v >> sh) & 0xff));
}

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::string s;
  put_u32(s, magic);
  put_u32(s, n);
  put_u32(s, rows);
  put_u32(s, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>((i * 37) % 256));
  return s;
}

std::string idx_labels(uint32_t n, uint32_t magic = 0x801) {
  std::string s;
  put_u32(s, magic);
  put_u32(s, n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

uint32_t crc32(const std::string& s) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  uint32_t crc = 0xffffffffu;
  for (unsigned char ch : s) crc = table[(crc ^ ch) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

// A gzip member holding `s` in stored (uncompressed) deflate blocks: valid gzip that any
// inflater reads, built without a compression library.
std::string gzip(const std::string& s) {
  std::string out{'\x1f', '\x8b', '\x08', '\0', '\0', '\0', '\0', '\0', '\0', '\xff'};
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(65535, s.size() - pos);
    const bool last = pos + len == s.size();
    out.push_back(last ? 1 : 0);
    out.push_back(static_cast<char>(len & 0xff));
    out.push_back(static_cast<char>(len >> 8));
    out.push_back(static_cast<char>(~len & 0xff));
    out.push_back(static_cast<char>((~len >> 8) & 0xff));
    out.append(s, pos, len);
    pos += len;
  } while (pos < s.size());
  const uint32_t crc = crc32(s), size = static_cast<uint32_t>(s.size());
  for (int sh = 0; sh < 32; sh += 8) out.push_back(static_cast<char>((crc >> sh) & 0xff));
  for (int sh = 0; sh < 32; sh += 8) out.push_back(static_cast<char>((size >> sh) & 0xff));
  return out;
}

class IdxFiles : public testutil::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
  }
  // `s` deflated into a gzip file by zlib, as bytes (gzip()'s stored blocks are read whole into
  // zlib's buffer, trailer and all; deflated data is inflated straight into the reader's).
  std::string deflated(const std::string& s) {
    const std::string path = (dir_ / "deflated.gz").string();
    gzFile f = gzopen(path.c_str(), "wb9");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, s.data(), unsigned(s.size())), int(s.size()));
    gzclose(f);
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

void expect_images(const Tensor& t, uint32_t n, uint32_t rows, uint32_t cols) {
  ASSERT_EQ(t.shape(), (Shape{n, 1, rows, cols}));
  EXPECT_EQ(t.dtype(), galley::DType::Float32);
  std::vector<float> v = t.to_vector();
  for (uint32_t i = 0; i < v.size(); ++i)
    ASSERT_FLOAT_EQ(v[i], float((i * 37) % 256) / 255.f) << "pixel " << i;
}

TEST_F(IdxFiles, ReadsRawImagesAndLabels) {
  Tensor img = galley::data::read_idx_images(write("img", idx_images(3, 4, 5)));
  expect_images(img, 3, 4, 5);
  Tensor lbl = galley::data::read_idx_labels(write("lbl", idx_labels(12)));
  EXPECT_EQ(lbl.dtype(), galley::DType::Int64);
  EXPECT_EQ(lbl.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));
}

// A gzip file of several members (as concatenated .gz files are) is one stream: its last
// member's size is not the whole's.
TEST_F(IdxFiles, ReadsGzipFilesOfSeveralMembers) {
  const std::string raw = idx_images(3, 28, 28);
  Tensor img = galley::data::read_idx_images(
      write("multi.gz", gzip(raw.substr(0, 1000)) + gzip(raw.substr(1000))));
  expect_images(img, 3, 28, 28);
}

TEST(FashionMnistDir, AnEmptyVariableMeansTheDefault) {
  const char* old = std::getenv("GALLEY_FASHION_MNIST_DIR");
  const std::string saved = old ? old : "";
  setenv("GALLEY_FASHION_MNIST_DIR", "", 1);
  EXPECT_EQ(galley::data::default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  if (old)
    setenv("GALLEY_FASHION_MNIST_DIR", saved.c_str(), 1);
  else
    unsetenv("GALLEY_FASHION_MNIST_DIR");
}

TEST_F(IdxFiles, ReadsGzipImagesAndLabels) {
  // More than one 64 KiB stored block.
  Tensor img = galley::data::read_idx_images(write("img.gz", gzip(idx_images(100, 28, 28))));
  expect_images(img, 100, 28, 28);
  Tensor lbl = galley::data::read_idx_labels(write("lbl.gz", gzip(idx_labels(7))));
  EXPECT_EQ(lbl.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST_F(IdxFiles, ZeroImages) {
  Tensor img = galley::data::read_idx_images(write("img", idx_images(0, 2, 2)));
  EXPECT_EQ(img.shape(), (Shape{0, 1, 2, 2}));
}

TEST_F(IdxFiles, WrongMagicNamesFileAndMagic) {
  std::string p = write("labels-as-images", idx_labels(4));
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p, "magic"});
  std::string q = write("images-as-labels", idx_images(1, 2, 2));
  msg = error_of([&] { galley::data::read_idx_labels(q); });
  expect_contains(msg, {q, "magic"});
  std::string r = write("bad.gz", gzip(idx_images(1, 2, 2, 0x12345678)));
  msg = error_of([&] { galley::data::read_idx_images(r); });
  expect_contains(msg, {r, "magic"});
}

TEST_F(IdxFiles, TruncatedRawFileNamesFile) {
  std::string full = idx_images(3, 4, 5);
  std::string p = write("short-pixels", full.substr(0, full.size() - 7));
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p, "truncated"});

  std::string q = write("short-header", full.substr(0, 10));
  msg = error_of([&] { galley::data::read_idx_images(q); });
  expect_contains(msg, {q, "truncated"});

  std::string lbl = idx_labels(10);
  std::string r = write("short-labels", lbl.substr(0, lbl.size() - 1));
  msg = error_of([&] { galley::data::read_idx_labels(r); });
  expect_contains(msg, {r, "truncated"});

  std::string e = write("empty", "");
  msg = error_of([&] { galley::data::read_idx_labels(e); });
  expect_contains(msg, {e, "truncated"});
}

TEST_F(IdxFiles, TruncatedGzipFileNamesFile) {
  // The compressed stream ends early (as a cut-off download does).
  std::string gz = gzip(idx_images(3, 4, 5));
  std::string p = write("cut.gz", gz.substr(0, gz.size() - 30));
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p, "truncated"});

  // A complete gzip stream whose content is short.
  std::string full = idx_images(3, 4, 5);
  std::string q = write("short.gz", gzip(full.substr(0, full.size() - 7)));
  msg = error_of([&] { galley::data::read_idx_images(q); });
  expect_contains(msg, {q, "truncated"});
}

TEST_F(IdxFiles, CorruptGzipIsDetected) {
  // One pixel changed after compression: the gzip CRC no longer matches the content.
  std::string gz = gzip(idx_images(2, 3, 3));
  gz[gz.size() - 8 - 3] ^= 0x55;  // a pixel byte inside the last stored block
  std::string p = write("corrupt.gz", gz);
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p});
}

TEST_F(IdxFiles, ACorruptGzipStreamThatStillDecodesIsDetected) {
  // Deflated images whose trailer's checksum is wrong: the content decodes whole, so only reading
  // on to the end of the stream finds the damage (a reader that stopped at the payload's last
  // byte loaded such a file without an error).
  std::string gz = deflated(idx_images(100, 64, 64));
  gz[gz.size() - 8] ^= 0x01;  // the CRC-32's first byte
  std::string p = write("bad-crc.gz", gz);
  expect_contains(error_of([&] { galley::data::read_idx_images(p); }), {p, "corrupt"});
  std::string lz = deflated(idx_labels(300000));
  std::string q =
      write("bad-crc-labels.gz",
            lz.substr(0, lz.size() - 8) + char(lz[lz.size() - 8] ^ 1) + lz.substr(lz.size() - 7));
  expect_contains(error_of([&] { galley::data::read_idx_labels(q); }), {q, "corrupt"});
  // The stream cut inside its trailer, which zlib reports as an end, not as an error.
  for (size_t cut : {1, 4, 8}) {
    std::string r = write("cut-trailer.gz", lz.substr(0, lz.size() - cut));
    expect_contains(error_of([&] { galley::data::read_idx_labels(r); }), {r, "truncated"});
  }
}

TEST_F(IdxFiles, BytesPastTheHeadersCountAreAnError) {
  // A count field smaller than the data, in a raw file and in a gzip one: the rest was ignored.
  std::string raw = write("long-labels", idx_labels(2) + "abc");
  expect_contains(error_of([&] { galley::data::read_idx_labels(raw); }),
                  {raw, "more than its header promises", "labels"});
  std::string gz = write("long-images.gz", gzip(idx_images(2, 2, 2) + std::string(8, '\x7f')));
  expect_contains(error_of([&] { galley::data::read_idx_images(gz); }),
                  {gz, "more than its header promises", "pixel data"});
}

TEST_F(IdxFiles, AbsurdCountInHeaderIsAnError) {
  // A corrupt header claiming 4 billion 4096x4096 images must give an error naming the file,
  // not an attempt to allocate 2^56 bytes.
  std::string s;
  put_u32(s, 0x803);
  put_u32(s, 0xffffffffu);
  put_u32(s, 4096);
  put_u32(s, 4096);
  s += std::string(64, '\0');
  std::string p = write("absurd", s);
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p});
}

TEST_F(IdxFiles, AGzipTrailerThatLiesAboutTheSizeCostsNoMemory) {
  // A 400 KB gzip file whose header claims a million 64x64 images and whose trailer claims the
  // 4 GB they would take: the reader must report the truncation without first allocating (and
  // zero-filling) 4 GB, which is what trusting the trailer did. The content is larger than
  // zlib's 256 KB output buffer, so the trailer is not checked before the pixels are asked for.
  // Each test runs in a process of its own, so the peak resident size tells what this read
  // allocated.
  std::string content = idx_images(100, 64, 64);
  const uint32_t n = 1000000, claimed = 16 + n * 64 * 64;
  std::string count;
  put_u32(count, n);
  content.replace(4, 4, count);
  std::string gz = gzip(content);
  for (int b = 0; b < 4; ++b)
    gz[gz.size() - 4 + b] = static_cast<char>((claimed >> (8 * b)) & 0xff);
  std::string p = write("lying-trailer.gz", gz);
  std::string msg;
  const long kib = testutil::peak_rss_growth_kib(
      [&] { msg = error_of([&] { galley::data::read_idx_images(p); }); });
  expect_contains(msg, {p});
  EXPECT_LT(kib, 512L * 1024) << "reading a 400 KB file raised the peak resident size by " << kib
                              << " KiB";
}

TEST_F(IdxFiles, ImplausibleImageSize) {
  std::string p = write("zero-rows", idx_images(1, 0, 5));
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p});
}

TEST_F(IdxFiles, MissingFileNamesIt) {
  std::string p = (dir_ / "does-not-exist").string();
  std::string msg = error_of([&] { galley::data::read_idx_images(p); });
  expect_contains(msg, {p});
}

TEST_F(IdxFiles, MnistDirectoryRawAndGzip) {
  write("train-images-idx3-ubyte", idx_images(5, 28, 28));
  write("train-labels-idx1-ubyte", idx_labels(5));
  write("t10k-images-idx3-ubyte.gz", gzip(idx_images(3, 28, 28)));
  write("t10k-labels-idx1-ubyte.gz", gzip(idx_labels(3)));
  galley::data::MNIST train(dir_.string());
  EXPECT_EQ(train.size(), 5u);
  EXPECT_EQ(train.data_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(train.labels().to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  expect_images(train.data(), 5, 28, 28);
  galley::data::MNIST test(dir_.string(), galley::data::Split::Test);
  EXPECT_EQ(test.size(), 3u);
  expect_images(test.data(), 3, 28, 28);

  // Normalisation after scaling to [0, 1].
  galley::data::MNIST norm(dir_.string(), galley::data::Split::Train, true, 0.5f, 0.25f);
  std::vector<float> raw = train.data().to_vector(), n = norm.data().to_vector();
  for (size_t i = 0; i < raw.size(); i += 97) EXPECT_NEAR(n[i], (raw[i] - 0.5f) / 0.25f, 1e-5);
}

TEST_F(IdxFiles, MnistMismatchedCountsNameBothFiles) {
  std::string img = write("train-images-idx3-ubyte", idx_images(3, 2, 2));
  std::string lbl = write("train-labels-idx1-ubyte.gz", gzip(idx_labels(2)));
  std::string msg = error_of([&] { galley::data::MNIST ds(dir_.string()); });
  expect_contains(msg, {img, lbl, "3", "2"});
}

// A label past MNIST's ten classes is refused when the split loads, naming the file, the record
// and its byte (it used to load, and surface in the loss naming neither).
TEST_F(IdxFiles, MnistLabelsPastTheClassesAreRefused) {
  write("train-images-idx3-ubyte", idx_images(3, 2, 2));
  std::string labels = idx_labels(3);
  labels[8 + 2] = static_cast<char>(200);
  std::string lbl = write("train-labels-idx1-ubyte", labels);
  std::string msg = error_of([&] { galley::data::MNIST ds(dir_.string()); });
  expect_contains(msg, {lbl, "label 200", "record 2", "at byte 10", "below 10"});
}

TEST_F(IdxFiles, MnistMissingFilesNameTheDirectory) {
  write("train-images-idx3-ubyte", idx_images(3, 2, 2));
  std::string msg = error_of([&] { galley::data::MNIST ds(dir_.string()); });
  expect_contains(msg, {dir_.string(), "train-labels-idx1-ubyte"});
}

TEST(FashionMnist, DefaultDirHonoursEnvironment) {
  const char* old = std::getenv("GALLEY_FASHION_MNIST_DIR");
  std::string saved = old ? old : "";
  unsetenv("GALLEY_FASHION_MNIST_DIR");
  EXPECT_EQ(galley::data::default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  setenv("GALLEY_FASHION_MNIST_DIR", "/some/where", 1);
  EXPECT_EQ(galley::data::default_fashion_mnist_dir(), "/some/where");
  if (old) {
    setenv("GALLEY_FASHION_MNIST_DIR", saved.c_str(), 1);
  } else {
    unsetenv("GALLEY_FASHION_MNIST_DIR");
  }
}

TEST(FashionMnist, TestSplitLoads) {
  const std::string dir = galley::data::default_fashion_mnist_dir();
  std::error_code ec;
  const bool present = fs::exists(fs::path(dir) / "t10k-images-idx3-ubyte", ec) ||
                       fs::exists(fs::path(dir) / "t10k-images-idx3-ubyte.gz", ec);
  if (!present)
    GTEST_SKIP() << "Fashion-MNIST not found in " << dir
                 << " (install dataset-fashion-mnist or set GALLEY_FASHION_MNIST_DIR)";
  galley::data::MNIST ds(dir, galley::data::Split::Test);
  ASSERT_EQ(ds.size(), 10000u);
  EXPECT_EQ(ds.data().shape(), (Shape{10000, 1, 28, 28}));
  EXPECT_EQ(ds.labels().shape(), (Shape{10000}));
  std::vector<int64_t> counts(10, 0);
  for (int64_t y : ds.labels().to_vector<int64_t>()) {
    ASSERT_GE(y, 0);
    ASSERT_LE(y, 9);
    ++counts[y];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], 1000) << "class " << c;  // balanced split
  std::vector<float> px = ds.data().to_vector();
  auto [mn, mx] = std::minmax_element(px.begin(), px.end());
  EXPECT_GE(*mn, 0.f);
  EXPECT_LE(*mx, 1.f);
  EXPECT_FLOAT_EQ(*mx, 1.f);
  double mean = 0;
  for (float v : px) mean += v;
  mean /= double(px.size());
  EXPECT_NEAR(mean, 0.2860, 0.01);  // the statistics MNIST's normalize defaults use
}

}  // namespace
