// safetensors files: round trips, the on-disk format, damaged files and safe replacement.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using galley::DType;
using galley::Shape;
using galley::Tensor;
using galley::io::load_safetensors;
using galley::io::save_safetensors;

using testutil::error_of;

using testutil::expect_contains;

Tensor fvec(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

class SafeTensors : public testutil::TempDirTest {
 protected:
  static void write(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  // Every file name in the test directory.
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// A safetensors file from a JSON header and raw data, as other libraries write them.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out;
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void expect_same(const Tensor& got, const Tensor& want, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  switch (want.dtype()) {
    case DType::Float32:
      EXPECT_EQ(got.to_vector(), want.to_vector());
      break;
    case DType::Int64:
      EXPECT_EQ(got.to_vector<int64_t>(), want.to_vector<int64_t>());
      break;
    case DType::UInt8:
      EXPECT_EQ(got.to_vector<uint8_t>(), want.to_vector<uint8_t>());
      break;
    default:
      FAIL() << "unexpected dtype";
  }
}

std::map<std::string, Tensor> sample() {
  galley::Generator g(5);
  const uint8_t bytes[3] = {0, 128, 255};
  return {
      {"conv.weight", galley::randn({4, 3, 3, 3}, g)},
      {"fc.bias", fvec({1.5f, -2.25f, 0.f}, {3})},
      {"scalar", galley::full({}, 3.5f)},
      {"labels", Tensor::from_vector(std::vector<int64_t>{-1, 0, 1LL << 40, 7}, {2, 2})},
      {"mask", Tensor::from_host(bytes, {3}, DType::UInt8)},
      {"empty", galley::zeros({0, 5})},
      {"row", galley::randn({1, 7}, g)},
  };
}

// ---------------------------------------------------------------------------------------------
// Round trips and format

TEST_F(SafeTensors, RoundTrip) {
  auto tensors = sample();
  save_safetensors(path("a.safetensors"), tensors);
  auto back = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(back.size(), tensors.size());
  for (auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    expect_same(back[name], t, name);
    EXPECT_TRUE(back[name].is_contiguous());
  }
  EXPECT_EQ(back["scalar"].dim(), 0);
  EXPECT_FLOAT_EQ(back["scalar"].item(), 3.5f);
  EXPECT_EQ(listing(), (std::vector<std::string>{"a.safetensors"}));
}

TEST_F(SafeTensors, EmptyMap) {
  save_safetensors(path("none"), {});
  EXPECT_TRUE(load_safetensors(path("none")).empty());
}

TEST_F(SafeTensors, SavesParametersAndViews) {
  Tensor p = fvec({1, 2, 3, 4, 5, 6}, {2, 3});
  p.set_requires_grad();
  Tensor derived = p * 2.f;  // part of a graph
  save_safetensors(path("p"), {{"p", p}, {"d", derived}, {"v", p.view({3, 2})}});
  auto back = load_safetensors(path("p"));
  EXPECT_EQ(back["p"].to_vector(), p.to_vector());
  EXPECT_FALSE(back["p"].requires_grad());
  EXPECT_EQ(back["d"].to_vector(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(back["v"].shape(), (Shape{3, 2}));
  // Saving does not disturb the graph.
  galley::sum(derived).backward();
  EXPECT_EQ(p.grad().to_vector(), std::vector<float>(6, 2.f));
}

TEST_F(SafeTensors, FileLayoutIsStandard) {
  save_safetensors(path("f"), {{"w", fvec({1, 2}, {2})}, {"i", galley::zeros({1}, DType::Int64)}});
  std::string bytes = read(path("f"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  ASSERT_LE(8 + len, bytes.size());
  EXPECT_EQ((8 + len) % 8, 0u) << "tensor data should start 8-byte aligned";
  const std::string header = bytes.substr(8, len);
  expect_contains(header, {"\"w\"", "\"F32\"", "\"i\"", "\"I64\"", "data_offsets", "shape"});
  EXPECT_EQ(bytes.size(), 8 + len + 2 * sizeof(float) + sizeof(int64_t));
  EXPECT_EQ(header.front(), '{');
}

TEST_F(SafeTensors, ReadsFilesWrittenElsewhere) {
  // As written by the Python safetensors package: metadata, keys in any order, offsets into
  // the data section.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
      R"("n":{"dtype":"I64","shape":[],"data_offsets":[16,24]}})";
  int64_t n = 42;
  std::string data = float_bytes({1.5f, -2.f, 3.f, 4.f}) +
                     std::string(reinterpret_cast<const char*>(&n), sizeof n);
  write(path("ext"), safetensors_bytes(header, data));
  auto t = load_safetensors(path("ext"));
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t["a"].shape(), (Shape{1, 2}));
  EXPECT_EQ(t["a"].to_vector(), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(t["b"].to_vector(), (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(t["n"].dim(), 0);
  EXPECT_EQ(t["n"].to_vector<int64_t>(), (std::vector<int64_t>{42}));
}

TEST_F(SafeTensors, LayerStateDictRoundTrip) {
  galley::manual_seed(1);
  galley::nn::Sequential a(std::make_shared<galley::nn::Linear>(4, 3),
                           std::make_shared<galley::nn::ReLU>(),
                           std::make_shared<galley::nn::Linear>(3, 2));
  galley::manual_seed(2);
  galley::nn::Sequential b(std::make_shared<galley::nn::Linear>(4, 3),
                           std::make_shared<galley::nn::ReLU>(),
                           std::make_shared<galley::nn::Linear>(3, 2));
  save_safetensors(path("model"), a.state_dict());
  b.load_state_dict(load_safetensors(path("model")));
  Tensor x = galley::ones({5, 4});
  EXPECT_EQ(a(x).to_vector(), b(x).to_vector());
}

// ---------------------------------------------------------------------------------------------
// Damaged files

TEST_F(SafeTensors, MissingFileNamesIt) {
  std::string p = path("nope.safetensors");
  std::string msg = error_of([&] { load_safetensors(p); });
  expect_contains(msg, {p});
}

TEST_F(SafeTensors, TruncatedFileNamesIt) {
  save_safetensors(path("full"), sample());
  const std::string bytes = read(path("full"));

  // Cut in the data section.
  std::string p = path("cut-data");
  write(p, bytes.substr(0, bytes.size() - 5));
  std::string msg = error_of([&] { load_safetensors(p); });
  expect_contains(msg, {p});

  // Cut in the header.
  std::string q = path("cut-header");
  write(q, bytes.substr(0, 20));
  msg = error_of([&] { load_safetensors(q); });
  expect_contains(msg, {q});

  // Cut in the length prefix.
  std::string r = path("cut-length");
  write(r, bytes.substr(0, 5));
  msg = error_of([&] { load_safetensors(r); });
  expect_contains(msg, {r, "truncated"});

  std::string e = path("empty");
  write(e, "");
  msg = error_of([&] { load_safetensors(e); });
  expect_contains(msg, {e});
}

TEST_F(SafeTensors, CorruptHeaderNamesFile) {
  save_safetensors(path("good"), {{"w", fvec({1, 2, 3}, {3})}});
  std::string bytes = read(path("good"));
  std::string p = path("garbled");
  std::string bad = bytes;
  for (size_t i = 8; i < 20; ++i) bad[i] = '#';
  write(p, bad);
  std::string msg = error_of([&] { load_safetensors(p); });
  expect_contains(msg, {p});

  std::string q = path("not-object");
  write(q, safetensors_bytes("[1, 2, 3]", ""));
  msg = error_of([&] { load_safetensors(q); });
  expect_contains(msg, {q});

  std::string r = path("no-dtype");
  write(r, safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", float_bytes({1})));
  msg = error_of([&] { load_safetensors(r); });
  expect_contains(msg, {r, "w"});

  std::string s = path("f64");
  write(s, safetensors_bytes(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                             std::string(8, '\0')));
  msg = error_of([&] { load_safetensors(s); });
  expect_contains(msg, {s, "w", "F64"});

  std::string t = path("wrong-span");
  write(t, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                             float_bytes({1, 2})));
  msg = error_of([&] { load_safetensors(t); });
  expect_contains(msg, {t, "w", "[3]"});

  std::string u = path("past-end");
  write(u, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                             float_bytes({1, 2})));
  msg = error_of([&] { load_safetensors(u); });
  expect_contains(msg, {u, "w"});

  std::string v = path("huge-length");
  std::string hl = bytes;
  hl[7] = '\x7f';  // header length far beyond the file
  write(v, hl);
  msg = error_of([&] { load_safetensors(v); });
  expect_contains(msg, {v});
}

// ---------------------------------------------------------------------------------------------
// Saving safely

TEST_F(SafeTensors, HeadersThatAliasOrRepeatAreRefused) {
  // An empty tensor between two overlapping ones does not hide the overlap.
  std::string p = path("hidden-overlap");
  write(p, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             std::string(16, '\0')));
  expect_contains(error_of([&] { load_safetensors(p); }), {p, "'a' and 'c' overlap"});
  // A name given twice.
  std::string q = path("repeated");
  write(q, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                             std::string(8, '\0')));
  expect_contains(error_of([&] { load_safetensors(q); }), {q, "'a' twice"});
  // Metadata that is not an object of strings.
  std::string r = path("bad-metadata");
  write(r, safetensors_bytes(R"({"__metadata__":"hello"})", ""));
  expect_contains(error_of([&] { load_safetensors(r); }), {r, "__metadata__"});
  // A directory.
  fs::create_directory(path("adir"));
  expect_contains(error_of([&] { load_safetensors(path("adir")); }),
                  {path("adir"), "not a regular file"});
  // An empty tensor with huge other sizes holds no bytes.
  std::string e = path("empty-huge");
  write(e,
        safetensors_bytes(
            R"({"e":{"dtype":"F32","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}})",
            ""));
  EXPECT_EQ(load_safetensors(e).at("e").numel(), 0);
}

TEST_F(SafeTensors, HostileHeadersAreErrorsWithoutCrashOrHugeAllocation) {
  // A shape nested 200,000 arrays deep (printing it for the message recursed off the stack), and
  // objects nested 2 million deep (parsed, they took 400 bytes of memory a byte of header):
  // refused on their depth before the header is parsed, at little memory.
  std::string deep = path("deep");
  write(deep, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[)" + std::string(200000, '[') +
                                    std::string(200000, ']') + R"(],"data_offsets":[0,0]}})",
                                ""));
  const std::string deep_msg = error_of([&] { load_safetensors(deep); });
  expect_contains(deep_msg, {deep, "nests deeper than 64 levels at byte 98"});
  EXPECT_LT(deep_msg.size(), 500u);
  std::string nested = path("nested");
  {
    std::string h = R"({"x":)";
    for (int i = 0; i < 2000000; ++i) h += R"({"a":)";
    h += "1" + std::string(2000001, '}');
    write(nested, safetensors_bytes(h, ""));
  }
  const long nested_kib = testutil::peak_rss_growth_kib([&] {
    expect_contains(error_of([&] { load_safetensors(nested); }), {nested, "nests deeper"});
  });
  EXPECT_LT(nested_kib, 64L * 1024)
      << "refusing a 12 MB header raised the peak resident size by " << nested_kib << " KiB";
  // Brackets inside strings are not nesting, past an escaped quote too.
  std::string quoted = path("quoted");
  write(quoted, safetensors_bytes(R"({"__metadata__":{"k":")" + std::string(1000, '[') + R"(\")" +
                                      std::string(1000, '{') + R"("}})",
                                  ""));
  EXPECT_EQ(galley::io::read_safetensors(quoted).metadata.at("k"),
            std::string(1000, '[') + "\"" + std::string(1000, '{'));
  // 400 entries over the same MiB: refused on the overlap before any of them is allocated (each
  // was allocated and read first: memory in proportion to entries x data).
  std::string alias = path("alias");
  std::string header = "{";
  for (int i = 0; i < 400; ++i)
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
              R"(":{"dtype":"U8","shape":[1048576],"data_offsets":[0,1048576]})";
  write(alias, safetensors_bytes(header + "}", std::string(size_t(1) << 20, '\1')));
  const long alias_kib = testutil::peak_rss_growth_kib([&] {
    expect_contains(error_of([&] { load_safetensors(alias); }), {alias, "overlap"});
  });
  EXPECT_LT(alias_kib, 64L * 1024)
      << "refusing a 1 MiB file raised the peak resident size by " << alias_kib << " KiB";
  // A header length of 200 MB in a sparse file: refused before the header is read.
  std::string big = path("big-header");
  {
    std::string len;
    const uint64_t n = uint64_t(200) << 20;
    for (int i = 0; i < 8; ++i) len.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    write(big, len + "{");
    fs::resize_file(big, 8 + n);
  }
  expect_contains(error_of([&] { load_safetensors(big); }), {big, "header length", "may take"});
  // A NUL byte in the header, with JSON after it that must not be ignored.
  std::string nul = path("nul");
  write(nul, safetensors_bytes(std::string("{}") + '\0' + "junk", ""));
  expect_contains(error_of([&] { load_safetensors(nul); }), {nul, "NUL byte at byte 10"});
}

TEST_F(SafeTensors, HeadersTheFormatRefusesAreRefused) {
  const std::string four = float_bytes({1, 2, 3, 4});
  // A field given twice inside an entry (the last one won).
  std::string twice = path("field-twice");
  write(
      twice,
      safetensors_bytes(
          R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8],"data_offsets":[0,16]}})", four));
  expect_contains(error_of([&] { load_safetensors(twice); }),
                  {twice, "entry 'a' gives 'data_offsets' twice"});
  // Bytes no tensor holds: a gap before a tensor, and bytes past the last.
  std::string gap = path("gap");
  write(gap, safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", four));
  expect_contains(error_of([&] { load_safetensors(gap); }), {gap, "belong to no tensor", "'a'"});
  std::string tail = path("tail");
  write(tail,
        safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", four));
  expect_contains(error_of([&] { load_safetensors(tail); }), {tail, "belong to no tensor"});
  // Offsets that run backwards, and the wrong number of them, say so.
  std::string back = path("backwards");
  write(back,
        safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", four));
  expect_contains(error_of([&] { load_safetensors(back); }), {back, "[16, 0] run backwards"});
  std::string three = path("three");
  write(three,
        safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})", four));
  expect_contains(error_of([&] { load_safetensors(three); }), {three, "holds 3 values"});
}

TEST_F(SafeTensors, NamesThatAreNotUtf8AreErrorsAndLongNamesSave) {
  save_safetensors(path("keep"), {{"w", fvec({1, 2}, {2})}});
  const std::string before = read(path("keep"));
  expect_contains(error_of([&] {
                    save_safetensors(path("keep"), {{"bad\xff", fvec({1}, {1})}});
                  }),
                  {path("keep"), "bad", "not valid UTF-8"});
  expect_contains(error_of([&] {
                    save_safetensors(path("keep"), {{"w", fvec({1}, {1})}}, {{"k", "v\xfe"}});
                  }),
                  {"metadata entry 'k'", "not valid UTF-8"});
  EXPECT_EQ(read(path("keep")), before);
  // A name near the file system's limit: the temporary beside it has a short name of its own.
  const std::string longest = path(std::string(250, 'a') + ".st");
  save_safetensors(longest, {{"w", fvec({3}, {1})}});
  EXPECT_EQ(load_safetensors(longest).at("w").to_vector(), std::vector<float>{3});
}

TEST_F(SafeTensors, SaveIntoMissingDirectoryThrowsAndLeavesNothing) {
  std::string p = path("no/such/dir/model.safetensors");
  std::string msg = error_of([&] { save_safetensors(p, sample()); });
  expect_contains(msg, {"model.safetensors"});
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(listing().empty());
}

TEST_F(SafeTensors, UndefinedTensorThrowsAndLeavesNothing) {
  auto tensors = sample();
  tensors["zz.undefined"] = Tensor();
  std::string msg = error_of([&] { save_safetensors(path("m"), tensors); });
  expect_contains(msg, {path("m"), "zz.undefined"});
  EXPECT_TRUE(listing().empty());
  auto reserved = sample();
  reserved["__metadata__"] = galley::zeros({1});
  expect_contains(error_of([&] { save_safetensors(path("m"), reserved); }),
                  {path("m"), "'__metadata__' is reserved"});
  EXPECT_TRUE(listing().empty());
}

// "__metadata__": null is no metadata, as the safetensors library reads it.
TEST_F(SafeTensors, NullMetadataIsNone) {
  const std::string p = path("null-metadata");
  write(p, safetensors_bytes(R"({"__metadata__":null,"a":{"dtype":"F32","shape":[1],)"
                             R"("data_offsets":[0,4]}})",
                             float_bytes({2.5f})));
  const auto file = galley::io::read_safetensors(p);
  EXPECT_TRUE(file.metadata.empty());
  EXPECT_EQ(file.tensors.at("a").to_vector(), std::vector<float>{2.5f});
}

TEST_F(SafeTensors, FailedRenameLeavesNoTemporary) {
  // The target is a directory, so the final rename fails: nothing may be left behind.
  fs::create_directory(path("target"));
  EXPECT_THROW(save_safetensors(path("target"), sample()), galley::Error);
  EXPECT_EQ(listing(), (std::vector<std::string>{"target"}));
  EXPECT_TRUE(fs::is_directory(path("target")));
}

TEST_F(SafeTensors, SaveReplacesExistingFileAtomically) {
  const std::string p = path("ckpt.safetensors");
  save_safetensors(p, {{"w", fvec({1, 2, 3}, {3})}});
  // A hard link keeps the old file's inode: if the new content were written in place, the
  // link would see it too.
  ASSERT_EQ(link(p.c_str(), path("old").c_str()), 0);
  save_safetensors(p, {{"w", fvec({9, 8}, {2})}, {"extra", galley::ones({1})}});
  auto now = load_safetensors(p);
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now["w"].to_vector(), (std::vector<float>{9, 8}));
  auto old = load_safetensors(path("old"));
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old["w"].to_vector(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(listing(), (std::vector<std::string>{"ckpt.safetensors", "old"}));

  // A failed save leaves the existing file as it was.
  std::map<std::string, Tensor> bad{{"a", galley::ones({1})}, {"b", Tensor()}};
  EXPECT_THROW(save_safetensors(p, bad), galley::Error);
  EXPECT_EQ(load_safetensors(p)["w"].to_vector(), (std::vector<float>{9, 8}));
  EXPECT_EQ(listing(), (std::vector<std::string>{"ckpt.safetensors", "old"}));
}

TEST_F(SafeTensors, SaveOverReadOnlyTemporaryLocationFails) {
  // A directory without write permission: saving fails cleanly and the old file survives.
  if (geteuid() == 0) GTEST_SKIP() << "permissions are not enforced for root";
  const std::string sub = path("ro");
  fs::create_directory(sub);
  const std::string p = sub + "/m.safetensors";
  save_safetensors(p, {{"w", fvec({1}, {1})}});
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec);
  std::string msg = error_of([&] { save_safetensors(p, {{"w", fvec({2}, {1})}}); });
  fs::permissions(sub, fs::perms::owner_all);
  expect_contains(msg, {"m.safetensors"});
  EXPECT_EQ(load_safetensors(p)["w"].to_vector(), (std::vector<float>{1}));
}

}  // namespace
