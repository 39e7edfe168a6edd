// The generated model traces replayed through the runtime: the unlimited
// replay's peak is the parser's, and under a tight live budget every small
// model evicts, finishes, and reads back what it wrote. The rest of the
// generators' tests are in gen/model_gen_test.cc, which needs no runtime.
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gen/model_gen.h"
#include "gtest/gtest.h"
#include "sim/op_replay.h"
#include "trace/op_trace.h"

namespace remat {
namespace {

GeneratedTrace Gen(const std::string& spec) {
  absl::StatusOr<GeneratedTrace> g = GenerateModelTrace(spec, {});
  EXPECT_TRUE(g.ok()) << spec << ": " << g.status();
  return g.ok() ? *std::move(g) : GeneratedTrace{};
}

OpTrace Parse(const GeneratedTrace& g) {
  absl::StatusOr<OpTrace> t = ParseOpTrace(g.text, g.spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : OpTrace{};
}

// The small specs of gen/model_gen_test.cc: one of each model and variant.
const char* const kSmallSpecs[] = {
    "chain:n=20",
    "resnet:depth=18,batch=4,image=64",
    "resnet:depth=50,batch=2,image=64",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512,dropout=1",
    "gpt2:layers=2,hidden=128,heads=4,seq=64,batch=2,vocab=512,attn=flash",
    "vit:layers=2,hidden=128,heads=4,patch=8,image=32,batch=2,classes=10",
    "vit:layers=2,hidden=128,heads=4,patch=8,image=32,batch=2,classes=10,attn=flash,dropout=1",
    "unet:levels=2,base=8,batch=2,image=32",
};

TEST(ModelGenTest, SmallTracesReplayThroughTheRuntime) {
  for (const char* spec : kSmallSpecs) {
    const GeneratedTrace g = Gen(spec);
    const OpTrace t = Parse(g);
    EXPECT_EQ(g.records, t.records.size()) << spec;
    // Nothing but the constants is left at the end (the chain releases x0).
    if (g.spec.rfind("chain:", 0) != 0) {
      EXPECT_EQ(t.live_bytes_at_end, t.constant_bytes) << spec;
    }
    absl::StatusOr<OpReplayReport> unlimited = ReplayOpTrace(t, {});
    ASSERT_TRUE(unlimited.ok()) << spec << ": " << unlimited.status();
    EXPECT_EQ(unlimited->status, "ok") << spec;
    EXPECT_EQ(unlimited->peak_live_bytes, t.peak_live_bytes) << spec;
    // Under a live budget of the constants and 60% of the rest the runtime
    // evicts and finishes,
    // its recomputes and restores checked byte for byte.
    OpReplayOptions tight;
    tight.verify = true;
    tight.scale = 64;  // real bytes, 64 times smaller (the budget too)
    tight.live_budget =
        (t.constant_bytes + (t.peak_live_bytes - t.constant_bytes) * 6 / 10) / tight.scale;
    // Tiny models cost the launch floor everywhere: recomputing is cheap to
    // count but not to avoid; let it run to the end.
    tight.thrash_limit = 1000;
    absl::StatusOr<OpReplayReport> r = ReplayOpTrace(t, tight);
    ASSERT_TRUE(r.ok()) << spec << ": " << r.status();
    EXPECT_EQ(r->status, "ok") << spec << ": " << r->message;
    EXPECT_EQ(r->mismatches, 0u) << spec;
    EXPECT_GT(r->evictions, 0u) << spec;
  }
}

}  // namespace
}  // namespace remat
