// remat run: runs a program with its CUDA allocations served by remat's
// caching allocator, through libremat_preload.so (LD_PRELOAD), and exits with
// the program's exit status.
#include <elf.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

// The path execvp would run for `program` (searched in PATH when it has no
// slash; glibc's default path when PATH is unset), or "" when there is none.
std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/bin:/usr/bin", ':')) {
    const std::string candidate = std::string(dir.empty() ? "." : dir) + "/" + program;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

// The shared libraries a 64-bit ELF executable names as needed (DT_NEEDED),
// in order; empty for anything else (a script, a 32-bit or broken file).
std::vector<std::string> NeededLibraries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr eh{};
  if (size < sizeof(eh) || !in.read(reinterpret_cast<char*>(&eh), sizeof(eh)) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 4096) {
    return {};
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  if (!in.read(reinterpret_cast<char*>(ph.data()),
               static_cast<std::streamsize>(ph.size() * sizeof(Elf64_Phdr)))) {
    return {};
  }
  // A virtual address in the file, through the loadable segment holding it.
  auto offset_of = [&](std::uint64_t vaddr) -> std::uint64_t {
    for (const Elf64_Phdr& p : ph) {
      if (p.p_type == PT_LOAD && vaddr >= p.p_vaddr && vaddr - p.p_vaddr < p.p_filesz) {
        return p.p_offset + (vaddr - p.p_vaddr);
      }
    }
    return UINT64_MAX;
  };
  std::vector<Elf64_Dyn> dyn;
  for (const Elf64_Phdr& p : ph) {
    // (A dynamic section holds a few dozen entries; a larger one is not a real executable's.)
    if (p.p_type != PT_DYNAMIC || p.p_offset > size || p.p_filesz > size - p.p_offset ||
        p.p_filesz > 64 * 1024) {
      continue;
    }
    dyn.resize(p.p_filesz / sizeof(Elf64_Dyn));
    in.seekg(static_cast<std::streamoff>(p.p_offset));
    if (!in.read(reinterpret_cast<char*>(dyn.data()),
                 static_cast<std::streamsize>(dyn.size() * sizeof(Elf64_Dyn)))) {
      return {};
    }
  }
  std::uint64_t strtab = UINT64_MAX;
  for (const Elf64_Dyn& d : dyn) {
    if (d.d_tag == DT_STRTAB) strtab = offset_of(d.d_un.d_ptr);
  }
  if (strtab >= size) return {};
  std::vector<std::string> needed;
  for (const Elf64_Dyn& d : dyn) {
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag != DT_NEEDED || d.d_un.d_val >= size - strtab) continue;
    in.clear();
    in.seekg(static_cast<std::streamoff>(strtab + d.d_un.d_val));
    std::string name;
    if (std::getline(in, name, '\0')) needed.push_back(name);
  }
  return needed;
}

// A sanitizer's runtime library, which must come first among the libraries
// a process loads (ASan refuses to start otherwise).
bool IsSanitizerRuntime(absl::string_view library) {
  const absl::string_view base = library.substr(library.rfind('/') + 1);
  for (absl::string_view prefix : {"libasan.so", "libtsan.so", "libhwasan.so", "liblsan.so",
                                   "libclang_rt.asan", "libclang_rt.tsan", "libclang_rt.hwasan"}) {
    if (absl::StartsWith(base, prefix)) return true;
  }
  return false;
}

// LD_PRELOAD for the program: a sanitizer runtime the program needs (or the
// caller preloads) first, then the shim, then the rest of the caller's list.
std::string PreloadList(const std::string& shim, const std::string& program,
                        const char* callers) {
  std::vector<std::string> first;
  std::vector<std::string> rest;
  for (absl::string_view item : absl::StrSplit(callers != nullptr ? callers : "", absl::ByAnyChar(": "),
                                               absl::SkipEmpty())) {
    (IsSanitizerRuntime(item) ? first : rest).emplace_back(item);
  }
  for (const std::string& lib : NeededLibraries(ResolveProgram(program))) {
    if (IsSanitizerRuntime(lib) && first.empty()) first.push_back(lib);  // found by the loader's search
  }
  std::string list;
  for (const std::string& lib : first) list += lib + ":";
  list += shim;
  for (const std::string& lib : rest) list += ":" + lib;
  return list;
}

// Whether `program` is a Python interpreter (python, python3, python3.11, a
// venv's python...): what a PyTorch program is started with.
bool IsPython(const std::string& program) {
  const absl::string_view base = absl::string_view(program).substr(program.rfind('/') + 1);
  return absl::StartsWith(base, "python") || base == "torchrun";
}

int RunProgram(const RunFlags& f) {
  // Refused before the program starts: a long job must not learn at its end
  // that its trace could not be written, or run with every allocation failing,
  // and the shim must not write over the program it serves (found as exec
  // finds it) or over itself.
  const std::string library = FindPreloadLibrary();
  if (absl::Status outputs = CheckOutputPaths(
          {{"the program", ResolveProgram(f.command.front())}, {"libremat_preload.so", library}},
          {{"--trace", f.trace_path}, {"--snapshot", f.snapshot_path}});
      !outputs.ok()) {
    return ReportError("run", outputs);
  }
  if (f.budget != 0 && f.budget < kSmallBuffer) {
    return ReportError("run", absl::InvalidArgumentError(absl::StrFormat(
                                  "--budget %s is below the allocator's smallest segment (%s): "
                                  "every allocation would fail",
                                  FormatBytes(f.budget), FormatBytes(kSmallBuffer))));
  }
  if (library.empty()) {
    std::cerr << "remat run: cannot find libremat_preload.so next to this binary (../lib/); "
                 "set REMAT_PRELOAD_LIB to its path\n";
    return kExitFailure;
  }
  if (f.device == "sim" && IsPython(f.command.front())) {
    std::cerr << "remat run: note: --device sim serves allocation calls only; PyTorch cannot run "
                 "on it (it needs a real GPU). To study a PyTorch step without one, record it on "
                 "the CPU (tools/capture_torch_trace.py --device cpu) and replay it with remat "
                 "sim\n";
  }
  const std::string preload = PreloadList(library, f.command.front(), std::getenv("LD_PRELOAD"));
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
                  "cuda: the real GPU; sim: a simulated one (no CUDA driver is touched; it "
                  "serves allocation calls only, so a program that computes on the memory, "
                  "PyTorch among them, cannot run on it)")
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
