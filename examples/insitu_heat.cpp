// In-situ training inside an MPI simulation: the template for embedding loom
// in an MPI code (docs/launching.md, "Embedding loom in an MPI code").
//
// The application is a 2-D heat-diffusion solver: an explicit 5-point
// scheme on a G x G grid with the edges held at 0 and Gaussian heat sources
// that move every `switch_every` steps. It splits the grid into strips of
// rows, one per rank, and exchanges halo rows with its neighbours over MPI
// (MPI_Sendrecv on its own communicator). Every K solver steps it trains a
// surrogate, a small CNN that predicts the field K steps ahead from the
// current one (and the source map the solver applies meanwhile), with loom
// DDP on the application's own communicator: each rank trains on the strip
// it owns, padded with the neighbours' rows by the solver's own halo
// exchange (3 rows: the CNN's receptive field), so cells near strip edges
// see their neighbours. Then it runs a second trajectory with other source
// seeds (held out) and scores the surrogate against "no change".
//
//   mpirun -n 2 build/examples/insitu_heat [--train-steps N]
//
// Last line: surrogate_rel_error=X persistence_rel_error=Y (goal X <= 0.5 Y).
#include <loom/loom.hpp>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <ATen/core/grad_mode.h>
#include <CLI/CLI.hpp>
#include <torch/nn/modules/conv.h>
#include <torch/optim/adam.h>

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <random>
#include <vector>

namespace {

// ---------------------------------------------------------------- the application
struct settings {
  int grid = 96;             // G x G cells
  int k = 16;                // the surrogate looks K solver steps ahead; training every K steps
  float alpha = 0.2F;        // diffusivity * dt / dx^2 (explicit scheme: stable below 0.25)
  float heating = 0.05F;     // source amplitude * dt
  int sources = 4;           // Gaussian sources, sigma 3 cells
  int switch_every = 96;     // the sources move every this many steps (a multiple of K)
  int updates_per_sample = 4; // minibatches of 8 from the last 64 samples, each time a sample arrives
  int train_steps = 9600;    // solver steps of the training trajectory
  int eval_steps = 1920;     // solver steps of the held-out trajectory
  unsigned train_seed = 1;   // source positions of the training trajectory
  unsigned eval_seed = 1001; // and of the held-out one
};

constexpr int halo = 3;  // rows kept on each side: the CNN's receptive field (three 3x3 convolutions)

// One rank's strip: rows [first, first + rows) of the grid, stored with
// `halo` extra rows above and below.
class heat_strip {
 public:
  heat_strip(const settings& s, MPI_Comm comm) : s_(s), comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    first_ = s.grid * rank_ / size_;
    rows_ = s.grid * (rank_ + 1) / size_ - first_;
    u_.assign(static_cast<std::size_t>((rows_ + 2 * halo) * s.grid), 0.0F);
    next_ = u_;
    source_.assign(u_.size(), 0.0F);
  }

  int rows() const noexcept { return rows_; }
  int padded_rows() const noexcept { return rows_ + 2 * halo; }
  const std::vector<float>& field() const noexcept { return u_; }
  const std::vector<float>& source() const noexcept { return source_; }
  void reset() { std::fill(u_.begin(), u_.end(), 0.0F); }

  // Every rank draws the same positions (same seed), and keeps its rows.
  void place_sources(std::mt19937& rng) {
    std::uniform_real_distribution<float> where(8.0F, static_cast<float>(s_.grid) - 8.0F);
    std::vector<std::pair<float, float>> centres;
    for (int j = 0; j < s_.sources; ++j) centres.emplace_back(where(rng), where(rng));
    for (int r = 0; r < padded_rows(); ++r) {
      const float y = static_cast<float>(first_ + r - halo);
      for (int x = 0; x < s_.grid; ++x) {
        float value = 0.0F;
        for (const auto& [cy, cx] : centres) {
          const float d2 = (y - cy) * (y - cy) + (static_cast<float>(x) - cx) * (static_cast<float>(x) - cx);
          value += s_.heating * std::exp(-d2 / (2.0F * 9.0F));
        }
        source_[index(r, x)] = value;
      }
    }
  }

  // The solver's halo exchange: `width` rows to and from each neighbour;
  // rows beyond the grid's edge are the boundary value, 0.
  void exchange_halos(int width) {
    const int up = rank_ > 0 ? rank_ - 1 : MPI_PROC_NULL;
    const int down = rank_ < size_ - 1 ? rank_ + 1 : MPI_PROC_NULL;
    const int count = width * s_.grid;
    // My first rows go up; the row below me comes from down (and the mirror).
    MPI_Sendrecv(&u_[index(halo, 0)], count, MPI_FLOAT, up, 0, &u_[index(halo + rows_, 0)], count, MPI_FLOAT, down, 0,
                 comm_, MPI_STATUS_IGNORE);
    MPI_Sendrecv(&u_[index(halo + rows_ - width, 0)], count, MPI_FLOAT, down, 1, &u_[index(halo - width, 0)], count,
                 MPI_FLOAT, up, 1, comm_, MPI_STATUS_IGNORE);
    if (up == MPI_PROC_NULL) std::fill(&u_[index(halo - width, 0)], &u_[index(halo, 0)], 0.0F);
    if (down == MPI_PROC_NULL) std::fill(&u_[index(halo + rows_, 0)], &u_[index(halo + rows_ + width, 0)], 0.0F);
  }

  void step() {
    exchange_halos(1);
    const int g = s_.grid;
    for (int r = halo; r < halo + rows_; ++r) {
      for (int x = 0; x < g; ++x) {
        const float centre = u_[index(r, x)];
        const float left = x > 0 ? u_[index(r, x - 1)] : 0.0F;
        const float right = x < g - 1 ? u_[index(r, x + 1)] : 0.0F;
        const float laplacian = u_[index(r - 1, x)] + u_[index(r + 1, x)] + left + right - 4.0F * centre;
        next_[index(r, x)] = centre + s_.alpha * laplacian + source_[index(r, x)];
      }
    }
    std::swap(u_, next_);
  }

 private:
  std::size_t index(int row, int x) const { return static_cast<std::size_t>(row * s_.grid + x); }

  settings s_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, first_ = 0, rows_ = 0;
  std::vector<float> u_, next_, source_;
};

// ---------------------------------------------------------------- the surrogate
// Predicts (u(t+K) - u(t)) / scale from [u(t) / scale, source / heating].
struct SurrogateImpl : torch::nn::Module {
  SurrogateImpl()
      : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 16, 3).padding(1)))),
        c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)))),
        c3(register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 1, 3).padding(1)))) {}
  at::Tensor forward(const at::Tensor& x) { return c3(torch::tanh(c2(torch::tanh(c1(x))))); }
  torch::nn::Conv2d c1, c2, c3;
};
TORCH_MODULE(Surrogate);

constexpr float scale = 10.0F;

// One sample: the padded strip now (input) and, K steps later, its own rows.
struct sample {
  at::Tensor input;   // [2, padded_rows, G]
  at::Tensor target;  // [1, rows, G]: the change over K steps, scaled
};

at::Tensor input_of(const heat_strip& strip, const settings& s) {
  const auto shape = std::vector<int64_t>{1, strip.padded_rows(), s.grid};
  at::Tensor u = torch::from_blob(const_cast<float*>(strip.field().data()), shape, at::kFloat).clone() / scale;
  at::Tensor q = torch::from_blob(const_cast<float*>(strip.source().data()), shape, at::kFloat).clone() / s.heating;
  return torch::cat({u, q}, 0);
}

// The strip's own rows of a padded tensor ([..., padded_rows, G]).
at::Tensor own_rows(const at::Tensor& padded, int rows) { return padded.narrow(-2, halo, rows); }

}  // namespace

int main(int argc, char** argv) {
  // Keep freed memory in the process. By default glibc gives blocks above
  // 128 KiB back to the kernel when they are freed (munmap, or trimming the
  // heap's top), so every training step's activations and gradients (1-3 MB
  // tensors here) come back as fresh pages, one page fault each 4 KiB; in a
  // virtual machine those faults cost more than the convolutions (measured on
  // a 2-core VM, 2 ranks: over 240 s without these two lines, 47.6 s with
  // them; either one alone, set through GLIBC_TUNABLES with the mmap
  // threshold at 256 MiB: 320 s and 564 s). An application that trains in-situ
  // should decide this once, at start-up, as here.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);   // blocks up to 32 MiB come from the heap, not mmap
  mallopt(M_TRIM_THRESHOLD, 512 << 20);  // and the heap keeps up to 512 MiB of free space
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  // The application's communicator: loom trains on it (and duplicates it,
  // so its messages never match the solver's).
  MPI_Comm app = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &app);
  int rank = 0, size = 1;
  MPI_Comm_rank(app, &rank);
  MPI_Comm_size(app, &size);
  settings s;
  // After MPI_Init, which may take its own arguments out of argv.
  CLI::App cli("In-situ training of a surrogate inside an MPI heat solver, with loom DDP");
  cli.add_option("--train-steps,--train_steps", s.train_steps,
                 "solver steps of the training trajectory (a training sample every K steps)")
      ->check(CLI::Range(s.k, 1 << 24))
      ->capture_default_str();
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = rank == 0 ? cli.exit(error) : error.get_exit_code();
    MPI_Comm_free(&app);
    MPI_Finalize();
    return code;
  }
  int status = 0;
  {
    loom::Fabric<loom::cpu, loom::ddp, loom::fp32> fabric(
        {}, loom::ddp(loom::ddp_options{
                .process = {.backend = loom::comm::backend::mpi, .mpi_communicator = MPI_Comm_c2f(app)}}));
    fabric.launch();
    if (rank == 0) {
      std::printf("insitu_heat: %d ranks; grid %dx%d in strips of rows, halo exchange over MPI; alpha=%.2f, "
                  "%d Gaussian sources (sigma 3 cells, heating %.2f per step) moved every %d steps; surrogate "
                  "looks K=%d steps ahead, trained every K steps with loom DDP on the application's communicator; "
                  "%d training steps (source seed %u), %d held-out steps (seed %u)\n",
                  size, s.grid, s.grid, s.alpha, s.sources, s.heating, s.switch_every, s.k, s.train_steps,
                  s.train_seed, s.eval_steps, s.eval_seed);
    }
    at::manual_seed(0);
    auto net = Surrogate();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(2e-3));
    auto [model, optimizer] = fabric.setup(net, adam);
    heat_strip strip(s, app);

    // ---- the training trajectory: solve, and every K steps train on the
    // last K steps' change. A small replay buffer of recent samples gives
    // each update a minibatch.
    std::mt19937 rng(s.train_seed);
    std::mt19937 pick(1234 + static_cast<unsigned>(rank));
    std::deque<sample> replay;
    at::Tensor previous;  // the padded input K steps ago
    double solver_seconds = 0, training_seconds = 0;
    int updates = 0;
    double last_loss = 0;
    const auto run_start = std::chrono::steady_clock::now();
    for (int step = 0; step <= s.train_steps; ++step) {
      if (step % s.switch_every == 0) strip.place_sources(rng);
      if (step % s.k == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        strip.exchange_halos(halo);
        at::Tensor now = input_of(strip, s);
        if (previous.defined()) {
          replay.push_back({previous, own_rows(now.narrow(0, 0, 1) - previous.narrow(0, 0, 1), strip.rows())});
          if (replay.size() > 64) replay.pop_front();
          for (int update = 0; update < s.updates_per_sample; ++update) {
            std::vector<at::Tensor> inputs, targets;
            for (int b = 0; b < 8; ++b) {
              const auto& chosen = replay[std::uniform_int_distribution<std::size_t>(0, replay.size() - 1)(pick)];
              inputs.push_back(chosen.input);
              targets.push_back(chosen.target);
            }
            optimizer.zero_grad();
            at::Tensor predicted = own_rows(model(torch::stack(inputs)), strip.rows());
            at::Tensor loss = torch::mse_loss(predicted, torch::stack(targets)) * 1e4;
            fabric.backward(loss);
            optimizer.step();
            last_loss = loss.item<double>() / 1e4;
            ++updates;
          }
        }
        previous = now;
        training_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (step == s.train_steps) break;
      const auto t1 = std::chrono::steady_clock::now();
      strip.step();
      solver_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
    const double run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    auto reduce = [&fabric](double value, loom::reduce_op op) {
      return fabric.all_reduce(at::full({1}, value, at::kDouble), op).item<double>();
    };
    // The slowest rank's figures (ranks wait for one another in the collectives).
    const double solver_ms = reduce(solver_seconds, loom::reduce_op::max) * 1e3 / s.train_steps;
    const double with_ms = reduce(run_seconds, loom::reduce_op::max) * 1e3 / s.train_steps;
    if (rank == 0) {
      std::printf("time per simulation step: %.4f ms without training (the solver and its halo exchange), %.4f ms "
                  "with training (%d updates, %d every %d steps; last training loss %.3g)\n",
                  solver_ms, with_ms, updates, s.updates_per_sample, s.k, last_loss);
    }

    // ---- the held-out trajectory: other source positions, from zero.
    strip.reset();
    rng.seed(s.eval_seed);
    double error2 = 0, persistence2 = 0, truth2 = 0;
    previous = at::Tensor();
    at::Tensor previous_field;
    torch::NoGradGuard no_grad;
    for (int step = 0; step <= s.eval_steps; ++step) {
      if (step % s.switch_every == 0) strip.place_sources(rng);
      if (step % s.k == 0) {
        strip.exchange_halos(halo);
        at::Tensor now = input_of(strip, s);
        if (previous.defined()) {
          const at::Tensor truth = own_rows(now.narrow(0, 0, 1), strip.rows());
          const at::Tensor current = own_rows(previous.narrow(0, 0, 1), strip.rows());
          const at::Tensor predicted = current + own_rows(model(previous.unsqueeze(0)).squeeze(0), strip.rows());
          error2 += (predicted - truth).pow(2).sum().item<double>();
          persistence2 += (current - truth).pow(2).sum().item<double>();
          truth2 += truth.pow(2).sum().item<double>();
        }
        previous = now;
      }
      if (step == s.eval_steps) break;
      strip.step();
    }
    error2 = reduce(error2, loom::reduce_op::sum);
    persistence2 = reduce(persistence2, loom::reduce_op::sum);
    truth2 = reduce(truth2, loom::reduce_op::sum);
    if (rank == 0) {
      std::printf("held-out trajectory (seed %u): %d predictions of %d steps ahead per rank\n", s.eval_seed,
                  s.eval_steps / s.k, s.k);
      std::printf("surrogate_rel_error=%.4f persistence_rel_error=%.4f\n", std::sqrt(error2 / truth2),
                  std::sqrt(persistence2 / truth2));
    }
  }
  MPI_Comm_free(&app);
  MPI_Finalize();
  return status;
}
