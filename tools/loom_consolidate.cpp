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
    const bool zero = loom::is_deepspeed_checkpoint(input);
    if (!zero && !loom::is_sharded_checkpoint(input)) {
      std::cerr << "loom-consolidate: " << input
                << " is neither a sharded checkpoint (a directory holding meta.pt and one file per rank) nor a ZeRO "
                   "one (DeepSpeed's layout: a directory holding 'latest')\n";
      return 1;
    }
    const loom::checkpoint_contents contents =
        zero ? loom::read_deepspeed_checkpoint(input) : loom::read_sharded_checkpoint(input);
    loom::write_checkpoint(output, contents);
    std::cout << "loom-consolidate: wrote " << output << " (" << contents.entries.size() << " entries, saved by "
              << contents.metadata.world_size << " ranks under " << contents.metadata.strategy << ")\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "loom-consolidate: " << error.what() << "\n";
    return 1;
  }
}
