// One full checkpoint from a sharded or DeepSpeed-layout one, streamed
// (consolidate_checkpoint in io.hpp): the merge's tensors are deferred and
// each is made whole only while its record is written.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>

#include "checkpoint_bytes.hpp"
#include "torch_archive.hpp"

namespace loom {

consolidated_checkpoint consolidate_checkpoint(const std::string& input, const std::string& output) {
  detail::deferred_tensors deferred;
  const bool zero = is_deepspeed_checkpoint(input);
  if (!zero && !is_sharded_checkpoint(input)) {
    detail::fail_checkpoint(input, "is neither a sharded checkpoint (a directory holding meta.pt and one file per "
                                   "rank) nor a ZeRO one (DeepSpeed's layout: a directory holding 'latest')");
  }
  const checkpoint_contents contents = zero ? detail::read_deepspeed(input, &deferred) : detail::read_sharded(input, &deferred);
  detail::write_contents(output, contents, &deferred);  // as write_checkpoint lays the file out
  return {contents.metadata, contents.entries.size()};
}

}  // namespace loom
