// loom::comm::process_group over c10d: rendezvous (FileStore or TCPStore),
// Gloo devices, collectives that Gloo lacks (mean, reduce_scatter, uneven
// all_gather), and the translation of failures into loom::peer_error.
#include "process_group_state.hpp"
#include "recording_backend.hpp"
#include "watchdog_exchanges.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/compat_c10d.hpp>
#include <loom/environment.hpp>
#include <loom/errors.hpp>
#include <loom/util/process_state.hpp>

#if defined(LOOM_WITH_MPI)
#include "mpi_backend.hpp"
#endif

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/serialize.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

namespace loom::comm {

namespace {

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Whether process pid on this host has exited (gone, or a zombie not yet reaped).
bool process_gone(long pid) {
  const char state = detail::process_state(pid);
  return state == '\0' || state == 'Z' || state == 'X';
}

// Gloo writes to its peers' sockets; a write to a peer that died raises
// SIGPIPE, whose default action ends this process without a word, where loom
// promises an exception naming the dead rank. Python (and so PyTorch)
// ignores SIGPIPE from the start; loom does the same when it opens a Gloo
// group, unless the program installed a handler of its own.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// A sentence on what went wrong, naming the ranks that went away when they
// can be seen (ranks on this host).
std::string diagnose(process_group_state& state, const std::string& operation, const std::string& error) {
  std::ostringstream out;
  out << operation << " on rank " << state.global_ranks[static_cast<std::size_t>(state.rank)] << " (group '"
      << state.group_name << "' of " << state.size << ") failed: ";
  const std::string here = hostname();
  std::vector<std::string> gone;
  auto look = [&] {
    gone.clear();
    for (int r = 0; r < state.size; ++r) {
      if (r == state.rank) continue;
      const auto& peer = state.peers[static_cast<std::size_t>(r)];
      if (peer.host == here && peer.pid > 0 && process_gone(peer.pid)) {
        gone.push_back("rank " + std::to_string(state.global_ranks[static_cast<std::size_t>(r)]) + " (pid " +
                       std::to_string(peer.pid) + ")");
      }
    }
  };
  look();
  // A dying process closes its sockets before it turns into a zombie: when a
  // connection was lost, give the kernel a moment to finish the exit.
  const bool connection_lost = error.find("closed by peer") != std::string::npos ||
                               error.find("reset by peer") != std::string::npos;
  for (int attempt = 0; gone.empty() && connection_lost && attempt < 50; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    look();
  }
  if (!gone.empty()) {
    for (std::size_t i = 0; i < gone.size(); ++i) out << (i ? ", " : "") << gone[i];
    out << (gone.size() == 1 ? " has" : " have") << " exited";
  } else if (error.find("imed out") != std::string::npos) {
    out << "no answer within the timeout of " << state.options.timeout.count()
        << " ms (a rank stopped taking part, or is still busy elsewhere)";
  } else if (error.find("closed by peer") != std::string::npos || error.find("reset by peer") != std::string::npos ||
             error.find("Connection refused") != std::string::npos) {
    out << "a peer went away (its address is in the Gloo message; it is not a process on this host that loom "
           "can see)";
  } else {
    out << "the collective raised an error";
  }
  out << ". Gloo/c10d said: " << error;
  return out.str();
}

// c10d's messages without the C++ backtrace c10::Error appends.
std::string error_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

// Runs a collective; after a failure the group is marked broken, so that no
// later call waits on peers that are gone.
template <class Body>
void guarded(process_group_state& state, const char* operation, Body&& body) {
  check_usable(state, operation);
  try {
    body();
  } catch (const peer_error&) {
    throw;
  } catch (const std::exception& error) {
    throw failed(state, operation, error);
  }
}

}  // namespace

// Gloo reduces and moves float, double, half and the integer types; bf16
// travels as float (exact for the values, and summed more precisely). Other
// dtypes are refused before anything is sent, so the group stays usable.
bool gloo_supports(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Half:
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long: return true;
    default: return false;
  }
}

void check_on_device(const process_group_state& state, const at::Tensor& tensor, const char* operation) {
  if (tensor.device() == state.options.device) return;
  throw configuration_error(std::string(operation) + ": a tensor on " + tensor.device().str() +
                            " was handed to a process group whose device is " + state.options.device.str() +
                            "; every tensor a collective sends must live on the group's device (NCCL refuses any "
                            "other). Build it there: at::TensorOptions().device(group.device()).");
}

// The tensor as the backend can take it: itself, or a float copy of a bf16 one.
at::Tensor wire_tensor(const process_group_state& state, const at::Tensor& tensor, const char* operation) {
  check_on_device(state, tensor, operation);
  if (state.kind != backend::gloo || gloo_supports(tensor.scalar_type())) {
    return tensor.is_contiguous() ? tensor : tensor.contiguous();
  }
  if (tensor.scalar_type() == c10::ScalarType::BFloat16) return tensor.to(at::kFloat);
  throw configuration_error(std::string(operation) + ": Gloo cannot move " + c10::toString(tensor.scalar_type()) +
                            " tensors; accepted: float, double, half, bfloat16 (sent as float), int8, uint8, int32, "
                            "int64. Convert the tensor first.");
}

namespace {

std::shared_ptr<::gloo::transport::Device> gloo_device(const group_options& options) {
  if (const auto interface = cluster::setting_text("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  }
  if (options.loopback_only) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// A Gloo device starts one event-loop thread. While a collective's thread
// holds a pair's lock (writing a message), that loop, woken by the pair's
// readable socket, fails to take the lock (tcp::Pair::handleEvents,
// try_to_lock) and calls epoll_wait again at once: it spins. PyTorch 1.13's
// own all-reduce of 16 MiB, ten times on 2 ranks: 68,235 epoll_wait calls for
// 2,167 reads. Where ranks share cores, the spin takes the CPU from the
// threads it waits for. So the device is made on a thread of its own at nice
// +10 (Linux's nice is per thread; a thread starts at its creator's), which
// its loop thread inherits: it yields a contended core to them and runs as
// before on a free one. Collectives run on the process group's threads, at
// the caller's nice. Measured on 2 cores in docs/launching.md ("Gloo's event
// loop on shared cores"): the FSDP example on 2 ranks 22.4 -> 17-19 s, a DDP
// step's all-reduces 2.0-2.5 -> 1.2 ms.
constexpr int gloo_event_loop_nice = 10;

std::shared_ptr<::gloo::transport::Device> gloo_device_with_yielding_loop(const group_options& options) {
  std::shared_ptr<::gloo::transport::Device> device;
  std::exception_ptr failure;
  std::thread maker([&] {
    // Raising nice is always allowed; were it refused, the loop would run at
    // the caller's nice, as Gloo starts it.
    if (::nice(gloo_event_loop_nice) == -1) errno = 0;
    try {
      device = gloo_device(options);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  maker.join();
  if (failure) std::rethrow_exception(failure);
  return device;
}

// parent and members: for a sub-group, the group it is made from and the
// members' ranks in it (MPI splits the parent's communicator).
c10::intrusive_ptr<compat::c10d_backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                      const group_options& options,
                                                      const process_group_state* parent,
                                                      const std::vector<int>& members) {
  if (options.kind == backend::mpi) {
#if defined(LOOM_WITH_MPI)
    c10::intrusive_ptr<mpi_backend> group;
    if (parent == nullptr) {
      const MPI_Comm world = options.mpi_communicator
                                 ? MPI_Comm_f2c(static_cast<MPI_Fint>(*options.mpi_communicator))
                                 : MPI_COMM_WORLD;
      group = mpi_backend::create(world, options.timeout);
    } else {
      auto* above = dynamic_cast<mpi_backend*>(parent->inner.get());
      if (above == nullptr) throw std::logic_error("an mpi sub-group of a group that is not mpi's");
      group = mpi_backend::create_subgroup(*above, members, options.timeout);
    }
    if (group->getRank() != rank || group->getSize() != size) {
      throw configuration_error("process group backend 'mpi': loom's rank " + std::to_string(rank) + " of " +
                                std::to_string(size) + " is MPI's rank " + std::to_string(group->getRank()) + " of " +
                                std::to_string(group->getSize()) + "; start the job with mpirun (loom then reads "
                                "its ranks from the MPI environment) and do not set RANK/WORLD_SIZE yourself");
    }
    return group;
#else
    (void)parent;
    (void)members;
    throw configuration_error(
        "process group backend 'mpi' was requested, but this loom was built without MPI (the `mpi` Meson feature "
        "needs libopenmpi-dev). Install it and reconfigure, or use the gloo backend.");
#endif
  }
  (void)parent;
  (void)members;
  if (options.kind == backend::nccl) {
#if defined(LOOM_WITH_NCCL)
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
#else
    throw configuration_error(
        "process group backend 'nccl' was requested, but this loom was built without NCCL (-Dnccl, which needs a "
        "CUDA build of LibTorch). Use the gloo backend.");
#endif
  }
  ignore_sigpipe_unless_handled();
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(gloo_device_with_yielding_loop(options));
  gloo_options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
}

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// The group's collectives go through a recorder, and the watchdog watches
// them, unless collective_timeout is 0.
void install_backend(process_group_state& state, c10::intrusive_ptr<compat::c10d_backend> inner) {
  state.inner = inner;
  state.backend = inner;
  const auto timeout = effective_collective_timeout(state.options.collective_timeout);
  if (timeout.count() <= 0) return;
  auto watched = std::make_shared<group_watch>();
  watched->recorder = std::make_shared<collective_recorder>(state.size);
  watched->timeout = timeout;
  watched->group_name = state.group_name;
  watched->rank = state.rank;
  watched->size = state.size;
  watched->global_ranks = state.global_ranks;
  if (state.store) {
    // A TCP rendezvous store is served by global rank 0's process; the
    // watchdog gives it half the timeout (1 to 10 s) to answer. A FileStore
    // has no server.
    std::optional<store_host> host;
    if (!state.where.file_path) {
      host = store_host{.global_rank = 0,
                        .answer_within = std::clamp(timeout / 2, std::chrono::milliseconds(1000),
                                                    std::chrono::milliseconds(10000))};
    }
    watched->exchange = store_exchange(state.store, state.root_store, state.rank, host);
  } else {
#if defined(LOOM_WITH_MPI)
    watched->exchange = mpi_exchange(dynamic_cast<const mpi_backend&>(*inner));
#else
    return;
#endif
  }
  state.backend = c10::make_intrusive<recording_backend>(inner, watched->recorder);
  state.watch = watched;
  watch(state.watch);
}

std::shared_ptr<process_group_state> build(c10::intrusive_ptr<c10d::Store> root, const std::string& name, int rank,
                                           int size, std::vector<int> global_ranks, const group_options& options,
                                           const rendezvous& where, const process_group_state* parent = nullptr,
                                           const std::vector<int>& members = {}) {
  auto state = std::make_shared<process_group_state>();
  state->root_store = root;
  state->rank = rank;
  state->size = size;
  state->kind = options.kind;
  state->options = options;
  state->global_ranks = std::move(global_ranks);
  state->group_name = name;
  state->where = where;
  state->emulation.store(options.emulation, std::memory_order_relaxed);
  // Who is who, so that a failure can name the rank that went away.
  const std::string identity = hostname() + " " + std::to_string(::getpid());
  if (!root) {
    // The MPI group: no store. The identities travel through MPI itself.
    install_backend(*state, make_backend({}, rank, size, options, parent, members));
    constexpr std::int64_t width = 256;
    at::Tensor mine = at::zeros({width}, at::kByte);
    std::memcpy(mine.data_ptr(), identity.data(), std::min<std::size_t>(identity.size(), width - 1));
    at::Tensor everyone = at::empty({size * width}, at::kByte);
    state->backend->_allgather_base(everyone, mine)->wait();
    state->peers.resize(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      std::istringstream in(std::string(static_cast<const char*>(everyone.data_ptr()) + r * width));
      in >> state->peers[static_cast<std::size_t>(r)].host >> state->peers[static_cast<std::size_t>(r)].pid;
    }
    state->backend->setSequenceNumberForGroup();
    state->first_sequence_number = state->backend->getSequenceNumberForGroup();
    return state;
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>("loom/" + name + "/", root);
  store->set("peer/" + std::to_string(rank), std::vector<uint8_t>(identity.begin(), identity.end()));
  state->store = store;
  install_backend(*state, make_backend(store, rank, size, options, parent, members));
  // Sequence numbers count the collectives issued on the group (for tests
  // and for the DDP engine's all-reduce count); agreeing on the start is a
  // store exchange, done once here.
  state->backend->setSequenceNumberForGroup();
  state->first_sequence_number = state->backend->getSequenceNumberForGroup();
  state->peers.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::istringstream in(to_string(store->get("peer/" + std::to_string(r))));
    in >> state->peers[static_cast<std::size_t>(r)].host >> state->peers[static_cast<std::size_t>(r)].pid;
  }
  return state;
}

}  // namespace

void check_usable(process_group_state& state, const char* operation) {
  if (state.is_broken.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(state.broken_mutex);
    throw peer_error(std::string(operation) + ": the process group is unusable after an earlier failure: " +
                     state.broken);
  }
}

void check_mean_dtype(const at::Tensor& tensor, reduce_op op) {
  if (op == reduce_op::mean && !tensor.is_floating_point() && !tensor.is_complex()) {
    throw configuration_error(std::string("all_reduce(mean) of a ") + c10::toString(tensor.scalar_type()) +
                              " tensor: a mean is computed as a sum divided by the world size, which needs a "
                              "floating-point tensor. Convert it (tensor.to(at::kFloat)) or reduce with sum.");
  }
}

peer_error failed(process_group_state& state, const char* operation, const std::exception& error) {
  std::string message = diagnose(state, operation, error_text(error));
  // A mismatch can make Gloo fail rather than hang: the same sentence as the
  // watchdog's then leads. Peers that have exited will not report; do not
  // wait for them.
  if (state.watch) {
    const bool peer_gone = message.find(" exited") != std::string::npos;
    const auto patience = peer_gone ? std::chrono::milliseconds(0) : std::chrono::milliseconds(2000);
    if (auto desync = explain_desync(*state.watch, patience)) message = *desync + ". " + message;
  }
  std::lock_guard<std::mutex> lock(state.broken_mutex);
  if (state.broken.empty()) state.broken = message;
  state.is_broken.store(true, std::memory_order_release);
  return peer_error(message);
}

c10::intrusive_ptr<c10d::ProcessGroup> native_group(process_group_state& state) {
  if (!state.native) {
    state.native = compat::as_process_group(state.store, state.rank, state.size, state.backend,
                                            state.kind == backend::nccl);
  }
  return state.native;
}

std::uint64_t process_group::collectives_issued() const {
  if (!state_) return 0;
  return state_->backend->getSequenceNumberForGroup() - state_->first_sequence_number +
         state_->emulated_collectives.load(std::memory_order_relaxed);
}

std::uint64_t process_group::collectives_recorded() const {
  return state_ && state_->watch ? state_->watch->recorder->entered() : 0;
}

std::vector<std::string> process_group::recent_collectives(std::size_t count) const {
  std::vector<std::string> described;
  if (!state_ || !state_->watch) return described;
  for (const auto& entry : state_->watch->recorder->recent(count)) described.push_back(entry.describe());
  return described;
}

comm::emulation process_group::emulation() const noexcept {
  return state_ ? state_->emulation.load(std::memory_order_relaxed) : group_options{}.emulation;
}

void process_group::set_emulation(comm::emulation choice) {
  if (state_) state_->emulation.store(choice, std::memory_order_relaxed);
}

int process_group::rank() const noexcept { return state_ ? state_->rank : 0; }
int process_group::size() const noexcept { return state_ ? state_->size : 1; }
backend process_group::kind() const noexcept { return state_ ? state_->kind : backend::gloo; }
c10::Device process_group::device() const noexcept {
  return state_ ? state_->options.device : group_options{}.device;
}

std::chrono::milliseconds process_group::timeout() const noexcept {
  return state_ ? state_->options.timeout : group_options{}.timeout;
}

process_group process_group::connect(const rendezvous& where, int rank, int world_size, const group_options& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw configuration_error("process_group::connect: rank " + std::to_string(rank) + " is not a rank of a world of " +
                              std::to_string(world_size));
  }
  c10::intrusive_ptr<c10d::Store> store;
  const std::string where_text =
      options.kind == backend::mpi ? std::string("MPI_COMM_WORLD")
      : where.file_path            ? "file " + *where.file_path
                                   : where.address + ":" + std::to_string(where.port);
  try {
    if (options.kind == backend::mpi) {
      // MPI is the rendezvous: no store, no port, no socket of loom's own.
    } else if (where.file_path) {
      // One FileStore per file and process: FileStore counts its instances in
      // the file and deletes the file when a count reaches zero, so a second
      // instance (a second Fabric) that goes away would take the first one's
      // keys with it. The store lives as long as the process.
      static std::mutex stores_mutex;
      static std::map<std::string, c10::intrusive_ptr<c10d::Store>> file_stores;
      std::lock_guard<std::mutex> lock(stores_mutex);
      auto& shared = file_stores[*where.file_path];
      if (!shared) shared = c10::make_intrusive<c10d::FileStore>(*where.file_path, world_size);
      store = shared;
      store->setTimeout(options.timeout);
    } else {
      if (where.port < 1 || where.port > 65535) {
        throw configuration_error("the rendezvous port " + std::to_string(where.port) + " is not a TCP port");
      }
      c10d::TCPStoreOptions tcp;
      tcp.port = static_cast<std::uint16_t>(where.port);
      tcp.isServer = rank == 0;
      tcp.numWorkers = static_cast<std::size_t>(world_size);
      tcp.waitWorkers = false;  // the group's own rendezvous waits, with the same timeout
      tcp.timeout = options.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(where.address, tcp);
    }
  } catch (const configuration_error&) {
    throw;
  } catch (const std::exception& error) {
    const std::string what = error_text(error);
    if (!where.file_path && rank == 0 && (what.find("in use") != std::string::npos ||
                                          what.find("failed to listen") != std::string::npos ||
                                          what.find("bind") != std::string::npos)) {
      throw peer_error("rank 0 cannot host the rendezvous store on port " + std::to_string(where.port) +
                       ": the port is already in use. Choose another with --main-port or MASTER_PORT. (c10d: " +
                       what + ")");
    }
    throw peer_error("rank " + std::to_string(rank) + " cannot reach the rendezvous store at " + where_text +
                     " within " + std::to_string(options.timeout.count()) +
                     " ms. Check --main-address/MASTER_ADDR and --main-port/MASTER_PORT, and that rank 0 runs. "
                     "(c10d: " + what + ")");
  }

  std::vector<int> ranks(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  // A process may form several world groups through one store (one per
  // Fabric); every rank forms them in the same order, so a count names them.
  static std::atomic<int> worlds{0};
  const int index = worlds.fetch_add(1);
  const std::string name = index == 0 ? "world" : "world" + std::to_string(index);
  try {
    return process_group(build(store, name, rank, world_size, std::move(ranks), options, where));
  } catch (const configuration_error&) {
    throw;
  } catch (const std::exception& error) {
    throw peer_error("rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                     ": the process group did not form through " + where_text + " within " +
                     std::to_string(options.timeout.count()) + " ms (did every rank start?). (c10d: " +
                     error_text(error) + ")");
  }
}

namespace {
constexpr int64_t max_gather_dims = 8;

// Every rank's [ndim, dtype, sizes...] in one collective.
std::vector<std::vector<int64_t>> gather_shapes(process_group_state& state, const at::Tensor& tensor) {
  if (tensor.dim() > max_gather_dims) {
    throw configuration_error("all_gather: tensors of more than " + std::to_string(max_gather_dims) +
                              " dimensions are not supported");
  }
  at::Tensor meta = at::full({2 + max_gather_dims}, -1, at::kLong);
  meta[0] = tensor.dim();
  meta[1] = static_cast<int64_t>(tensor.scalar_type());
  for (int64_t d = 0; d < tensor.dim(); ++d) meta[2 + d] = tensor.size(d);
  meta = meta.to(state.options.device);
  std::vector<at::Tensor> input{meta};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < state.size; ++r) output[0].push_back(at::empty_like(meta));
  guarded(state, "all_gather (shapes)", [&] { state.backend->allgather(output, input)->wait(); });
  std::vector<std::vector<int64_t>> shapes;
  for (int r = 0; r < state.size; ++r) {
    const auto values = output[0][static_cast<std::size_t>(r)].cpu();
    const auto* data = values.data_ptr<int64_t>();
    if (data[1] != static_cast<int64_t>(tensor.scalar_type())) {
      throw configuration_error("all_gather: rank " + std::to_string(state.global_ranks[static_cast<std::size_t>(r)]) +
                                " sent a " + c10::toString(static_cast<c10::ScalarType>(data[1])) +
                                " tensor, this rank a " + c10::toString(tensor.scalar_type()) +
                                "; every rank must gather the same dtype");
    }
    shapes.emplace_back(data + 2, data + 2 + data[0]);
  }
  return shapes;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}
}  // namespace

std::vector<at::Tensor> process_group::all_gather_per_rank(const at::Tensor& tensor) {
  if (!state_) return {tensor.clone()};
  auto& state = *state_;
  at::Tensor flat = wire_tensor(state, tensor, "all_gather").reshape({-1});
  const auto shapes = gather_shapes(state, tensor);
  int64_t largest = 0;
  for (const auto& shape : shapes) largest = std::max(largest, numel_of(shape));
  // Gloo gathers equal sizes: pad every flattened tensor to the largest.
  if (flat.numel() < largest) flat = at::cat({flat, at::zeros({largest - flat.numel()}, flat.options())});
  std::vector<at::Tensor> input{flat};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < state.size; ++r) output[0].push_back(at::empty({largest}, flat.options()));
  c10d::AllgatherOptions options;
  options.timeout = state.options.timeout;
  guarded(state, "all_gather", [&] { state.backend->allgather(output, input, options)->wait(); });
  std::vector<at::Tensor> result;
  for (int r = 0; r < state.size; ++r) {
    const auto& shape = shapes[static_cast<std::size_t>(r)];
    result.push_back(
        output[0][static_cast<std::size_t>(r)].narrow(0, 0, numel_of(shape)).reshape(shape).to(tensor.scalar_type()));
  }
  return result;
}

at::Tensor process_group::all_gather_stacked(const at::Tensor& tensor) {
  if (!state_) return tensor.unsqueeze(0).clone();
  auto& state = *state_;
  std::vector<at::Tensor> input{wire_tensor(state, tensor, "all_gather")};
  const auto shapes = gather_shapes(state, tensor);
  for (int r = 0; r < state.size; ++r) {
    if (shapes[static_cast<std::size_t>(r)] != tensor.sizes().vec()) {
      std::ostringstream message;
      message << "all_gather_stacked: rank " << state.global_ranks[static_cast<std::size_t>(r)] << " has shape "
              << at::IntArrayRef(shapes[static_cast<std::size_t>(r)]) << ", this rank " << tensor.sizes()
              << "; stacking needs equal shapes (all_gather_per_rank returns one tensor per rank for unequal ones)";
      throw configuration_error(message.str());
    }
  }
  std::vector<int64_t> stacked_shape{state.size};
  for (auto extent : tensor.sizes()) stacked_shape.push_back(extent);
  at::Tensor output = at::empty(stacked_shape, input[0].options());
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < state.size; ++r) outputs[0].push_back(output[r]);
  c10d::AllgatherOptions options;
  options.timeout = state.options.timeout;
  guarded(state, "all_gather", [&] { state.backend->allgather(outputs, input, options)->wait(); });
  return output.to(tensor.scalar_type());
}

void process_group::barrier() {
  if (!state_) return;
  auto& state = *state_;
  c10d::BarrierOptions options;
  options.timeout = state.options.timeout;
  guarded(state, "barrier", [&] { state.backend->barrier(options)->wait(); });
}

c10::IValue process_group::broadcast_object(const c10::IValue& value, int source) {
  if (!state_) return value;
  auto& state = *state_;
  // Length and bytes travel on the group's device (NCCL moves nothing else);
  // the pickle is made and read on the CPU.
  const auto on_group = at::TensorOptions().device(state.options.device);
  std::vector<char> bytes;
  if (state.rank == source) bytes = torch::pickle_save(value);
  at::Tensor length = at::full({1}, static_cast<int64_t>(bytes.size()), on_group.dtype(at::kLong));
  broadcast(length, source);
  at::Tensor payload = at::empty({length.item<int64_t>()}, on_group.dtype(at::kByte));
  if (state.rank == source) {
    payload.copy_(at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte));
  }
  broadcast(payload, source);
  if (state.rank == source) return value;
  const at::Tensor host = payload.to(at::kCPU);
  const auto* data = static_cast<const char*>(host.data_ptr());
  return torch::pickle_load(std::vector<char>(data, data + host.numel()));
}

process_group process_group::new_group(const std::vector<int>& ranks) const {
  if (!state_) throw configuration_error("new_group: no process group (a single process has no sub-groups)");
  auto& state = *state_;
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= state.size) {
    throw configuration_error("new_group: the ranks must be distinct ranks of the group (0 to " +
                              std::to_string(state.size - 1) + ")");
  }
  // Every rank counts the groups it was asked for, so the names agree.
  const std::string name = state.group_name + "." + std::to_string(state.next_subgroup++);
  auto position = std::find(sorted.begin(), sorted.end(), state.rank);
  if (position == sorted.end()) return process_group();
  std::vector<int> global;
  for (int r : sorted) global.push_back(state.global_ranks[static_cast<std::size_t>(r)]);
  try {
    return process_group(build(state.root_store, name, static_cast<int>(position - sorted.begin()),
                               static_cast<int>(sorted.size()), std::move(global), state.options, state.where, &state,
                               sorted));
  } catch (const std::exception& error) {
    throw peer_error("new_group " + name + " did not form: " + error_text(error));
  }
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("find_free_port: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("find_free_port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace loom::comm
