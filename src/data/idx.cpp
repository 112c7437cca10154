// IDX (MNIST-family) files through zlib, which reads gzip and raw files alike.
#include "galley/data/idx.h"

#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>

#include "galley/data/transforms.h"

namespace galley::data {

namespace {

struct GzFile {
  gzFile f = nullptr;
  std::string path;
  int64_t offset = 0;  // bytes consumed from the decompressed stream

  explicit GzFile(const std::string& p) : path(p) {
    std::ifstream probe(p, std::ios::binary);
    GALLEY_CHECK(probe.good(), "cannot open IDX file '", p, "'");
    f = gzopen(p.c_str(), "rb");
    GALLEY_CHECK(f, "cannot open IDX file '", p, "'");
    gzbuffer(f, 1 << 17);
  }
  // Size of a raw file's stream, -1 for a compressed one: a gzip trailer's ISIZE gives the size
  // of its last member only (a file of several members, which zlib reads whole, would look
  // short), so compressed data is bounded by read()'s chunks instead.
  int64_t stream_size() const {
    if (!gzdirect(f)) return -1;
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    return static_cast<int64_t>(in.tellg());
  }
  // Fails before allocating when the header's count (its field at byte 4) promises more bytes
  // than the stream holds.
  void expect_remaining(int64_t bytes, const char* what) const {
    const int64_t total = stream_size();
    if (total < 0) return;
    GALLEY_CHECK(offset + bytes <= total, "IDX file '", path,
                 "' is truncated: the count at byte 4 promises ", bytes, " bytes of ", what,
                 " but only ", std::max<int64_t>(0, total - offset), " follow");
  }
  ~GzFile() {
    if (f) gzclose(f);
  }
  // Reads n bytes into `out`, growing it as the bytes arrive: a gzip trailer may lie about the
  // size, so a corrupt file costs memory in proportion to what it really holds. `what` names the
  // field for the error.
  void read(std::vector<uint8_t>& out, int64_t n, const char* what) {
    constexpr int64_t kChunk = int64_t(64) << 20;
    out.clear();
    int64_t got = 0;
    while (got < n) {
      if (int64_t(out.size()) == got)
        out.resize(static_cast<size_t>(got + std::min(kChunk, n - got)));
      const int want = static_cast<int>(int64_t(out.size()) - got);
      const int r = gzread(f, out.data() + got, static_cast<unsigned>(want));
      if (r < 0) {
        int err = 0;
        const char* msg = gzerror(f, &err);
        GALLEY_CHECK(false, "IDX file '", path, "' is corrupt: read error at byte ", offset + got,
                     " (", what, "): ", msg);
      }
      GALLEY_CHECK(r > 0, "IDX file '", path, "' is truncated: needed ", n, " bytes of ", what,
                   " at byte ", offset, ", found only ", got);
      got += r;
    }
    offset += n;
  }
  // Reads on past the header's payload (`what`), which must be the end of the stream: a raw file
  // holds no more bytes, and a gzip one decodes to its end, where zlib checks the trailer's
  // checksum and length. Stopping at the payload's last byte left both unread: a corrupt member
  // that still decoded that many bytes loaded without an error.
  void expect_end(const char* what) {
    uint8_t extra[64];
    const int r = gzread(f, extra, sizeof extra);
    if (r < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      GALLEY_CHECK(false, "IDX file '", path, "' is corrupt: past its ", what, " (byte ", offset,
                   " of the data) zlib reports: ", msg);
    }
    // (a stream cut inside its trailer reads as an end with Z_BUF_ERROR, not as an error)
    int err = Z_OK;
    if (r == 0 && !gzdirect(f)) gzerror(f, &err);
    GALLEY_CHECK(err != Z_BUF_ERROR, "IDX file '", path, "' is truncated: its gzip stream ends ",
                 "before its trailer (past its ", what, " at byte ", offset, ")");
    GALLEY_CHECK(r == 0, "IDX file '", path, "' holds more than its header promises: bytes past ",
                 "its ", what, " at byte ", offset, " (a count or size field that is wrong, or a ",
                 "corrupt file)");
  }
  uint32_t read_u32(const char* what) {
    std::vector<uint8_t> b;
    read(b, 4, what);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  }
};

}  // namespace

Tensor read_idx_images(const std::string& path) {
  GzFile f(path);
  uint32_t magic = f.read_u32("the magic number");
  GALLEY_CHECK(magic == 0x00000803, "IDX file '", path, "': magic number 0x", std::hex, magic,
               " at byte 0, expected 0x00000803 (unsigned-byte images, 3 dimensions)");
  uint32_t n = f.read_u32("the image count"), rows = f.read_u32("the row count"),
           cols = f.read_u32("the column count");
  GALLEY_CHECK(rows > 0 && cols > 0 && rows <= 4096 && cols <= 4096, "IDX file '", path,
               "': implausible image size ", rows, "x", cols, " at byte 8");
  const int64_t plane = int64_t(rows) * cols;
  f.expect_remaining(int64_t(n) * plane, "pixel data");
  std::vector<uint8_t> raw;
  f.read(raw, int64_t(n) * plane, "pixel data");
  f.expect_end("pixel data");
  Tensor out = Tensor::empty({int64_t(n), 1, int64_t(rows), int64_t(cols)});
  float* p = out.data<float>();
  uint8_to_float(raw.data(), p, raw.size());  // divided by 255, as torchvision's ToTensor
  return out;
}

Tensor read_idx_labels(const std::string& path) {
  GzFile f(path);
  uint32_t magic = f.read_u32("the magic number");
  GALLEY_CHECK(magic == 0x00000801, "IDX file '", path, "': magic number 0x", std::hex, magic,
               " at byte 0, expected 0x00000801 (unsigned-byte labels, 1 dimension)");
  uint32_t n = f.read_u32("the label count");
  f.expect_remaining(n, "labels");
  std::vector<uint8_t> raw;
  f.read(raw, n, "labels");
  f.expect_end("labels");
  Tensor out = Tensor::empty({int64_t(n)}, DType::Int64);
  int64_t* p = out.data<int64_t>();
  for (size_t i = 0; i < raw.size(); ++i) p[i] = raw[i];
  return out;
}

std::string default_fashion_mnist_dir() {
  const char* env = std::getenv("GALLEY_FASHION_MNIST_DIR");
  if (env && *env) return env;  // an empty value is no directory: the default
  return "/usr/share/datasets/fashion-mnist";
}

namespace {
std::string find_file(const std::string& root, const std::string& stem) {
  for (const char* ext : {"", ".gz"}) {
    std::string p = root + "/" + stem + ext;
    if (std::ifstream(p).good()) return p;
  }
  GALLEY_CHECK(false, "MNIST: neither '", root, "/", stem, "' nor '", root, "/", stem,
               ".gz' exists");
  return {};
}

TensorDataset load_split(const std::string& root, Split split, bool normalize, float mean,
                         float std) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string img_path = find_file(root, prefix + "-images-idx3-ubyte");
  const std::string lbl_path = find_file(root, prefix + "-labels-idx1-ubyte");
  Tensor images = read_idx_images(img_path);
  Tensor labels = read_idx_labels(lbl_path);
  GALLEY_CHECK(images.size(0) == labels.size(0), "MNIST: '", img_path, "' holds ", images.size(0),
               " images but '", lbl_path, "' holds ", labels.size(0), " labels");
  // Checked here, as the CIFAR reader checks its own: a label past the classes would otherwise
  // surface in the loss, naming neither the file nor the record.
  const int64_t* label = labels.data<int64_t>();
  for (int64_t r = 0; r < labels.numel(); ++r)
    GALLEY_CHECK(label[r] < MNIST::kNumClasses, "MNIST: label ", label[r], " of record ", r,
                 " in '", lbl_path, "' at byte ", 8 + r, " is not below ", MNIST::kNumClasses);
  if (normalize) {
    GALLEY_CHECK(std::isfinite(mean) && std::isfinite(std) && std > 0, "MNIST: mean ", mean,
                 " and std ", std, " must be finite, std positive");
    float* p = images.data<float>();
    for (int64_t i = 0, n = images.numel(); i < n; ++i) p[i] = (p[i] - mean) / std;
  }
  return TensorDataset(images, labels);
}
}  // namespace

MNIST::MNIST(const std::string& root, Split split, bool normalize, float mean, float std)
    : TensorDataset(load_split(root, split, normalize, mean, std)) {}

}  // namespace galley::data
