// The fuzzers' corpora replayed by `meson test` (test fuzz_corpus): every
// file under tests/fuzz/corpus/<target>/ goes through its target once, in
// the usual build. A finding (a crash, an escaped exception) fails the test;
// the file is named on stderr before it runs.
#include "targets.hpp"

#include "../catch.hpp"

#include <loom/environment.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

TEST_CASE("every fuzz corpus file is refused or read, never crashes", "[fuzz_corpus]") {
  const auto source = loom::cluster::setting_text("LOOM_SOURCE_DIR");
  REQUIRE(source.has_value());
  const fs::path corpus = fs::path(*source) / "tests" / "fuzz" / "corpus";
  for (const auto& target : loom_fuzz::targets) {
    std::vector<fs::path> inputs;
    for (const auto& file : fs::directory_iterator(corpus / target.name)) {
      if (file.is_regular_file()) inputs.push_back(file.path());
    }
    std::sort(inputs.begin(), inputs.end());
    INFO("target " << target.name);
    CHECK(inputs.size() >= 1);  // each target has its seeds
    for (const auto& path : inputs) {
      std::fprintf(stderr, "replaying %s\n", path.c_str());
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      CHECK(target.run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == 0);
    }
  }
}

// Not run by meson test: writes the seeds loom makes for every target
// (tests/fuzz/make_seeds.sh calls it with LOOM_FUZZ_SEEDS set).
TEST_CASE("write the fuzz seeds loom makes", "[.write_fuzz_seeds]") {
  const auto directory = loom::cluster::setting_text("LOOM_FUZZ_SEEDS");
  REQUIRE(directory.has_value());
  loom_fuzz::write_seeds(directory->c_str());
}
