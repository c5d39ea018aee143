// Cluster environments from recorded variable sets (what srun, torchrun,
// a PyTorchJob, jsrun, mpirun and loom-run set), Lightning's detection order,
// and malformed values (the error names the variable).
#include "catch.hpp"
#include "test_models.hpp"

#include <loom/loom.hpp>
#include <loom/environment.hpp>
#include <loom/errors.hpp>
#include <loom/runtime/names.hpp>

#include <climits>
#include <fstream>

using loom::cluster::detect;
using loom::cluster::recorded_environment;

TEST_CASE("SLURM: ranks from SLURM_*, the first node of SLURM_NODELIST, the port from the job id", "[cluster]") {
  auto env = recorded_environment({{"SLURM_NTASKS", "8"},
                                   {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                   {"SLURM_PROCID", "5"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_NODELIST", "gpu[017-018]"},
                                   {"SLURM_JOB_ID", "1234567"},
                                   {"SLURM_JOB_NAME", "train"}});
  const auto info = detect(env);
  CHECK(info.name == "slurm");
  CHECK(info.creates_processes_externally);
  CHECK(info.world_size == 8);
  CHECK(info.global_rank == 5);
  CHECK(info.local_rank == 1);
  CHECK(info.node_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.main_address == "gpu017");
  CHECK(info.main_port == 4567 + 15000);

  CHECK(loom::cluster::slurm_root_node("host[5-9]") == "host5");
  CHECK(loom::cluster::slurm_root_node("host[5,7]") == "host5");
  CHECK(loom::cluster::slurm_root_node("a,b,c") == "a");
  CHECK(loom::cluster::slurm_root_node("a b c") == "a");
  CHECK(loom::cluster::slurm_root_node("node[3]") == "node3");

  // MASTER_PORT wins over the job id.
  auto with_port = recorded_environment({{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                                         {"SLURM_NODEID", "0"}, {"SLURM_JOB_ID", "99"}, {"MASTER_PORT", "23456"}});
  CHECK(detect(with_port).main_port == 23456);
}

TEST_CASE("SLURM: interactive srun sessions are not managed jobs; --ntasks without per-node is refused", "[cluster]") {
  for (const char* name : {"bash", "interactive"}) {
    auto env = recorded_environment({{"SLURM_NTASKS", "1"}, {"SLURM_JOB_NAME", name}, {"LOCAL_RANK", "0"},
                                     {"WORLD_SIZE", "1"}});
    CHECK_FALSE(loom::cluster::detect_slurm(env));
    CHECK(detect(env).name == "lightning");
  }
  auto no_per_node = recorded_environment(
      {{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}});
  CHECK_THROWS_WITH(detect(no_per_node), Catch::Contains("--ntasks-per-node=4"));
}

TEST_CASE("TorchElastic: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, MASTER_*", "[cluster]") {
  auto env = recorded_environment({{"TORCHELASTIC_RUN_ID", "abc"},
                                   {"RANK", "3"},
                                   {"LOCAL_RANK", "1"},
                                   {"WORLD_SIZE", "4"},
                                   {"LOCAL_WORLD_SIZE", "2"},
                                   {"GROUP_RANK", "1"},
                                   {"MASTER_ADDR", "10.0.0.5"},
                                   {"MASTER_PORT", "29500"}});
  const auto info = detect(env);
  CHECK(info.name == "torchelastic");
  CHECK(info.global_rank == 3);
  CHECK(info.local_rank == 1);
  CHECK(info.node_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.main_address == "10.0.0.5");
  CHECK(info.main_port == 29500);
  // SLURM comes first in Lightning's order: torchrun inside an srun step is SLURM.
  auto both = recorded_environment({{"TORCHELASTIC_RUN_ID", "abc"}, {"RANK", "0"}, {"LOCAL_RANK", "0"},
                                    {"WORLD_SIZE", "1"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"},
                                    {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}});
  CHECK(detect(both).name == "slurm");
}

TEST_CASE("Kubeflow: detected from a PyTorchJob's variables, not from torchelastic's", "[cluster]") {
  std::map<std::string, std::string> job{{"KUBERNETES_PORT", "tcp://10.0.0.1:443"},
                                         {"MASTER_ADDR", "job-master-0"},
                                         {"MASTER_PORT", "23456"},
                                         {"WORLD_SIZE", "3"},
                                         {"RANK", "2"}};
  const auto info = detect(recorded_environment(job));
  CHECK(info.name == "kubeflow");
  CHECK(info.global_rank == 2);
  CHECK(info.local_rank == 0);
  CHECK(info.node_rank == 2);
  CHECK(info.main_address == "job-master-0");
  job["LOCAL_RANK"] = "0";  // torchelastic inside a pod
  CHECK_FALSE(loom::cluster::detect_kubeflow(recorded_environment(job)));
}

TEST_CASE("LSF: ranks from JSM_NAMESPACE_*, hosts from LSB_DJOB_RANKFILE", "[cluster]") {
  loom_test::scratch_dir dir("lsf");
  std::ofstream(dir.file("rankfile")) << "launch\nnodeA\nnodeA\nnodeB\nnodeB\n";
  auto env = recorded_environment({{"LSB_JOBID", "4321"},
                                   {"LSB_DJOB_RANKFILE", dir.file("rankfile")},
                                   {"JSM_NAMESPACE_LOCAL_RANK", "1"},
                                   {"JSM_NAMESPACE_SIZE", "4"},
                                   {"JSM_NAMESPACE_RANK", "3"}});
  REQUIRE(loom::cluster::detect_lsf(env));
  const auto info = loom::cluster::read_lsf(env, "nodeB");
  CHECK(info.world_size == 4);
  CHECK(info.global_rank == 3);
  CHECK(info.local_rank == 1);
  CHECK(info.node_rank == 1);
  CHECK(info.main_address == "nodeA");
  CHECK(info.main_port == 4321 % 1000 + 10000);
  CHECK_THROWS_WITH(loom::cluster::read_lsf(env, "elsewhere"), Catch::Contains("is not in LSB_DJOB_RANKFILE"));
}

TEST_CASE("MPI: OpenMPI and MPICH/Intel variables, read with no MPI library", "[cluster]") {
  auto openmpi = recorded_environment({{"OMPI_COMM_WORLD_SIZE", "4"},
                                       {"OMPI_COMM_WORLD_RANK", "3"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                       {"OMPI_MCA_ess_base_jobid", "1234567"}});
  auto info = detect(openmpi);
  CHECK(info.name == "mpi");
  CHECK(info.global_rank == 3);
  CHECK(info.local_rank == 1);
  CHECK(info.node_rank == 1);
  CHECK(info.main_address == "127.0.0.1");
  CHECK(info.main_port == 1234567 % 20000 + 20000);

  auto mpich = recorded_environment({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}, {"MPI_LOCALRANKID", "1"},
                                     {"MPI_LOCALNRANKS", "2"}, {"MASTER_ADDR", "head"}, {"MASTER_PORT", "30000"}});
  info = detect(mpich);
  CHECK(info.name == "mpi");
  CHECK(info.global_rank == 1);
  CHECK(info.main_address == "head");
  CHECK(info.main_port == 30000);
  // A single MPI process is not an MPI job (Lightning: world size > 1).
  CHECK_FALSE(loom::cluster::detect_mpi(recorded_environment({{"OMPI_COMM_WORLD_SIZE", "1"}})));
}

TEST_CASE("the default environment: loom-run's variables, or nothing", "[cluster]") {
  const auto alone = detect(recorded_environment({}));
  CHECK(alone.name == "lightning");
  CHECK_FALSE(alone.creates_processes_externally);
  CHECK(alone.main_port == 0);
  const auto under_loom_run = detect(recorded_environment({{"LOCAL_RANK", "1"},
                                                           {"NODE_RANK", "2"},
                                                           {"WORLD_SIZE", "6"},
                                                           {"MASTER_ADDR", "127.0.0.1"},
                                                           {"MASTER_PORT", "29400"},
                                                           {"LOOM_RENDEZVOUS_DIR", "/tmp/x"}}));
  CHECK(under_loom_run.creates_processes_externally);
  CHECK(under_loom_run.local_rank == 1);
  CHECK(under_loom_run.node_rank == 2);
  CHECK(under_loom_run.world_size == 6);
  CHECK(under_loom_run.rendezvous_dir == std::optional<std::string>("/tmp/x"));
  CHECK(detect(recorded_environment({{"LOCAL_RANK", "0"}, {"GROUP_RANK", "3"}})).node_rank == 3);
}

TEST_CASE("malformed values are errors that name the variable", "[cluster]") {
  auto expect_error = [](std::map<std::string, std::string> variables, const std::string& expected) {
    INFO(expected);
    CHECK_THROWS_WITH(detect(recorded_environment(std::move(variables))), Catch::Contains(expected));
  };
  expect_error({{"SLURM_NTASKS", "two"}}, "SLURM_NTASKS='two' is not an integer");
  expect_error({{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}},
               "SLURM_NODEID is not set, but the slurm environment needs it");
  expect_error({{"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "0"},
                {"SLURM_NODEID", "0"}},
               "SLURM_PROCID=2 is not a rank of a world of 2");
  expect_error({{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"},
                {"MASTER_PORT", "70000"}},
               "MASTER_PORT=70000 is not a TCP port");
  expect_error({{"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "0"}, {"LOCAL_RANK", "-1"}, {"WORLD_SIZE", "1"}},
               "LOCAL_RANK=-1 is negative");
  expect_error({{"OMPI_COMM_WORLD_SIZE", "4x"}}, "OMPI_COMM_WORLD_SIZE='4x' is not an integer");
  expect_error({{"LOCAL_RANK", "one"}}, "LOCAL_RANK='one' is not an integer");
  expect_error({{"LOCAL_RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is not a world size");
}

TEST_CASE("one parser for settings: bad values are refused naming the variable and what is accepted", "[cluster]") {
  using loom::cluster::setting_integer;
  using loom::cluster::setting_seconds;
  using loom::cluster::setting_text;
  const auto env = recorded_environment({{"EMPTY", ""},
                                         {"COUNT", "12"},
                                         {"SPACED", " 12"},
                                         {"FRACTION", "1.5"},
                                         {"BIG", "99999999999999999999999"},
                                         {"TIMEOUT", "2.5"},
                                         {"ZERO", "0"},
                                         {"HUGE", "1e300"},
                                         {"INFINITE", "inf"},
                                         {"NAN", "nan"},
                                         {"NEGATIVE", "-3"},
                                         {"UNIT", "30s"}});
  CHECK_FALSE(setting_text("UNSET", env));
  CHECK_FALSE(setting_text("EMPTY", env));  // empty counts as unset
  CHECK(setting_integer("COUNT", 1, 100, env) == 12);
  CHECK_FALSE(setting_integer("EMPTY", 1, 100, env));
  CHECK_THROWS_WITH(setting_integer("COUNT", 1, 10, env),
                    "COUNT='12' is not accepted: give a whole number from 1 to 10, or unset it");
  CHECK_THROWS_AS(setting_integer("SPACED", 1, 100, env), loom::configuration_error);
  CHECK_THROWS_AS(setting_integer("FRACTION", 1, 100, env), loom::configuration_error);
  CHECK_THROWS_AS(setting_integer("BIG", 0, LLONG_MAX, env), loom::configuration_error);
  CHECK(setting_seconds("TIMEOUT", 1e7, env) == 2.5);
  CHECK(setting_seconds("ZERO", 1e7, env) == 0.0);
  for (const char* bad : {"HUGE", "INFINITE", "NAN", "NEGATIVE", "UNIT", "BIG"}) {
    INFO(bad);
    CHECK_THROWS_WITH(setting_seconds(bad, 1e7, env),
                      Catch::Contains(std::string(bad) + "='") &&
                          Catch::Contains("is not accepted: give a number of seconds from 0 to 10000000"));
  }
}

TEST_CASE("names: Lightning's precision spellings and loom-run's strategy list", "[cluster]") {
  CHECK(loom::runtime::canonical_precision("16") == std::optional<std::string>("16-mixed"));
  CHECK(loom::runtime::canonical_precision("bf16") == std::optional<std::string>("bf16-mixed"));
  CHECK(loom::runtime::canonical_precision("32") == std::optional<std::string>("32-true"));
  CHECK(loom::runtime::canonical_precision("bf16-true") == std::optional<std::string>("bf16-true"));
  CHECK_FALSE(loom::runtime::canonical_precision("8").has_value());
  CHECK(loom::runtime::canonical_accelerator("gpu") == std::optional<std::string>("cuda"));
  const auto cli = loom::runtime::cli_strategy_names();
  CHECK(std::find(cli.begin(), cli.end(), "parallel") != cli.end());
  CHECK(std::find(cli.begin(), cli.end(), "parallel_fork") == cli.end());  // fork variants are not for the CLI
  CHECK(loom::runtime::find_strategy("ddp_notebook")->reason.find("use ddp") != std::string::npos);
}

TEST_CASE("a static Fabric started by loom-run with other flags is an error naming both", "[cluster]") {
  ::setenv("LT_CLI_USED", "1", 1);
  ::setenv("LT_STRATEGY", "ddp", 1);
  CHECK_THROWS_WITH((loom::Fabric<loom::cpu, loom::single_device, loom::fp32>()),
                    Catch::Contains("strategy 'single_device'") && Catch::Contains("--strategy=ddp"));
  ::setenv("LT_STRATEGY", "single_device", 1);
  ::setenv("LT_PRECISION", "bf16", 1);  // legacy for bf16-mixed
  CHECK_NOTHROW((loom::Fabric<loom::cpu, loom::single_device, loom::bf16_mixed>()));
  CHECK_THROWS_WITH((loom::Fabric<loom::cpu, loom::single_device, loom::fp32>()),
                    Catch::Contains("precision '32-true'") && Catch::Contains("--precision=bf16"));
  ::setenv("LT_DEVICES", "1", 1);
  CHECK_NOTHROW((loom::Fabric<loom::cpu, loom::single_device, loom::bf16_mixed>({.devices = 1})));
  ::setenv("LT_DEVICES", "2", 1);
  CHECK_THROWS_WITH((loom::Fabric<loom::cpu, loom::single_device, loom::bf16_mixed>({.devices = 1})),
                    Catch::Contains("devices=1 but the CLI gave --devices=2"));
  for (const char* name : {"LT_CLI_USED", "LT_STRATEGY", "LT_PRECISION", "LT_DEVICES"}) ::unsetenv(name);
}

TEST_CASE("cuda: each launcher's local rank picks cuda:LOCAL_RANK of the selected devices (no GPU needed)",
          "[cluster]") {
  auto check = [](const char* launcher, const auto& env) {
    INFO(launcher);
    const auto info = detect(env);
    REQUIRE(info.local_rank == 1);
    // --devices 2 (indices 0, 1): local rank 1 trains on cuda:1.
    CHECK(loom::cuda::device(loom::device_selection{{0, 1}}, info.local_rank) ==
          c10::Device(c10::DeviceType::CUDA, 1));
    // --devices 2,3: local rank 1 trains on the second one, cuda:3 (Lightning's parallel_devices[local_rank]).
    CHECK(loom::cuda::device(loom::device_selection{{2, 3}}, info.local_rank) ==
          c10::Device(c10::DeviceType::CUDA, 3));
  };
  check("torchelastic", recorded_environment({{"TORCHELASTIC_RUN_ID", "abc"}, {"RANK", "3"}, {"LOCAL_RANK", "1"},
                                              {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
                                              {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}}));
  check("slurm", recorded_environment({{"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_PROCID", "3"},
                                       {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}, {"SLURM_JOB_ID", "1234"},
                                       {"SLURM_NODELIST", "node[1-2]"}, {"SLURM_JOB_NAME", "train"}}));
  check("mpi", recorded_environment({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                     {"OMPI_MCA_ess_base_jobid", "1234567"}}));
  check("loom-run", recorded_environment({{"LOCAL_RANK", "1"}, {"NODE_RANK", "0"}, {"WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}));
}
