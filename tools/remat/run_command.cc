// remat run: runs a program with its CUDA allocations served by remat's
// caching allocator, through libremat_preload.so (LD_PRELOAD), and exits with
// the program's exit status.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "base/file.h"
#include "base/units.h"
#include "tools/remat/byte_size_option.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"

namespace remat::tools {
namespace {

struct RunFlags {
  std::uint64_t budget = 0;
  std::string trace_path;
  std::string snapshot_path;
  std::string device = "cuda";
  std::string alloc_conf;
  bool stats = false;
  std::vector<std::string> command;
};

// libremat_preload.so beside this binary's lib/ directory (build tree and
// installed tree alike), or where REMAT_PRELOAD_LIB says.
std::string FindPreloadLibrary() {
  if (const char* path = std::getenv("REMAT_PRELOAD_LIB"); path != nullptr && *path != '\0') {
    return path;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path lib = self.parent_path().parent_path() / "lib" / "libremat_preload.so";
  return std::filesystem::exists(lib, ec) ? lib.string() : "";
}

int RunProgram(const RunFlags& f) {
  // Refused before the program starts: a long job must not learn at its end
  // that its trace could not be written, or run with every allocation failing.
  if (absl::Status outputs = CheckOutputPaths(
          {}, {{"--trace", f.trace_path}, {"--snapshot", f.snapshot_path}});
      !outputs.ok()) {
    return ReportError("run", outputs);
  }
  if (f.budget != 0 && f.budget < kSmallBuffer) {
    return ReportError("run", absl::InvalidArgumentError(absl::StrFormat(
                                  "--budget %s is below the allocator's smallest segment (%s): "
                                  "every allocation would fail",
                                  FormatBytes(f.budget), FormatBytes(kSmallBuffer))));
  }
  const std::string library = FindPreloadLibrary();
  if (library.empty()) {
    std::cerr << "remat run: cannot find libremat_preload.so next to this binary (../lib/); "
                 "set REMAT_PRELOAD_LIB to its path\n";
    return kExitFailure;
  }
  std::string preload = library;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') {
    preload += std::string(":") + old;
  }
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("REMAT_DEVICE", f.device.c_str(), 1);
  if (f.budget != 0) setenv("REMAT_BUDGET", std::to_string(f.budget).c_str(), 1);
  if (!f.trace_path.empty()) setenv("REMAT_TRACE", f.trace_path.c_str(), 1);
  if (!f.snapshot_path.empty()) setenv("REMAT_SNAPSHOT", f.snapshot_path.c_str(), 1);
  if (f.stats) setenv("REMAT_STATS", "1", 1);
  if (!f.alloc_conf.empty()) setenv("REMAT_ALLOC_CONF", f.alloc_conf.c_str(), 1);

  std::vector<char*> argv;
  for (const std::string& a : f.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // As system() does: the program gets the terminal's signals, we wait.
  struct sigaction ignore {}, old_int {}, old_quit {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  const pid_t child = fork();
  if (child < 0) {
    std::cerr << "remat run: fork: " << std::strerror(errno) << "\n";
    return kExitFailure;
  }
  if (child == 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGQUIT, &old_quit, nullptr);
    // The process whose outputs are FILE; others (a shell's children) write FILE.<pid>.
    setenv("REMAT_ROOT_PID", std::to_string(getpid()).c_str(), 1);
    execvp(argv[0], argv.data());
    std::cerr << "remat run: cannot run " << argv[0] << ": " << std::strerror(errno) << "\n";
    _exit(errno == ENOENT ? 127 : 126);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      std::cerr << "remat run: waitpid: " << std::strerror(errno) << "\n";
      return kExitFailure;
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  // The shim writes what was asked for at the program's exit, once it served
  // an allocation. Nothing there means nothing reached it: say so, rather
  // than leave the next command to fail on a missing file.
  for (const std::string* path : {&f.trace_path, &f.snapshot_path}) {
    std::error_code ec;
    if (!path->empty() && !std::filesystem::exists(*path, ec)) {
      std::cerr << "remat run: nothing written to " << *path
                << ": the program made no CUDA allocation through remat, or did not reach its "
                   "normal exit (remat writes there at exit); a child process writes to "
                << *path << ".<pid>\n";
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailure;
}

}  // namespace

Subcommand AddRunCommand(CLI::App& remat) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = remat.add_subcommand(
      "run", "Run a program with its CUDA allocations served by remat (LD_PRELOAD)");
  AddByteSizeOption(*cmd, "--budget", &flags->budget,
                    "Cap on the bytes the allocator may reserve on each GPU; cudaMemGetInfo "
                    "reports it as the total");
  cmd->add_option("--trace", flags->trace_path,
                  "Write every allocation and free as an RMM replay CSV at exit")
      ->type_name("FILE");
  cmd->add_option("--snapshot", flags->snapshot_path,
                  "Write the allocator's state at exit as a PyTorch memory snapshot pickle")
      ->type_name("FILE");
  cmd->add_option("--device", flags->device,
                  "cuda: the real GPU; sim: a simulated one (no CUDA driver is touched)")
      ->check(CLI::IsMember({"cuda", "sim"}))
      ->default_str("cuda");
  cmd->add_flag("--stats", flags->stats, "Print the allocator's statistics to stderr at exit");
  AddAllocConfOption(*cmd, &flags->alloc_conf);
  cmd->add_option("COMMAND", flags->command, "The program and its arguments (after --)")
      ->required()
      ->type_name("CMD [ARGS...]");
  cmd->footer(
      "Example: remat run --budget 12GiB --trace step.csv -- python train.py\n"
      "Exit status: the program's (128+N if signal N ended it); 1 or 2 for remat's own errors.");
  return Subcommand{cmd, [flags] { return RunProgram(*flags); }};
}

}  // namespace remat::tools
