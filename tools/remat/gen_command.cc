// remat gen: the op trace of one training step of a model, from its architecture.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/units.h"
#include "gen/model_gen.h"
#include "tools/remat/commands.h"
#include "tools/remat/exit_codes.h"
#include "trace/op_trace.h"

namespace remat::tools {
namespace {

struct GenFlags {
  std::string spec;
  std::string output;  // "-": standard output
  ModelGenOptions options;
};

constexpr char kFooterHead[] =
    R"(SPEC is name:key=value,... (keys may be left out; unknown ones are refused).
The trace (trace/op_trace.h's JSON Lines) holds one training step: parameters and
inputs as constants, the forward with each tensor released after its last use
unless autograd saved it, the backward in reverse with saved tensors released
as their op's backward runs, and an optimizer phase that reads and releases the
parameter gradients. Activations are bf16 unless dtype says otherwise.

Costs: max(--launch-ns, matmul/conv FLOPs / --tflops, bytes moved / --hbm-gbps).
The defaults describe an H100-class GPU in training: 400 TFLOP/s effective bf16
(about 40% of the 989 TFLOP/s dense peak) and 3000 GB/s of HBM3.

After writing the trace it reports records, constants, the peak of live bytes
(running the trace as written) and the compute time. Bad specs exit with 2.

Models and keys (defaults in the middle):
)";

constexpr char kFooterTail[] = R"(
Examples:
  remat gen gpt2:layers=12,hidden=768,heads=12,seq=1024,batch=8 -o gpt2.jsonl
  remat gen resnet:depth=50,batch=64,image=224 -o resnet50.jsonl --tflops 300
  remat gen vit:batch=32,attn=flash -o vit.jsonl && remat sim vit.jsonl --budget-ratio 0.5)";

void PrintSummary(std::ostream& out, const GeneratedTrace& gen, const OpTrace& trace,
                  const std::string& where) {
  out << absl::StrFormat("wrote %s\n", where);
  out << absl::StrFormat("  model            %s\n", gen.spec);
  out << absl::StrFormat("  records          %d (%d calls, %d tensors, %d views)\n",
                         trace.records.size(), trace.calls, trace.tensors.size(), trace.views);
  if (gen.params > 0) {
    out << absl::StrFormat("  parameters       %.2f M\n", static_cast<double>(gen.params) / 1e6);
  }
  out << absl::StrFormat("  constants        %s\n", FormatBytes(trace.constant_bytes));
  out << absl::StrFormat(
      "  peak live        %s (line %d), %s above the constants\n",
      FormatBytes(trace.peak_live_bytes),
      trace.peak_record < trace.records.size() ? trace.records[trace.peak_record].line : 0,
      FormatBytes(trace.peak_live_bytes - trace.constant_bytes));
  out << absl::StrFormat("  compute          %.3f ms",
                         static_cast<double>(trace.total_cost_ns) / 1e6);
  if (gen.flops > 0) {
    out << absl::StrFormat(" (%.3f TFLOP in matmuls and convs, %.3f of them forward)",
                           gen.flops / 1e12, gen.forward_flops / 1e12);
  }
  out << "\n";
}

int RunGen(const GenFlags& f) {
  const bool to_stdout = f.output == "-";
  if (!to_stdout) {
    if (absl::Status s = CheckOutputPaths({}, {{"--output", f.output}}); !s.ok()) {
      return ReportError("gen", s);
    }
  }
  absl::StatusOr<GeneratedTrace> gen = GenerateModelTrace(f.spec, f.options);
  if (!gen.ok()) return ReportError("gen", gen.status());
  // Parsing it back checks it and gives the summary the parser's own peak.
  absl::StatusOr<OpTrace> trace = ParseOpTrace(gen->text, to_stdout ? "<stdout>" : f.output);
  if (!trace.ok()) {
    return ReportError(
        "gen", absl::InternalError(
                   absl::StrCat("the generated trace does not parse: ", trace.status().message())));
  }
  if (to_stdout) {
    std::cout << gen->text << std::flush;
    PrintSummary(std::cerr, *gen, *trace, "standard output");
  } else {
    if (absl::Status s = WriteFile(f.output, gen->text); !s.ok()) return ReportError("gen", s);
    PrintSummary(std::cout, *gen, *trace, f.output);
  }
  return kExitOk;
}

}  // namespace

Subcommand AddGenCommand(CLI::App& remat) {
  auto flags = std::make_shared<GenFlags>();
  CLI::App* cmd = remat.add_subcommand(
      "gen", "Write the op trace of one training step of a model (chain, resnet, gpt2, vit, unet)");
  cmd->add_option("SPEC", flags->spec, "Model spec, e.g. gpt2:layers=12,seq=1024,batch=8")
      ->required()
      ->type_name("NAME:KEY=VALUE,...");
  cmd->add_option("-o,--output", flags->output, "Where to write the trace ('-': standard output)")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--tflops", flags->options.tflops, "Effective matmul/conv rate, TFLOP/s")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--hbm-gbps", flags->options.hbm_gbps,
                  "Effective memory bandwidth for memory-bound ops, GB/s")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e12));
  cmd->add_option("--launch-ns", flags->options.launch_ns, "The least a kernel costs, ns")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1'000'000'000}));
  cmd->footer(absl::StrCat(kFooterHead, ModelGenHelp(), kFooterTail));
  return Subcommand{cmd, [flags] { return RunGen(*flags); }};
}

}  // namespace remat::tools
