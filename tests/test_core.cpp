// Policy contracts (positive and negative models), IDX reading and its
// errors, the sampler against torch's DistributedSampler, hook detection.
#include "test_models.hpp"

#include "catch.hpp"

#include <sys/stat.h>
#include <loom/loom.hpp>

#include <fstream>
#include <sstream>
#include <zlib.h>

// ----------------------------------------------------------- contracts
namespace models {
// A minimal strategy written from scratch: inherits the single-process defaults.
struct my_strategy : loom::strategy_base {
  static constexpr std::string_view name = "mine";
};
struct untagged {};
struct tagged_only {
  using loom_concept = loom::strategy_tag;
};
struct my_precision : loom::precision_base {
  static constexpr std::string_view name = "mine";
  static constexpr c10::ScalarType param_dtype = c10::ScalarType::Float;
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
};
struct precision_without_dtypes : loom::precision_base {
  static constexpr std::string_view name = "incomplete";
};
}  // namespace models

TEST_CASE("the built-in policies model their concepts; incomplete ones do not", "[concepts]") {
  STATIC_REQUIRE(loom::Accelerator<loom::cpu>);
  STATIC_REQUIRE(loom::Accelerator<loom::cuda>);
  STATIC_REQUIRE(loom::Strategy<loom::single_device>);
  STATIC_REQUIRE(loom::Precision<loom::fp32>);
  STATIC_REQUIRE(loom::Precision<loom::fp64>);
  STATIC_REQUIRE(loom::Precision<loom::fp16>);
  STATIC_REQUIRE(loom::Precision<loom::bf16>);
  STATIC_REQUIRE(loom::Precision<loom::bf16_mixed>);
  STATIC_REQUIRE(loom::Precision<loom::fp16_mixed>);
  STATIC_REQUIRE(loom::Strategy<models::my_strategy>);
  STATIC_REQUIRE(loom::Precision<models::my_precision>);

  STATIC_REQUIRE_FALSE(loom::Strategy<models::untagged>);
  STATIC_REQUIRE_FALSE(loom::Strategy<models::tagged_only>);
  STATIC_REQUIRE_FALSE(loom::Strategy<loom::cpu>);    // tagged as an accelerator
  STATIC_REQUIRE_FALSE(loom::Accelerator<loom::single_device>);
  STATIC_REQUIRE_FALSE(loom::Precision<models::precision_without_dtypes>);
  STATIC_REQUIRE_FALSE(loom::Precision<loom::precision_base>);  // no name

  STATIC_REQUIRE(loom::compatible<loom::cpu, loom::single_device, loom::bf16_mixed>);
  STATIC_REQUIRE(loom::compatible<loom::cpu, loom::single_device, loom::bf16>);
  STATIC_REQUIRE_FALSE(loom::compatible<loom::cpu, loom::single_device, loom::fp16>);
  STATIC_REQUIRE_FALSE(loom::compatible<loom::cpu, loom::single_device, loom::fp16_mixed>);
  STATIC_REQUIRE(loom::compatible<loom::cuda, loom::single_device, loom::fp16_mixed>);

  STATIC_REQUIRE(loom::supports_no_backward_sync<loom::single_device>);
  STATIC_REQUIRE_FALSE(loom::supports_no_backward_sync<models::my_strategy>);
  STATIC_REQUIRE_FALSE(loom::is_distributed<loom::single_device>);
  STATIC_REQUIRE(loom::has_precision_state<loom::fp16_mixed>);

  // A Fabric over user policies works like one over the built-ins.
  loom::Fabric<loom::cpu, models::my_strategy, models::my_precision> fabric;
  loom_test::Mlp net(4, 8, 2);
  auto model = fabric.setup(net);
  CHECK((model(at::ones({1, 4})).sizes() == at::IntArrayRef{1, 2}));
}

// ----------------------------------------------------------- hooks
namespace {
struct implements_two {
  void on_train_start() {}
  void on_before_backward(const at::Tensor&) {}
  void unrelated() {}
};
struct by_value_arguments {
  void on_train_epoch_end(std::int64_t) {}
  void on_train_batch_end(at::Tensor, std::int64_t) {}  // copies are fine
};
}  // namespace

TEST_CASE("registration finds exactly the hooks a callback implements", "[callbacks]") {
  STATIC_REQUIRE(loom::on_train_start::implemented_by<implements_two>);
  STATIC_REQUIRE(loom::on_before_backward::implemented_by<implements_two>);
  STATIC_REQUIRE_FALSE(loom::on_train_end::implemented_by<implements_two>);
  STATIC_REQUIRE_FALSE(loom::on_train_end::named_by<implements_two>);
  STATIC_REQUIRE(loom::on_train_batch_end::implemented_by<by_value_arguments>);
  CHECK(loom::callback(implements_two{}).hooks().size() == 2);
  CHECK(loom::callback(by_value_arguments{}).hooks().size() == 2);
  CHECK(loom::hook_id<loom::on_train_start>() != loom::hook_id<loom::on_train_end>());
  CHECK(loom::on_train_start::name == "on_train_start");
}

// ----------------------------------------------------------- IDX files
namespace {
void write_gz(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(file);
}
std::string idx_header(unsigned char type, std::vector<uint32_t> dims) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((d >> shift) & 0xFF));
  }
  return out;
}
}  // namespace

TEST_CASE("read_idx reads gzipped and plain IDX files", "[data]") {
  loom_test::scratch_dir dir("idx");
  std::string payload = idx_header(0x08, {2, 3});
  for (char c = 1; c <= 6; ++c) payload.push_back(c);
  write_gz(dir.file("a.gz"), payload);
  std::ofstream(dir.file("plain"), std::ios::binary) << payload;
  for (const auto& name : {"a.gz", "plain"}) {
    auto tensor = loom::data::read_idx(dir.file(name));
    CHECK((tensor.sizes() == at::IntArrayRef{2, 3}));
    CHECK(tensor.scalar_type() == at::kByte);
    CHECK(torch::equal(tensor, at::arange(1, 7, at::kByte).reshape({2, 3})));
  }
}

TEST_CASE("read_idx names the file and what is wrong with it", "[data]") {
  loom_test::scratch_dir dir("idx-bad");
  auto fails_with = [&](const std::string& bytes, const std::string& expected) {
    write_gz(dir.file("bad.gz"), bytes);
    CHECK_THROWS_WITH(loom::data::read_idx(dir.file("bad.gz"), "HINT"),
                      Catch::Contains(dir.file("bad.gz")) && Catch::Contains(expected) && Catch::Contains("HINT"));
  };
  fails_with("\x01\x02", "file ends early");
  fails_with(std::string("\x01\x00\x08\x01", 4) + std::string(4, '\0'), "IDX magic number");
  fails_with(idx_header(0x0D, {4}), "element type");
  fails_with(idx_header(0x08, {10}) + "abc", "the data needs 10 bytes, found 3");
  fails_with(idx_header(0x08, {2}) + "abcd", "more bytes than its header declares");
  CHECK_THROWS_WITH(loom::data::read_idx(dir.file("absent.gz")),
                    Catch::Contains("absent.gz") && Catch::Contains("No such file"));
  // Only regular files: a FIFO would block the reader, /dev/zero never ends.
  REQUIRE(::mkfifo(dir.file("pipe.gz").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(loom::data::read_idx(dir.file("pipe.gz")),
                    Catch::Contains("pipe.gz") && Catch::Contains("is a FIFO, not a regular file"));
  CHECK_THROWS_WITH(loom::data::read_idx("/dev/zero"), Catch::Contains("is a character device"));
  // A header that declares more than the file can hold allocates nothing:
  // 2^34 bytes (16 GiB) in a gzip file of a few dozen bytes...
  fails_with(idx_header(0x08, {1U << 28, 64}), "its header declares 17179869184 bytes of data, more than a file of");
  CHECK_THROWS_WITH(loom::data::read_idx(dir.file("bad.gz")), Catch::Contains("bytes can hold even compressed"));
  // ... and 1000 bytes in a plain file of 18.
  std::ofstream(dir.file("plain_short"), std::ios::binary) << idx_header(0x08, {1000}) + "0123456789";
  CHECK_THROWS_WITH(loom::data::read_idx(dir.file("plain_short")),
                    Catch::Contains("declares 1000 bytes of data, more than a file of 18 bytes can hold") &&
                        !Catch::Contains("compressed"));
  // A gzip stream cut in the middle.
  write_gz(dir.file("whole.gz"), idx_header(0x08, {4096}) + std::string(4096, 'x'));
  std::ifstream in(dir.file("whole.gz"), std::ios::binary);
  std::string compressed{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::ofstream(dir.file("cut.gz"), std::ios::binary) << compressed.substr(0, compressed.size() / 2);
  CHECK_THROWS_WITH(loom::data::read_idx(dir.file("cut.gz")), Catch::Contains("cut.gz"));
}

TEST_CASE("fashion_mnist loads Debian's files and points to the package when they are missing", "[data]") {
  loom_test::scratch_dir dir("fmnist-missing");
  CHECK_THROWS_WITH(loom::data::fashion_mnist(dir.path().string(), loom::data::split::train),
                    Catch::Contains("train-images-idx3-ubyte.gz") && Catch::Contains("dataset-fashion-mnist"));
  const std::string root = loom::data::fashion_mnist_default_root;
  if (!std::filesystem::exists(root + "/t10k-images-idx3-ubyte.gz")) {
    WARN("dataset-fashion-mnist is not installed; the real-data half of this test is skipped");
    return;
  }
  auto test = loom::data::fashion_mnist(root, loom::data::split::test);
  CHECK(test.size() == std::size_t{10000});
  CHECK((test.inputs().sizes() == at::IntArrayRef{10000, 1, 28, 28}));
  CHECK(test.inputs().max().item<float>() <= 1.0F);
  CHECK(test.targets().bincount().eq(1000).all().item<bool>());  // 1000 of each class
}

// ----------------------------------------------------------- sampler
TEST_CASE("distributed_sampler gives torch DistributedSampler's index lists", "[data][sampler]") {
  std::ifstream in(loom_test::fixtures_dir() + "/distributed_sampler.txt");
  REQUIRE(in.good());
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::size_t size = 0, replicas = 0, rank = 0;
    int shuffle = 0, drop_last = 0;
    std::int64_t epoch = 0;
    std::string colon;
    fields >> size >> replicas >> rank >> shuffle >> drop_last >> epoch >> colon;
    std::vector<std::size_t> expected;
    for (std::size_t index = 0; fields >> index;) expected.push_back(index);

    loom::data::distributed_sampler sampler(
        size, {.num_replicas = replicas, .rank = rank, .shuffle = shuffle != 0, .seed = 17, .drop_last = drop_last != 0});
    sampler.set_epoch(epoch);
    sampler.reset();
    INFO(line);
    CHECK(sampler.indices() == expected);
    CHECK(sampler.num_samples() == expected.size());
    ++checked;
  }
  CHECK(checked == 2 * 2 * 2 * (4 + 3 + 8));
}

TEST_CASE("distributed_sampler hands out batches and resumes its position", "[data][sampler]") {
  loom::data::distributed_sampler sampler(10, {.shuffle = true, .seed = 3});
  auto first = sampler.next(4);
  REQUIRE(first);
  CHECK(first->size() == 4);
  torch::serialize::OutputArchive out;
  sampler.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  loom::data::distributed_sampler resumed(10, {.shuffle = true, .seed = 3});
  torch::serialize::InputArchive in;
  const std::string data = bytes.str();
  in.load_from(data.data(), data.size());
  resumed.load(in);
  CHECK(resumed.next(4) == sampler.next(4));
  CHECK(resumed.next(4)->size() == 2);
  CHECK_FALSE(resumed.next(4).has_value());
  CHECK_THROWS_WITH(loom::data::distributed_sampler(10, {.num_replicas = 2, .rank = 2}),
                    Catch::Contains("rank 2 is not below num_replicas 2"));
}
