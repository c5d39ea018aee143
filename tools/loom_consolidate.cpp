// loom-consolidate SHARDED_DIR [OUT]: one full checkpoint from a sharded one
// (Lightning's `fabric consolidate`) or from a ZeRO one in DeepSpeed's layout
// (DeepSpeed's zero_to_fp32), in loom's single-file format, which
// single_device, ddp and fsdp of any world size load and Python's
// torch.load reads. loom-run (torch-free) runs it as `loom-run consolidate`.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include <filesystem>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << "usage: loom-consolidate SHARDED_DIR [OUT]\n"
                 "  writes the full checkpoint of a sharded one (fsdp's state_dict_type=\"sharded\", or a ZeRO\n"
                 "  checkpoint directory in DeepSpeed's layout) to OUT,\n"
                 "  by default SHARDED_DIR with its suffix replaced by .consolidated (as Lightning's\n"
                 "  `fabric consolidate`)\n";
    return argc == 2 ? 0 : 2;
  }
  const std::string input = argv[1];
  const std::string output =
      argc == 3 ? std::string(argv[2]) : std::filesystem::path(input).replace_extension(".consolidated").string();
  try {
    const loom::consolidated_checkpoint written = loom::consolidate_checkpoint(input, output);
    std::cout << "loom-consolidate: wrote " << output << " (" << written.entries << " entries, saved by "
              << written.metadata.world_size << " ranks under " << written.metadata.strategy << ")\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "loom-consolidate: " << error.what() << "\n";
    return 1;
  }
}
