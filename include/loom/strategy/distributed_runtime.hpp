// The run-time part every multi-process strategy shares: reading the cluster
// environment, deciding ranks, devices and rendezvous, starting local ranks
// (subprocess or fork launcher), and owning the world process group. Compiled
// once in src/; strategies hold one and stay thin templates.
#pragma once

#include <loom/cluster/environment.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/concepts.hpp>
#include <loom/launch/launcher_kind.hpp>
#include <loom/launch/supervisor.hpp>
#include <loom/strategy/process_options.hpp>

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <thread>

namespace loom {

namespace detail {

class distributed_runtime {
 public:
  distributed_runtime(const strategy_environment& environment, parallel_options options);
  distributed_runtime(const distributed_runtime&) = delete;
  distributed_runtime& operator=(const distributed_runtime&) = delete;
  // Rank 0 of a launch() waits for the ranks it started, then removes the
  // rendezvous directory.
  ~distributed_runtime();

  int world_size() const noexcept { return world_size_; }
  int global_rank() const noexcept { return global_rank_; }
  int local_rank() const noexcept { return local_rank_; }
  int node_rank() const noexcept { return node_rank_; }
  int local_world_size() const noexcept { return local_world_size_; }
  int num_nodes() const noexcept { return num_nodes_; }
  c10::Device device() const noexcept { return device_; }
  const cluster::cluster_info& cluster() const noexcept { return cluster_; }
  bool launched() const noexcept { return launched_; }
  // True in a process that fork launched (it must end after launch's function).
  bool is_forked_child() const noexcept { return forked_child_; }

  // Starts the other local ranks (when this process is the only one started)
  // and connects the world group. A no-op after the first call.
  void launch();

  // The world group, connected on first use when the processes were started
  // externally; before launch() otherwise, an error that says to call it.
  comm::process_group& group();

 private:
  void connect();
  void start_subprocesses();
  void fork_children();
  void start_monitor();
  void export_rank_variables(int local_rank) const;

  strategy_environment environment_;
  launcher_kind launcher_;
  parallel_options options_;
  cluster::cluster_info cluster_;
  device_selection selection_;
  int world_size_ = 1;
  int global_rank_ = 0;
  int local_rank_ = 0;
  int node_rank_ = 0;
  int local_world_size_ = 1;
  int num_nodes_ = 1;
  c10::Device device_{c10::DeviceType::CPU};
  bool launched_ = false;
  bool forked_child_ = false;
  comm::process_group group_;
  std::string rendezvous_dir_;  // created by this process (removed at the end)
  std::unique_ptr<launch::supervisor> supervisor_;
  std::thread monitor_;
};

}  // namespace detail
}  // namespace loom
